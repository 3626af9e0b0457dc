"""Routing from facts, never labels: what a run's engine observed of its server (an engine that starts its
own server observes everything; an absent or free `observes` label is never "everything"), which quantization series a
configuration's levels join (the weights' digests against the artifact's pins, never the display name), whether
tenant prompts share the measured prefix (the prompts recorded, never the plan's label), and whether a run was
loopback-only (the server address recorded, never the isolation label alone)."""

from __future__ import annotations

import json
import shutil
import tarfile

import pytest

from artifact import engines, evidence
from artifact.analysis.tables import build_tables
from artifact.check.core import NOT_RUN, PASS, observes, unobserved
from artifact.config import CONFIG_DIR, read_toml
from artifact.models import lineage
from artifact.records.store import find_runs
from synthetic_runs import (
    MODEL,
    OFF,
    ON1,
    ON2,
    SERIES_RECIPE,
    main_plan,
    series_model,
    trend_runs,
    write_bfcl_run,
)
from test_claims import UNOBSERVED

QWEN = "qwen2.5-coder-0.5b-requant"  # another model's recipe: its levels are no level of the agent model


def test_an_endpoint_run_without_observes_observed_nothing(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, OFF, engine="endpoint")
    assert "observes" not in run.manifest
    assert not any(observes(run).values())
    assert unobserved([run], "weights_sha256") == [run.label]


def test_an_endpoint_run_observed_what_its_manifest_says_and_nothing_more(tmp_path):
    run = write_bfcl_run(
        tmp_path,
        "off",
        1,
        OFF,
        engine="endpoint",
        manifest={"observes": {"logprobs": True, "cache_use": "as reported"}},
    )
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
        f"{MODEL['name']} / llama.cpp (recipe {QWEN})",
        f"{MODEL['name']} / llama.cpp (recipe {SERIES_RECIPE})",
        f"{MODEL['name']} / llama.cpp (recipe {SERIES_RECIPE})",
    ]
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
    pins = {c: read_toml(CONFIG_DIR / "h200" / f"h200-smollm2-{c}.toml")["model"] for c in ("f16", "q8_0", "q4_k_m")}
    for level, k in (("f16", 10), ("q8_0", 40), ("q4_k_m", 70)):
        pin = pins[level]
        write_trend_level(
            tmp_path,
            f"t-{level}",
            {**MODEL, "quant": pin["quant"], "sha256": pin["sha256"], "source": "path:x.gguf"},
            k,
        )
    write_trend_level(tmp_path, "t-unpinned", {**MODEL, "quant": "Q3_K_M", "sha256": "cd" * 32}, 75)
    tables = build_tables(find_runs(tmp_path), tmp_path)
    assert set(tables.fig2["series"]) == {f"{MODEL['name']} / llama.cpp"}
    assert list(tables.fig2["level"]) == ["F16", "Q8_0", "Q4_K_M"]
    assert tables.outside_series == [
        "t-unpinned: its weights (sha256 cdcdcdcdcdcd...) are pinned as a level of one "
        "model by no recipe or configuration of this checkout"
    ]
    assert (
        lineage.of_digests((pins["f16"]["sha256"],)) == "config smollm2 / SmolLM2-135M-Instruct (requantized from Q4_1)"
    )  # not the agent recipe's base-F16


def test_a_levels_trend_position_is_its_weights_not_its_quant_label(tmp_path):
    """Three pinned levels (path: weights, as evidence/h200-smollm2) whose Q4_K_M manifests were edited to say
    "Q3_K_M": by the label the level would move in the trend; by its weights' pin it is Q4_K_M, so check refuses the
    records as contradicting themselves (one line naming the pinned level), as for a derived model's label, and
    writes no verdict read from the label."""
    pins = {c: read_toml(CONFIG_DIR / "h200" / f"h200-smollm2-{c}.toml")["model"] for c in ("f16", "q8_0", "q4_k_m")}
    for level, k in (("f16", 10), ("q8_0", 40), ("q4_k_m", 70)):
        pin = pins[level]
        write_trend_level(
            tmp_path,
            f"t-{level}",
            {**MODEL, "quant": pin["quant"], "sha256": pin["sha256"], "source": "path:x.gguf"},
            k,
        )
    for run in find_runs(tmp_path / "t-q4_k_m"):  # the lying label, edited into the records afterwards
        model = {**run.manifest["model"], "quant": "Q3_K_M"}
        (run.path / "manifest.json").write_text(json.dumps({**run.manifest, "model": model}))
    assert lineage.level_of((pins["q4_k_m"]["sha256"],)) == "Q4_K_M"
    assert lineage.level_of(("cd" * 32,)) is None  # no pin: the label is all there is, and the run joins no series
    from artifact.check.run import run_check
    from artifact.errors import ArtifactError

    with pytest.raises(ArtifactError, match=r"t-q4_k_m/.*'model.quant' is 'Q3_K_M', .* pinned as level Q4_K_M"):
        run_check(tmp_path, quiet=True)
    assert not (tmp_path / "check" / "check.json").exists()  # no verdict read from the label


@pytest.fixture
def disagreeing_pins(tmp_path, monkeypatch):
    """A checkout whose configs/ pin one digest at two levels: h200-smollm2-q4_k_m's weights, pinned again as Q8_0
    by a twin configuration (the same model's name and family)."""
    configs = tmp_path / "checkout" / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    twin = (configs / "h200" / "h200-smollm2-q4_k_m.toml").read_text()
    twin = twin.replace('name = "h200-smollm2-q4_k_m"', 'name = "h200-smollm2-q4_k_m-as-q8"').replace(
        'quant = "Q4_K_M"', 'quant = "Q8_0"'
    )
    (configs / "h200" / "h200-smollm2-q4_k_m-as-q8.toml").write_text(twin)
    caches = (lineage._config_pins, lineage._configs, lineage._levels, lineage._config_models)
    for c in caches:
        c.cache_clear()
    monkeypatch.setattr(lineage, "CONFIG_DIR", configs)
    monkeypatch.setattr(lineage, "PLANS_FILE", configs / "plans.toml")
    yield {c: read_toml(CONFIG_DIR / "h200" / f"h200-smollm2-{c}.toml")["model"] for c in ("f16", "q8_0", "q4_k_m")}
    monkeypatch.undo()
    for c in caches:
        c.cache_clear()


def test_no_label_places_a_level_where_the_checkouts_pins_disagree(tmp_path, disagreeing_pins):
    """Three pinned levels of one model; the Q4_K_M weights are pinned at two levels by two configurations: its
    `model.quant` label (either) would place it in the trend, so it joins no series and RQ3 names why; the two
    levels the pins decide stay one series."""
    pins = disagreeing_pins
    digest = pins["q4_k_m"]["sha256"]
    assert lineage.level_of((digest,)) is None and lineage.pinned_levels((digest,)) == ["Q4_K_M", "Q8_0"]
    assert lineage.of_digests((digest,)) is not None  # the pins agree on the model, not on the level
    for level, k in (("f16", 10), ("q8_0", 40), ("q4_k_m", 70)):
        pin = pins[level]
        write_trend_level(
            tmp_path / "results",
            f"t-{level}",
            {**MODEL, "quant": pin["quant"], "sha256": pin["sha256"], "source": "path:x.gguf"},
            k,
        )
    tables = build_tables(find_runs(tmp_path / "results"), tmp_path / "results")
    assert list(tables.fig2["level"]) == ["F16", "Q8_0"] and list(tables.fig2["config"]) == ["t-f16", "t-q8_0"]
    assert tables.outside_series == [
        f"t-q4_k_m: the configurations of this checkout that pin its weights (sha256 {digest[:12]}...) give them "
        "different levels (Q4_K_M, Q8_0): no pin decides its level, and its label does not"
    ]
    rq3 = claim(check_json(tmp_path / "results"), "RQ3")
    assert "z = " not in rq3["observed"] and any("t-q4_k_m" in e and "no pin decides" in e for e in rq3["evidence"])


def write_trend_level(root, config: str, model: dict, k: int, n: int = 80) -> None:
    """One level's OFF run 1 and ON run 1 (as `trend_runs`), the first k of n one-request episodes diverging."""
    off = {f"e{i}": [[1, 2]] for i in range(n)}
    on = {e: ([[1, 3]] if i < k else [[1, 2]]) for i, e in enumerate(off)}
    write_bfcl_run(root, "off", 1, off, config=config, model=model)
    write_bfcl_run(root, "on", 1, on, config=config, model=model)


# --- shared or unshared: what the recorded tenant prompts share, never the plan's prefix label --------------------


def tenant_verdict(root, plan: str):
    from artifact.check.beyond import analyse

    b = analyse(find_runs(root))
    return {v.id: v for v in b.verdicts}[f"BEYOND-TENANTS-{plan}"], b


def test_a_tenant_plans_prefix_label_is_not_believed_over_the_prompts_it_recorded(tmp_path):
    """Plan tenants1-shared (its label and configs/plans.toml say "shared"), whose recorded tenant prompts share
    none of the measured first prompts' characters: read as unshared, and the verdict says that the label was not."""
    from tenant_runs import SPEC, load_record, loaded_plan

    main_plan(tmp_path, OFF, ON1, ON2)
    loaded_plan(tmp_path, "tenants1-shared", OFF, OFF, ON2, ON2, load=load_record(SPEC, shared=0))
    v, b = tenant_verdict(tmp_path, "tenants1-shared")
    assert v.status == "PASS" and "whose prompts do not share the measured prefix" in v.claim
    assert (
        "the plan's label says prefix 'shared', its runs' recorded tenant prompts show 'unshared': read as "
        "unshared (the records win over the label)"
    ) in v.observed
    assert set(b.tables["tenants.csv"]["prefix"]) == {"unshared"}
    assert set(b.tables["tenants_runs.csv"]["prefix"]) == {"unshared"}


def test_a_flipped_prefix_label_of_a_plan_the_checker_does_not_define_is_read_from_the_prompts(tmp_path):
    """A plan configs/plans.toml does not define (its labels are held against nothing there): labelled "unshared"
    everywhere in its manifests, its recorded tenant prompts share the measured system prompt: shared."""
    from tenant_runs import SPEC, load_record, loaded_inputs, loaded_plan

    spec = {**SPEC, "prefix": "unshared"}
    main_plan(tmp_path, OFF, ON1, ON2)
    loaded_plan(
        tmp_path,
        "my-tenants",
        OFF,
        OFF,
        ON2,
        ON2,
        spec=spec,
        load=load_record(spec, shared=990),
        inputs=loaded_inputs(spec),
    )
    v, b = tenant_verdict(tmp_path, "my-tenants")
    assert "whose prompts share the measured prefix" in v.claim and "label says prefix 'unshared'" in v.observed
    assert set(b.tables["tenants.csv"]["prefix"]) == {"shared"}
    data = check_json(tmp_path)  # the whole check: the plan's runs are admitted, the record's reading in check.json
    scopes = {x["scope"]: x for x in data["beyond"]["verdicts"] if x["id"] == "BEYOND-TENANTS-my-tenants"}
    assert (
        "read as shared" in scopes["cfg/my-tenants"]["observed"] and data["beyond"]["tenants"][0]["prefix"] == "shared"
    )


def test_tenant_prompts_recorded_against_other_first_prompts_decide_nothing(tmp_path):
    """Tenant prompts recorded against first prompts the run did not send (units of another run): whether they share
    the measured prefix is not known; the label is not read either."""
    from tenant_runs import SPEC, load_record, loaded_plan

    load = load_record(SPEC)
    load["units"] = [{**u, "first_prompt_sha256": "ee" * 32} for u in load["units"]]
    main_plan(tmp_path, OFF, ON1, ON2)
    loaded_plan(tmp_path, "tenants1-shared", OFF, OFF, ON2, ON2, load=load)
    v, b = tenant_verdict(tmp_path, "tenants1-shared")
    assert "whose prompts may or may not share the measured prefix" in v.claim
    assert (
        "is not known from the records (its tenant prompts of unit 'e0' are recorded against a first prompt"
        in v.observed
    )
    assert b.tables["tenants.csv"]["prefix"].isna().all()


# --- loopback-only: only where the server the run talked to is on a loopback address ------------------------------

REMOTE = {"url": "http://192.0.2.7:8000", "remote": False, "model_id": "testlm", "started_by": "the user"}


@pytest.mark.parametrize(
    "server, network, why",
    [
        (REMOTE, "host network (not isolated)", "its server http://192.0.2.7:8000 is not a loopback address"),
        ({**REMOTE, "url": "http://db.example:8000"}, "host network (not isolated)", "is not a loopback address"),
        (None, "not known to be loopback-only", "its records show no address of the server it talked to"),
        ({**REMOTE, "url": "http://127.0.0.1:8080"}, "loopback-only", None),
        ({**REMOTE, "url": "http://[::1]:8080"}, "loopback-only", None),
    ],
)
def test_a_remote_servers_run_is_never_loopback_only_whatever_its_manifest_claims(tmp_path, server, network, why):
    """An endpoint run whose manifest claims loopback-only isolation (and `remote: false`) for the server URL it
    records: the URL decides, in check's warnings and in the evidence summary."""
    extra = {**UNOBSERVED, "server": server}
    for arm, k, eps in (("off", 1, OFF), ("off", 2, OFF), ("on", 1, ON1), ("on", 2, ON1)):
        write_bfcl_run(tmp_path / "results", arm, k, eps, engine="endpoint", cache_n="null", manifest=extra)
    run = find_runs(tmp_path / "results")[0]
    assert run.manifest["isolation"]["network"] == "loopback-only"  # the lying label
    got, said = engines.network(run.manifest)
    assert got == network and (why is None and said is None or why in said)
    data = check_json(tmp_path / "results")
    if why is None:
        assert data["unisolated_runs"] == []
    else:
        assert len(data["unisolated_runs"]) == 4
        warning = data["run_warnings"]["cfg/main/off-run1"][0]
        assert (
            network in warning and why in warning and "although its isolation.network says 'loopback-only'" in warning
        )
    with tarfile.open(tmp_path / "records.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "results", arcname="results")
    assert evidence.summarize(tmp_path)["host"]["network"] == [network]


def test_a_server_the_artifact_started_is_on_loopback(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, OFF, manifest={"server": REMOTE})  # a label llama.cpp runs never read
    assert engines.network(run.manifest) == ("loopback-only", None)


def test_runs_against_a_users_server_say_what_no_record_of_them_shows(tmp_path, capsys):
    """Runs of an engine that starts no server of its own (a server the user runs): check's terminal output and the
    report say that the server's other clients (which change even cache-OFF outputs), its command line, binary and
    weights are not observable; runs of a server the artifact started carry no such note."""
    from artifact.check.run import run_check

    for arm, k, eps in (("off", 1, OFF), ("off", 2, OFF), ("on", 1, ON1), ("on", 2, ON1)):
        write_bfcl_run(tmp_path / "user", arm, k, eps, engine="endpoint", cache_n="null", manifest=UNOBSERVED)
    main_plan(tmp_path / "own", OFF, ON1, ON2)
    for root, n in ((tmp_path / "user", 4), (tmp_path / "own", 0)):
        capsys.readouterr()
        run_check(root, quiet=False)
        out, report = capsys.readouterr().out, (root / "check" / "report.html").read_text()
        assert build_tables(find_runs(root)).user_server == (
            ["cfg/main/off-run1", "cfg/main/off-run2", "cfg/main/on-run1", "cfg/main/on-run2"] if n else []
        )
        assert (f"NOTE: {n} run(s) against a server the artifact did not start" in out) == bool(n)
        assert ('id="user-server-runs"' in report) == bool(n)
        if n:
            assert (
                "whether other clients used the server during the runs" in out
                and "Servers the artifact did not start</strong> (4 run(s))" in report
            )


def test_a_run_that_records_no_server_it_started_is_not_a_llama_cpp_run_whatever_its_engine_label(tmp_path):
    """A run whose manifest says engine llama.cpp but records neither the command line nor the binary of a server
    it started (a server the artifact did not start, relabelled): nothing shows llama.cpp's facts (weights it loaded,
    a loopback server) are its, so check refuses the records in one line instead of reading them as llama.cpp's."""
    from artifact.check.run import run_check
    from artifact.errors import ArtifactError

    main_plan(tmp_path, OFF, ON1, ON2)
    run = find_runs(tmp_path)[0]
    (run.path / "manifest.json").write_text(
        json.dumps({k: v for k, v in run.manifest.items() if k not in ("server_cmd", "binary")})
    )
    with pytest.raises(ArtifactError, match=r"off-run1/manifest.json: field 'server_cmd' is missing: every llama.cpp"):
        run_check(tmp_path, quiet=True)
