"""Claim verdicts and run_check's exit code on synthetic runs, with the expected verdicts worked out by hand."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from artifact.analysis.stats import mcnemar_items_for_power
from artifact.analysis.tables import build_tables
from artifact.check.claims import CLAIM_RULES
from artifact.check.claims.rq5 import rq5
from artifact.check.core import (
    BAND_RULE,
    FAIL,
    INCONCLUSIVE,
    NOT_RUN,
    OUT,
    PASS,
    Paper,
    model_matches,
    paper_configs_for,
    value_band,
)
from artifact.check.expected import load_document
from artifact.check.run import run_check, workload_tables
from artifact.errors import ArtifactError
from artifact.records.store import REQUESTS
from synthetic_runs import OFF, ON1, ON2, SHA, main_plan, paper_model, trend_runs, write_bfcl_run, write_raw_run

QWEN7_Q4KM = paper_model("qwen2.5-7b-q4_k_m")  # the paper's weights: a paper configuration by their digests


def check(root, capsys=None):
    code = run_check(root, quiet=capsys is None)
    data = json.loads((root / "check" / "check.json").read_text())
    return code, {c["id"]: c for c in data["claims"]}, data


# --- RQ1 and validity -----------------------------------------------------------------------------------------


def test_off_pair_with_a_diverged_episode_fails_rq1_and_exits_nonzero(tmp_path, capsys):
    off2 = {**OFF, "e1": [[1, 2, 3, 4, 5], [6, 0, 8]]}
    for arm, k, eps in (("off", 1, OFF), ("off", 2, off2), ("on", 1, ON1), ("on", 2, ON2)):
        write_bfcl_run(tmp_path, arm, k, eps)
    code, claims, data = check(tmp_path, capsys)
    assert code == 1 and data["hard_failures"] == ["RQ1"]
    rq1 = claims["RQ1"]
    assert rq1["status"] == FAIL and rq1["hard"]
    assert rq1["observed"].startswith("1/4 diverging episodes")
    assert any("e1 (request 1, token 1)" in e for e in rq1["details"][0]["evidence"])
    out = capsys.readouterr().out
    assert "RQ1 (hard)  FAIL" in out and "hard claim(s) failed: RQ1" in out


def test_off_run_served_cached_tokens_is_invalid(tmp_path, capsys):
    write_bfcl_run(tmp_path, "off", 1, OFF, cache_n=7)
    write_bfcl_run(tmp_path, "off", 2, OFF)
    code, claims, data = check(tmp_path, capsys)
    assert code == 1
    assert any("off-run1" in p and "cached tokens" in p for p in data["invalid"])
    assert claims["RQ1"]["status"] == FAIL  # no divergence, but the OFF run was served from cache
    assert "INVALID: cfg/main/off-run1: cache-OFF run served cached tokens in 4 requests" in capsys.readouterr().out


def test_incomplete_run_is_invalid_and_named(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON1)
    write_bfcl_run(tmp_path, "on", 1, ON1, plan="cram0", complete=False)
    code, claims, data = check(tmp_path)
    assert code == 1 and data["hard_failures"] == []
    assert data["invalid"] == [f"cfg/cram0/on-run1 is incomplete ({tmp_path / 'cfg' / 'cram0' / 'on-run1'})"]


def test_clean_demo_like_results(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON1)  # ON reruns agree: ON rerun 0/4, ON vs OFF 2/4
    code, claims, data = check(tmp_path)
    assert code == 0 and data["invalid"] == []
    assert {k: c["status"] for k, c in claims.items()} == {
        "RQ1": PASS,
        "RQ2": PASS,
        "RQ2b": NOT_RUN,
        "RQ3": NOT_RUN,
        "RQ4": NOT_RUN,
        "RQ5": NOT_RUN,
    }
    direction, *bands = claims["RQ2"]["details"]
    assert direction["kind"] == "direction" and "not a configuration the paper measured" in direction["band"]
    # the paper's seven RQ2 values, none run here (TestLM is not a paper configuration): one NOT-RUN row names them all
    assert len(bands) == 1 and bands[0]["status"] == NOT_RUN and "(7 value(s))" in bands[0]["scope"]
    assert bands[0]["expected"].count(": ") == 7 and "0/7 paper values compared" in claims["RQ2"]["observed"]
    assert "no run with engine = vllm" in claims["RQ4"]["evidence"][0]
    assert claims["RQ5"]["observed"] == "no GSM8K bridge runs"


def test_rq2_tie_with_a_rerun_is_inconclusive_not_fail(tmp_path):
    on2 = {**ON1, "e1": [[0]], "e3": [[0]]}  # ON rerun: e1, e3 differ -> 2/4, equal to ON vs OFF 2/4
    main_plan(tmp_path, OFF, ON1, on2)
    code, claims, _ = check(tmp_path)
    d = claims["RQ2"]["details"][0]
    assert d["status"] == INCONCLUSIVE and claims["RQ2"]["status"] == INCONCLUSIVE and code == 0
    assert "not above the ON rerun (50.0%); not significantly below it either" in d["evidence"][0]


def test_rq2_fails_when_a_rerun_diverges_significantly_more(tmp_path):
    # 20 episodes: ON vs OFF differs in e0 only (1/20); the ON rerun differs from ON run 1 in e10..e17 (8/20).
    # Paired: 8 episodes diverge in the rerun only, 1 in ON vs OFF only: exact McNemar p = 2 * 10/512 = 0.039.
    off = {f"e{i}": [[1, 2]] for i in range(20)}
    on1 = {**off, "e0": [[1, 3]]}
    on2 = {**on1, **{f"e{i}": [[7]] for i in range(10, 18)}}
    main_plan(tmp_path, off, on1, on2, cache_n="warm")
    code, claims, _ = check(tmp_path)
    d = claims["RQ2"]["details"][0]
    assert code == 4 and d["status"] == FAIL and claims["RQ2"]["status"] == FAIL  # 4: a claim other than RQ1 fails
    assert (
        "not above the ON rerun (40.0%); the ON rerun diverges significantly more, exact McNemar over 20 "
        "paired episodes: 8 diverged in the rerun only, 1 in ON vs OFF only, p = 0.039"
    ) in d["evidence"][0]
    # one fewer rerun-only episode (7 vs 1: p = 0.07) is no longer significant: INCONCLUSIVE
    on2 = {**on1, **{f"e{i}": [[7]] for i in range(10, 17)}}
    other = tmp_path / "b"
    main_plan(other, off, on1, on2, cache_n="warm")
    code, claims, _ = check(other)
    assert claims["RQ2"]["details"][0]["status"] == INCONCLUSIVE and code == 0


# --- bands ------------------------------------------------------------------------------------------------------


def test_value_band_hand_computed():
    # r = 0.5, observed [0.4, 0.6]; paper 0.3 with [0.2, 0.4]:
    # low = 0.5 - sqrt(0.1^2 + 0.1^2) - 0.0005 = 0.358079, high = 0.5 + sqrt(0.1^2 + 0.1^2) + 0.0005 = 0.641921
    lo, hi = value_band(0.5, 0.4, 0.6, 0.3, 0.2, 0.4)
    assert lo == pytest.approx(0.5 - math.sqrt(0.02) - 0.0005) and hi == pytest.approx(0.641921, abs=1e-6)
    # asymmetric: only the paper's upper half-width counts below, its lower half-width above
    lo, hi = value_band(0.5, 0.45, 0.6, 0.3, 0.1, 0.35)
    assert lo == pytest.approx(0.5 - math.hypot(0.05, 0.05) - 0.0005)
    assert hi == pytest.approx(0.5 + math.hypot(0.1, 0.2) + 0.0005)


def test_model_matching_rule():
    assert model_matches("Qwen2.5-7B", "qwen2.5", "Qwen2.5-7B-Instruct")
    assert model_matches("Llama-3.1-8B", "llama3.1", "Meta-Llama-3.1-8B-Instruct")
    assert not model_matches("Qwen2.5-7B", "qwen2.5", "Qwen2.5-72B-Instruct")
    assert not model_matches("Qwen2.5-7B", "qwen2.5", "Qwen2.5-Coder-7B-Instruct")
    assert not model_matches(None, "x", "Qwen2.5-7B")  # the paper's vLLM configurations name no model
    configs = load_document()["config"]
    meta = {"engine": "llama.cpp", "pinned_model": ("qwen2.5", "Qwen2.5-7B-Instruct"), "quant": "q4_k"}
    assert paper_configs_for(meta, configs) == ["qwen2.5-7b/llama.cpp/Q4_K_M"]
    assert paper_configs_for({**meta, "engine": "vllm"}, configs) == []
    # the manifest's own name is never read: only the model the checkout's configurations pin the weights as
    labelled = {"engine": "llama.cpp", "model_family": "qwen2.5", "model_name": "Qwen2.5-7B-Instruct", "quant": "q4_k"}
    assert paper_configs_for(labelled, configs) == []
    assert paper_configs_for({**labelled, "pinned_model": None}, configs) == []


def test_a_paper_configuration_is_matched_by_its_weights_not_by_its_name(tmp_path):
    """Runs of the agent model's weights relabelled "Qwen2.5-7B-Instruct" are compared with no paper value; runs of
    the paper's Qwen2.5-7B Q4_K_M weights under another name are compared with its values."""
    from synthetic_runs import series_model

    fake = series_model({"family": "qwen2.5", "name": "Qwen2.5-7B-Instruct"}, "Q4_K_M")  # the agent model's weights
    real = paper_model("qwen2.5-7b-q4_k_m", name="my-model", family="mine")
    off = {f"e{i}": [[1, 2]] for i in range(80)}
    on = {e: ([[1, 3]] if i < 60 else [[1, 2]]) for i, e in enumerate(off)}
    main_plan(tmp_path / "fake", off, on, on, config="q", model=fake, cache_n="warm")
    main_plan(tmp_path / "real", off, on, on, config="q", model=real, cache_n="warm")
    assert "0/7 paper values compared" in check(tmp_path / "fake")[1]["RQ2"]["observed"]
    assert "0/7 paper values compared" not in check(tmp_path / "real")[1]["RQ2"]["observed"]


def paper_config_runs(root, k_onoff: int, k_onrerun: int, n: int = 80):
    off = {f"e{i}": [[1, 2]] for i in range(n)}
    on1 = {e: ([[1, 3]] if i < k_onoff else [[1, 2]]) for i, e in enumerate(off)}
    on2 = {e: ([[7]] if i >= n - k_onrerun else t) for i, (e, t) in enumerate(on1.items())}
    return main_plan(root, off, on1, on2, config="qwen7-q4km", model=QWEN7_Q4KM, cache_n="warm")


def test_paper_configuration_within_band(tmp_path):
    # paper (Qwen2.5-7B Q4_K_M, llama.cpp): ON vs OFF 75.0%, ON reruns 38.8% (Fig. 1): observed 60/80 and 31/80
    paper_config_runs(tmp_path, 60, 31)
    code, claims, _ = check(tmp_path)
    bands = {d["scope"].split(" (")[0]: d for d in claims["RQ2"]["details"] if d["kind"] == "band"}
    assert bands["qwen2.5-7b/llama.cpp/Q4_K_M on vs off"]["status"] == PASS
    assert bands["qwen2.5-7b/llama.cpp/Q4_K_M on rerun"]["status"] == PASS
    # the paper's other configurations, not run here: one NOT-RUN row that names each of their values
    absent = bands["the paper's configurations not in these results"]
    assert absent["status"] == NOT_RUN and "qwen2.5-7b/llama.cpp/F16 on vs off: 36.2%" in absent["expected"]
    assert "qwen2.5-7b/llama.cpp/Q4_K_M" not in absent["expected"]  # it ran: its values have rows of their own
    assert code == 0 and claims["RQ2"]["status"] == PASS


def test_paper_configuration_out_of_band_is_not_a_failure(tmp_path):
    # observed ON vs OFF 20/80 = 25% against the paper's 75.0%: Wilson 20/80 is about 16.8-35.6%, the paper's own
    # 60/80 interval about 64.5-83.2%; the gap of ~29 points is far beyond both errors combined -> OUT-OF-BAND.
    paper_config_runs(tmp_path, 20, 5)
    code, claims, _ = check(tmp_path)
    bands = {d["scope"].split(" (")[0]: d for d in claims["RQ2"]["details"] if d["kind"] == "band"}
    assert bands["qwen2.5-7b/llama.cpp/Q4_K_M on vs off"]["status"] == OUT
    assert claims["RQ2"]["details"][0]["status"] == PASS  # direction still holds (20/80 > 5/80 > 0/80)
    assert claims["RQ2"]["status"] == OUT and code == 0


# --- RQ2b, RQ3, RQ4 -------------------------------------------------------------------------------------------


def test_rq2b_on_four_episodes_is_inconclusive(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)  # default ON reruns: 1/4
    for k in (1, 2):
        write_bfcl_run(tmp_path, "on", k, ON1, plan="cram0", cache_ram_mib=0)  # cram0 reruns: 0/4
    _, claims, _ = check(tmp_path)
    d = claims["RQ2b"]["details"][0]
    # 1 episode diverges by default and agrees with the layer off: exact McNemar p = 1; power at n = 4 is nil
    assert d["scope"] == "cfg / cram0" and d["status"] == INCONCLUSIVE and claims["RQ2b"]["status"] == INCONCLUSIVE
    assert "p = 1" in d["observed"] and "power 0.00" in d["observed"]


def test_rq2b_more_divergence_on_four_episodes_is_not_evidence_against(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)  # default ON reruns: 1/4
    other = {e: [[9]] for e in ON1}
    write_bfcl_run(tmp_path, "on", 1, ON1, plan="cram0", cache_ram_mib=0)
    write_bfcl_run(
        tmp_path, "on", 2, {**ON1, **{e: other[e] for e in ("e0", "e1", "e2")}}, plan="cram0", cache_ram_mib=0
    )  # 3/4
    _, claims, _ = check(tmp_path)
    assert claims["RQ2b"]["status"] == INCONCLUSIVE


def test_rq3_trend(tmp_path):
    trend_runs(tmp_path / "up", {"F16": 10, "Q8_0": 40, "Q4_K_M": 70})  # z = 9.49 (test_tables)
    trend_runs(tmp_path / "flat", {"F16": 40, "Q8_0": 40, "Q4_K_M": 40})  # z = 0, p = 1
    _, up, _ = check(tmp_path / "up")
    _, flat, _ = check(tmp_path / "flat")
    assert up["RQ3"]["status"] == PASS and "z = 9.49" in up["RQ3"]["observed"]
    # TestLM is no model the paper measured: a flat trend there is no evidence against the paper
    assert flat["RQ3"]["status"] == INCONCLUSIVE


def test_rq3_asks_only_for_direction_where_the_papers_own_rates_are_not_significant(tmp_path):
    # Llama-3.1-8B at the paper's Tab. 2 rates (55.0/70.0/68.8% of 80): z = 1.82, p = 0.069
    llama = {"paper": "llama-3.1-8b"}  # each level the paper's weights of that level (configs/paper/)
    trend_runs(tmp_path / "llama", {"Q8_0": 44, "Q4_K_M": 56, "Q3_K_M": 55}, model=llama)
    trend_runs(tmp_path / "other", {"Q8_0": 44, "Q4_K_M": 56, "Q3_K_M": 55})  # a model the paper did not test
    trend_runs(tmp_path / "down", {"Q8_0": 56, "Q4_K_M": 50, "Q3_K_M": 44}, model=llama)
    assert check(tmp_path / "llama")[1]["RQ3"]["status"] == PASS
    assert check(tmp_path / "other")[1]["RQ3"]["status"] == INCONCLUSIVE  # p = 0.069 on a model the paper did not test
    # the paper's model at the paper's scale (80 episodes per level) going down: evidence against
    assert check(tmp_path / "down")[1]["RQ3"]["status"] == FAIL


def test_rq3_two_levels_is_not_run(tmp_path):
    trend_runs(tmp_path, {"F16": 10, "Q8_0": 40})
    _, claims, _ = check(tmp_path)
    assert claims["RQ3"]["status"] == NOT_RUN


def test_rq4_with_vllm_runs(tmp_path):
    # OFF runs that do not report cache use (a null is never read as 0), ON runs served cached tokens (RQ4 needs them)
    for k in (1, 2):
        write_bfcl_run(tmp_path, "off", k, OFF, engine="vllm", cache_n="null")
    write_bfcl_run(tmp_path, "on", 1, ON1, engine="vllm")
    write_bfcl_run(tmp_path, "on", 2, ON2, engine="vllm")
    code, claims, _ = check(tmp_path)
    assert claims["RQ4"]["status"] == PASS and code == 0
    assert "cache use not reported" in claims["RQ1"]["details"][0]["observed"]
    # that the OFF runs were served no cached token is not shown: RQ1 cannot be decided (never a guessed PASS)
    assert claims["RQ1"]["status"] == INCONCLUSIVE
    # vLLM reports cache use on every request it serves: a null there is not its answer (check.core.cache_unverified)
    assert "although vllm reports it on every request it serves" in claims["RQ1"]["details"][0]["evidence"][0]


# a server the artifact did not start (engine endpoint): what its engine could not observe
UNOBSERVED = {
    "observes": {
        "server_cmd": False,
        "binary": False,
        "weights_sha256": False,
        "cache_use": "as reported",
        "cache_control": "per server, declared by the user",
        "logprobs": True,
        "exclusive": False,
    }
}


def test_rq1_off_reruns_that_diverge_where_cache_use_is_not_reported_are_no_evidence_either_way(tmp_path):
    diverged = {**OFF, "e1": [[9, 9]]}
    write_bfcl_run(tmp_path, "off", 1, OFF, cache_n="null", engine="endpoint", manifest=UNOBSERVED)
    write_bfcl_run(tmp_path, "off", 2, diverged, cache_n="null", engine="endpoint", manifest=UNOBSERVED)
    _, claims, _ = check(tmp_path)
    rq1 = claims["RQ1"]["details"][0]
    assert claims["RQ1"]["status"] == INCONCLUSIVE and "1 diverging episode(s) are no evidence" in rq1["evidence"][0]
    assert any("not observable by the engine" in e and "weights_sha256" in e for e in rq1["evidence"])


def test_rq3_levels_whose_weights_are_not_observable_join_no_series(tmp_path):
    """A server the artifact did not start: which model its weights are a level of is not known (no digest the
    artifact verified), so its configurations form no series, whatever their names and quant labels say."""
    trend_runs(
        tmp_path, {"F16": 10, "Q8_0": 40, "Q4_K_M": 70}, engine="endpoint", manifest=UNOBSERVED
    )  # z = 9.49 if the levels held
    _, claims, _ = check(tmp_path)
    rq3 = claims["RQ3"]
    assert rq3["status"] == NOT_RUN and rq3["details"] == [] and "z = " not in rq3["observed"]
    assert "3 configuration(s) in no series" in rq3["observed"]
    assert any(
        e.startswith("in no series: t-F16: its weights are not known: the artifact did not load them")
        for e in rq3["evidence"]
    )


def endpoint_plan(root, **manifest):
    """The paired plan of runs through the endpoint engine (a server the user runs), with extra manifest fields."""
    for k in (1, 2):
        write_bfcl_run(root, "off", k, OFF, engine="endpoint", manifest={**UNOBSERVED, **manifest})
    write_bfcl_run(root, "on", 1, ON1, engine="endpoint", manifest={**UNOBSERVED, **manifest})
    write_bfcl_run(root, "on", 2, ON2, engine="endpoint", manifest={**UNOBSERVED, **manifest})
    return check(root)[1]["RQ4"]


def _identity(*owners: str | None) -> dict:
    return {"server": {"identity": {"models": [{"id": "testlm", **({"owned_by": o} if o else {})} for o in owners]}}}


def test_rq4_takes_runs_against_a_vllm_server_whichever_engine_talked_to_it(tmp_path):
    """RQ4 is about vLLM servers ([claim.RQ4] server_family): an endpoint run against a user's vLLM server counts,
    one against a llama-server does not; which server it was is what the server reported of itself (its recorded
    identity), never the manifest's `server_family` label."""
    rq4 = endpoint_plan(tmp_path / "vllm", server_family="vllm", **_identity("vllm"))
    assert rq4["status"] == PASS and rq4["details"][0]["scope"] == "cfg / main"
    assert endpoint_plan(tmp_path / "llama", server_family="llamacpp", **_identity("llamacpp"))["status"] == NOT_RUN
    old = {"server_family": None, **_identity("vllm")}
    assert endpoint_plan(tmp_path / "old", **old)["status"] == rq4["status"]
    unknown = {"server_family": None, **_identity(None)}
    assert endpoint_plan(tmp_path / "unknown", **unknown)["status"] == NOT_RUN  # never guessed


def test_a_server_family_label_never_routes_a_run_into_rq4(tmp_path):
    """A label that says vLLM routes nothing: an endpoint run whose recorded server identity says
    llama.cpp (or says nothing), and a llama-server run, stay out of RQ4 whatever their `server_family` says."""
    assert endpoint_plan(tmp_path / "llama", server_family="vllm", **_identity("llamacpp"))["status"] == NOT_RUN
    assert endpoint_plan(tmp_path / "silent", server_family="vllm", **_identity(None))["status"] == NOT_RUN
    main_plan(tmp_path / "own", OFF, ON1, ON2, manifest={"server_family": "vllm"})
    assert check(tmp_path / "own")[1]["RQ4"]["status"] == NOT_RUN


def test_the_server_family_is_derived_from_facts():
    from artifact import engines

    assert engines.server_family({"engine": "vllm"}) == "vllm"
    assert engines.server_family({}) == engines.server_family({"engine": "llama.cpp"}) == "llamacpp"
    assert engines.server_family({"engine": "llama.cpp", "server_family": "vllm"}) == "llamacpp"  # a label, not a fact
    assert engines.server_family({"engine": "endpoint"}) is None
    assert engines.server_family({"engine": "endpoint", "server_family": "vllm"}) is None
    assert engines.server_family({"engine": "endpoint", **_identity("vllm")}) == "vllm"
    assert engines.server_family({"engine": "no-such-engine", "server_family": "x"}) is None


# --- RQ5 on a stub Tab. 3 -------------------------------------------------------------------------------------


def tab3_stub(rows: list[dict]) -> pd.DataFrame:
    base = {
        "plan": "bridge",
        "status": "complete",
        "cold_identical": 200,
        "warm_identical": 200,
        "n": 200,
        "items": 200,
        "flagged_servings": 0,
    }
    return pd.DataFrame([{**base, **r} for r in rows])


PAPER = Paper(load_document())


def paper_scale(**r) -> dict:
    """One of two configurations of 650 items each: 1300 items, as the paper pools."""
    return {"n": 650, "items": 650, "cold_identical": 650, "warm_identical": 650, "data": "gsm8k", **r}


def test_rq5_paper_like_flips_pass():
    # 13 vs 7 discordant pairs over 1300 items: exact two-sided p = 2 * P(Bin(20, 1/2) <= 7) = 0.2632 (paper:
    # 0.26); discordant rate 20/1300 = 1.54%, power for a 1 pp shift 0.81 (the paper's figure) >= 0.80
    df = tab3_stub(
        [
            paper_scale(config="a", flips_numeric_cache=8, flips_numeric_recompute=4, mcnemar_p=0.388),
            paper_scale(config="b", flips_numeric_cache=5, flips_numeric_recompute=3, mcnemar_p=0.727),
        ]
    )
    c = rq5(df, PAPER)
    assert c.status == PASS
    pooled = c.details[-1]
    assert pooled.kind == "pooled" and "13 cache / 7 recompute" in pooled.observed and "p = 0.26" in pooled.observed
    assert "power 0.81" in pooled.observed


def test_rq5_the_same_flips_on_400_items_are_inconclusive():
    df = tab3_stub(
        [
            {
                "config": "a",
                "data": "gsm8k",
                "flips_numeric_cache": 8,
                "flips_numeric_recompute": 4,
                "mcnemar_p": 0.388,
            },
            {
                "config": "b",
                "data": "gsm8k",
                "flips_numeric_cache": 5,
                "flips_numeric_recompute": 3,
                "mcnemar_p": 0.727,
            },
        ]
    )
    c = rq5(df, PAPER)  # 400 items at 5% discordance: power 0.2 for a 1 pp shift
    assert c.status == INCONCLUSIVE and c.details[-1].status == INCONCLUSIVE
    assert "below 0.8" in c.details[-1].evidence[0]
    # and how many items its discordant rate (20/400) would need, rounded up to a hundred
    need = mcnemar_items_for_power(20 / 400, 0.01)
    assert f"(20/400 = 5.0%) about {-(-need // 100) * 100:,} items would reach 0.8" in c.details[-1].evidence[0]


def test_rq5_most_servings_flagged_cannot_be_judged():
    # 300 of 800 servings (37.5%) flagged: more than 10%; the 125 counted items are a selection
    df = tab3_stub(
        [
            paper_scale(
                config="a",
                items=200,
                n=125,
                cold_identical=125,
                warm_identical=125,
                flagged_servings=300,
                flips_numeric_cache=1,
                flips_numeric_recompute=1,
                mcnemar_p=1.0,
            )
        ]
    )
    c = rq5(df, PAPER)
    assert c.status == INCONCLUSIVE and "37.5% of servings flagged" in c.details[0].evidence[0]
    assert len(c.details) == 1  # nothing judged: no pooled verdict


def test_rq5_synthetic_only_is_not_run_and_says_so():
    df = tab3_stub(
        [{"config": "a", "data": "synthetic", "flips_numeric_cache": 2, "flips_numeric_recompute": 1, "mcnemar_p": 1.0}]
    )
    c = rq5(df, PAPER)
    assert c.status == NOT_RUN and "synthetic" in c.evidence[0] and "synthetic items" in c.details[0].observed


def test_rq5_failures():
    nondet = tab3_stub(
        [
            {
                "config": "a",
                "data": "gsm8k",
                "cold_identical": 199,
                "flips_numeric_cache": 3,
                "flips_numeric_recompute": 2,
                "mcnemar_p": 1.0,
            }
        ]
    )
    assert rq5(nondet, PAPER).status == FAIL
    # 5 vs 0 over 1300 items: p = 0.0625, power 0.99 at the 1 pp floor of the discordant rate: flips one way only
    one_way = tab3_stub(
        [
            paper_scale(
                config="a",
                n=1300,
                items=1300,
                cold_identical=1300,
                warm_identical=1300,
                flips_numeric_cache=5,
                flips_numeric_recompute=0,
                mcnemar_p=0.0625,
            )
        ]
    )
    assert rq5(one_way, PAPER).details[-1].status == FAIL
    assert "do not go both ways" in rq5(one_way, PAPER).details[-1].evidence[0]
    # 15 vs 2: p = 2 * (1 + 17 + 136) / 2^17 = 0.00235 <= 0.05
    shifted = tab3_stub(
        [
            {
                "config": "a",
                "data": "gsm8k",
                "flips_numeric_cache": 15,
                "flips_numeric_recompute": 2,
                "mcnemar_p": 0.00235,
            }
        ]
    )
    c = rq5(shifted, PAPER)
    assert c.status == FAIL and "p = 0.0023" in c.details[-1].evidence[0]


def test_rq5_without_bridge_runs(tmp_path):
    assert rq5(None, PAPER).status == NOT_RUN
    assert "tab3.csv" not in workload_tables(main_plan(tmp_path, OFF, ON1, ON2)).get("gsm8k", {})  # no Tab. 3


# --- inputs that are not results ------------------------------------------------------------------------------


def one_line_error(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_no_runs_or_missing_dir_is_a_one_line_error(tmp_path):
    with pytest.raises(ArtifactError) as e:
        run_check(tmp_path)
    assert "no runs" in one_line_error(e)
    with pytest.raises(ArtifactError) as e:
        run_check(tmp_path / "nope")
    assert "does not exist" in one_line_error(e)


def test_malformed_records_are_one_line_errors(tmp_path):
    d = tmp_path / "c" / "main" / "off-run1"
    write_raw_run(
        d,
        {"config": "c", "plan": "main", "arm": "off", "run": 1, "episodes": ["e0"]},
        [{"episode_id": "e0", "request_index": 0, "prompt_sha256": SHA, "prompt_tokens": 5, "cache_n": 0}],
    )
    with pytest.raises(ArtifactError) as e:
        run_check(tmp_path)
    assert "requests.jsonl:1: field 'output_tokens' is missing" in one_line_error(e)
    write_raw_run(
        d,
        {"config": "c", "plan": "main", "arm": "off", "run": 1, "episodes": ["e0"]},
        [
            {
                "episode_id": "e0",
                "request_index": 0,
                "prompt_sha256": "x",
                "prompt_tokens": 5,
                "cache_n": 0,
                "output_tokens": [1],
            }
        ],
    )
    with pytest.raises(ArtifactError) as e:
        run_check(tmp_path)
    assert "requests.jsonl:1: field 'prompt_sha256' must be 64 lower-case hex digits" in one_line_error(e)
    (d / REQUESTS).write_text('{"episode_id": \n{"a": 1}\n')  # corrupt line in the middle
    with pytest.raises(ArtifactError) as e:
        run_check(tmp_path)
    assert "requests.jsonl:1: not valid JSON" in one_line_error(e)
    mf = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**mf, "run": "1"}))
    (tmp_path / "c" / "main" / "off-run2").mkdir()
    (tmp_path / "c" / "main" / "off-run2" / "manifest.json").write_text(json.dumps({**mf, "run": 2}))
    with pytest.raises(ArtifactError) as e:
        run_check(tmp_path)
    one_line_error(e)


def test_rules_are_written_down():
    assert set(CLAIM_RULES) == {"RQ1", "RQ2", "RQ2b", "RQ3", "RQ4", "RQ5"}
    assert all(r["rule"] and r["statement"] for r in CLAIM_RULES.values())
    assert CLAIM_RULES["RQ1"]["hard"] and not any(r["hard"] for k, r in CLAIM_RULES.items() if k != "RQ1")
    assert "Newcombe" in BAND_RULE and "0.0005" in BAND_RULE


def test_tables_alone_do_not_need_expected(tmp_path):
    t = build_tables(main_plan(tmp_path, OFF, ON1, ON2), tmp_path)
    assert "paper_value" not in t.fig2.columns  # paper values are joined by the checker, not the tables


def test_odd_manifest_tables_are_one_line_errors_naming_the_field(tmp_path):
    for k in (1, 2):
        write_raw_run(
            tmp_path / "c" / "main" / f"off-run{k}",
            {
                "config": "c",
                "plan": "main",
                "arm": "off",
                "run": k,
                "episodes": ["e0"],
                "model": ["not", "a", "table"],
                "plan_data": "x",
                "host": 3,
                "packages": None,
                "pairing_fingerprint": "f0",
                "pairing_inputs": "not a table",
                "isolation": "x",
            },
            [
                {
                    "episode_id": "e0",
                    "request_index": 0,
                    "prompt_sha256": SHA,
                    "prompt_tokens": 5,
                    "cache_n": 0,
                    "output_tokens": [1, k],
                    "top_logprobs": [7, [[1, None]]],
                }
            ],
            [{"episode_id": "e0", "n_requests": 1}],
        )
    with pytest.raises(ArtifactError) as e:
        run_check(tmp_path)
    assert "manifest.json: field 'model' must be dict, not list" in one_line_error(e)


def test_odd_log_probabilities_are_malformed_records(tmp_path):
    for k in (1, 2):
        write_raw_run(
            tmp_path / "c" / "main" / f"off-run{k}",
            {"config": "c", "plan": "main", "arm": "off", "run": k, "episodes": ["e0"]},
            [
                {
                    "episode_id": "e0",
                    "request_index": 0,
                    "prompt_sha256": SHA,
                    "prompt_tokens": 5,
                    "cache_n": 0,
                    "output_tokens": [1, k],
                    "top_logprobs": [7, [[1, None]]],
                }
            ],
            [{"episode_id": "e0", "n_requests": 1}],
        )
    with pytest.raises(ArtifactError) as e:
        run_check(tmp_path)
    assert (
        "off-run1/requests.jsonl:1: field 'top_logprobs' position 0 must be null or a list of [token id, "
        "logprob] pairs" in one_line_error(e)
    )


def test_a_position_without_log_probabilities_has_no_margin_in_the_report(tmp_path):
    lps = {("e0", 0): [[[1, -0.1], [2, -2.5]], None]}
    main_plan(tmp_path, {"e0": [[1, 2]]}, {"e0": [[1, 3]]}, {"e0": [[1, 3]]}, logprobs=lps)
    check(tmp_path)
    assert "Top-2 log-probabilities at the flip: not available" in (tmp_path / "check" / "report.html").read_text()
