"""Routing from facts, never labels (issue 39): what a run's engine observed of its server (an engine that starts its
own server observes everything; an absent or free `observes` label is never "everything"), and which quantization
series a configuration's levels join (the weights' digests against the artifact's pins, never the display name)."""

from __future__ import annotations

import json
import shutil

from artifact.analysis.tables import build_tables
from artifact.check.core import NOT_RUN, PASS, observes, unobserved
from artifact.config import CONFIG_DIR, read_toml
from artifact.models import lineage
from artifact.records.store import find_runs
from synthetic_runs import MODEL, OFF, SERIES_RECIPE, series_model, trend_runs, write_bfcl_run

QWEN = "qwen2.5-coder-0.5b-requant"  # another model's recipe: its levels are no level of the agent model


def test_an_endpoint_run_without_observes_observed_nothing(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, OFF, engine="endpoint")
    assert "observes" not in run.manifest
    assert not any(observes(run).values())
    assert unobserved([run], "weights_sha256") == [run.label]


def test_an_endpoint_run_observed_what_its_manifest_says_and_nothing_more(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, OFF, engine="endpoint",
                         manifest={"observes": {"logprobs": True, "cache_use": "as reported"}})
    seen = observes(run)
    assert seen["logprobs"] is True and seen["cache_use"] == "as reported"
    assert seen["weights_sha256"] is False and seen["binary"] is False


def test_an_engine_that_starts_its_server_observes_everything_whatever_its_label_says(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, OFF, manifest={"observes": {"weights_sha256": False}})
    assert all(v is True for v in observes(run).values())
    assert unobserved([run], "weights_sha256") == []


# --- a quantization series is the levels of one model by their weights' digests, never by a display name ---------

def check_json(root) -> dict:
    """`./run.sh check ROOT` in this process; check.json."""
    from artifact.check.run import run_check

    run_check(root, quiet=True)
    return json.loads((root / "check" / "check.json").read_text())


def claim(data: dict, cid: str) -> dict:
    return next(c for c in data["claims"] if c["id"] == cid)


def test_a_display_name_does_not_let_another_models_levels_join_a_series(tmp_path):
    """The agent model's F16 and Q8_0 (two levels: no trend test), and a copied level of another model (Qwen's
    requantized Q4_K_M) whose manifests were edited to carry the agent series' name and family: by the name the
    three were one series of three levels (z = 9.49); by the weights' digests they are two series of two and one."""
    trend_runs(tmp_path, {"F16": 10, "Q8_0": 40})
    qwen = {**series_model(MODEL, "Q4_K_M", QWEN), "family": "qwen2.5-coder", "name": "Qwen2.5-Coder-0.5B"}
    write_trend_level(tmp_path / "qwen", "t-Q4_K_M", qwen, 70)
    shutil.copytree(tmp_path / "qwen" / "t-Q4_K_M", tmp_path / "t-Q4_K_M")  # the copied run set
    for run in find_runs(tmp_path / "t-Q4_K_M"):
        model = {**run.manifest["model"], "name": MODEL["name"], "family": MODEL["family"]}  # the lying label
        (run.path / "manifest.json").write_text(json.dumps({**run.manifest, "model": model}))
    shutil.rmtree(tmp_path / "qwen")
    tables = build_tables(find_runs(tmp_path), tmp_path)
    assert set(tables.fig2["model_name"]) == {MODEL["name"]}  # every level shows the same display name ...
    assert sorted(tables.fig2["series"]) == [  # ... and still makes no series with another model's levels
        f"{MODEL['name']} / llama.cpp (recipe {QWEN})", f"{MODEL['name']} / llama.cpp (recipe {SERIES_RECIPE})",
        f"{MODEL['name']} / llama.cpp (recipe {SERIES_RECIPE})"]
    rq3 = claim(check_json(tmp_path), "RQ3")
    assert rq3["status"] == NOT_RUN and "z = " not in rq3["observed"]


def test_levels_of_one_model_are_one_series_whatever_their_names_say(tmp_path):
    """The agent model's levels under three different display names: one series by their digests (the trend test
    runs: z = 9.49), shown under one of the names."""
    for quant, k, name in (("F16", 10, "A"), ("Q8_0", 40, "B"), ("Q4_K_M", 70, "C")):
        trend_runs(tmp_path, {quant: k}, model={**MODEL, "name": name})
    tables = build_tables(find_runs(tmp_path), tmp_path)
    assert set(tables.fig2["series"]) == {"A / llama.cpp"} and tables.outside_series == []
    rq3 = claim(check_json(tmp_path), "RQ3")
    assert rq3["status"] == PASS and "z = 9.49" in rq3["observed"]


def test_path_weights_join_the_series_their_pins_name_and_unpinned_ones_join_none(tmp_path):
    """Weights from a file (path:) are a level of the model whose configurations under configs/ pin their digest
    (evidence/h200-smollm2's series); a digest no recipe or configuration pins is no level of any known model."""
    pins = {c: read_toml(CONFIG_DIR / "h200" / f"{c}.toml")["model"] for c in ("f16", "q8_0", "q4_k_m")}
    for level, k in (("f16", 10), ("q8_0", 40), ("q4_k_m", 70)):
        pin = pins[level]
        write_trend_level(tmp_path, f"t-{level}", {**MODEL, "quant": pin["quant"], "sha256": pin["sha256"],
                                                   "source": "path:x.gguf"}, k)
    write_trend_level(tmp_path, "t-unpinned", {**MODEL, "quant": "Q3_K_M", "sha256": "cd" * 32}, 75)
    tables = build_tables(find_runs(tmp_path), tmp_path)
    assert set(tables.fig2["series"]) == {f"{MODEL['name']} / llama.cpp"}
    assert list(tables.fig2["level"]) == ["F16", "Q8_0", "Q4_K_M"]
    assert tables.outside_series == ["t-unpinned: its weights (sha256 cdcdcdcdcdcd...) are pinned as a level of one "
                                     "model by no recipe or configuration of this checkout"]
    assert lineage.of_digests((pins["f16"]["sha256"],)) == \
        "config smollm2 / SmolLM2-135M-Instruct (requantized from Q4_1)"  # not the agent recipe's base-F16


def write_trend_level(root, config: str, model: dict, k: int, n: int = 80) -> None:
    """One level's OFF run 1 and ON run 1 (as `trend_runs`), the first k of n one-request episodes diverging."""
    off = {f"e{i}": [[1, 2]] for i in range(n)}
    on = {e: ([[1, 3]] if i < k else [[1, 2]]) for i, e in enumerate(off)}
    write_bfcl_run(root, "off", 1, off, config=config, model=model)
    write_bfcl_run(root, "on", 1, on, config=config, model=model)
