"""Results beyond the paper: margins, what the cache buys, reproducible cached serving.

Synthetic records with known margins, savings and agreements, written through the real RunWriter; the statistics
are checked against independent references (exact enumeration of Page's null distribution and of the bootstrap
distribution).
"""

from __future__ import annotations

import math

import itertools
import json

import numpy as np
import pytest

from artifact.analysis import benefit, margins, mitigation
from artifact.check.beyond import analyse
from artifact.check.run import run_check
from artifact.records.store import MANIFEST, REQUESTS, find_runs, load_run, write_json_atomic
from tests.synthetic_runs import MODEL, write_bfcl_run


def _lp(margins_: list[float], toks: list[int]) -> list:
    """Top-2 entries giving the chosen token `t` a lead of `m` nats over token t + 1000 (probabilities that sum to
    < 1 at any margin, as a softmax gives them)."""
    return [[[t, -0.7], [t + 1000, -0.7 - m]] for t, m in zip(toks, margins_)]


def _patch(run, manifest: dict | None = None, request=None):
    """Rewrite a finished synthetic run's manifest fields and/or each request record (request(rec) -> rec)."""
    if manifest:
        m = json.loads((run.path / MANIFEST).read_text())
        for k, v in manifest.items():
            if isinstance(v, dict) and isinstance(m.get(k), dict):
                m[k] = {**m[k], **v}
            else:
                m[k] = v
        write_json_atomic(run.path / MANIFEST, m)
    if request:
        lines = (run.path / REQUESTS).read_text().splitlines()
        recs = [request(json.loads(x)) for x in lines]
        (run.path / REQUESTS).write_text("".join(json.dumps(r) + "\n" for r in recs))
    return load_run(run.path)


# --- margins ----------------------------------------------------------------------------------------------------


def test_margin_is_the_gap_between_the_two_best_log_probabilities():
    assert margins.margin([[5, -0.1], [6, -2.0]]) == pytest.approx(1.9)
    assert margins.margin([[6, -2.0], [5, -0.1]]) == pytest.approx(1.9)  # order of the entries does not matter
    assert np.isnan(margins.margin([[5, -0.1]]))
    assert np.isnan(margins.margin([]))


def test_margin_distribution_shares_below_thresholds(tmp_path):
    ms = [0.005, 0.02, 0.07, 0.3, 0.8, 2.0]
    eps = {"e0": [[1, 2, 3], [4, 5, 6]]}
    lps = {("e0", 0): _lp(ms[:3], [1, 2, 3]), ("e0", 1): _lp(ms[3:], [4, 5, 6])}
    write_bfcl_run(tmp_path, "off", 1, eps, logprobs=lps)
    write_bfcl_run(tmp_path, "on", 1, eps, logprobs=lps)  # ON margins are not part of the distribution
    df = margins.margin_distribution(find_runs(tmp_path))
    row = df.iloc[0]
    assert row["positions"] == 6
    shares = [row[f"share_below_{t:g}"] for t in margins.THRESHOLDS]
    assert shares == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6])
    assert row["median"] == pytest.approx((0.07 + 0.3) / 2)


def _flip_pair(tmp_path, plan="main"):
    """OFF and ON: episode e0 flips at request 1, token 1 (margins 0.02 OFF, 0.01 ON); e1 agrees everywhere."""
    off = {"e0": [[1, 2, 3], [4, 5, 6]], "e1": [[7, 8], [9, 10]]}
    on = {"e0": [[1, 2, 3], [4, 9, 6]], "e1": [[7, 8], [9, 10]]}
    lp_off = {
        ("e0", 0): _lp([0.004, 0.004, 0.004], [1, 2, 3]),
        ("e0", 1): _lp([0.5, 0.02, 2.0], [4, 5, 6]),
        ("e1", 0): _lp([0.004, 0.004], [7, 8]),
        ("e1", 1): _lp([5.0, 0.2], [9, 10]),
    }
    lp_on = {**lp_off, ("e0", 1): _lp([0.5, 0.01, 2.0], [4, 9, 6])}
    return (
        write_bfcl_run(tmp_path, "on", 1, on, logprobs=lp_on, plan=plan),
        write_bfcl_run(tmp_path, "off", 1, off, logprobs=lp_off, plan=plan),
    )


def test_first_divergence_margins_in_both_arms(tmp_path):
    _flip_pair(tmp_path)
    df = margins.first_divergence_margins(find_runs(tmp_path))
    assert len(df) == 1
    r = df.iloc[0]
    assert (r["episode_id"], r["request"], r["token"], r["token_on"], r["token_off"]) == ("e0", 1, 1, 9, 5)
    assert r["margin_off"] == pytest.approx(0.02)
    assert r["margin_on"] == pytest.approx(0.01)


def test_flip_positions_count_only_cached_positions_up_to_the_flip(tmp_path):
    on, off = _flip_pair(tmp_path)
    m, f = margins.flip_positions(on, off)
    # Requests 0 served no cached tokens (synthetic cache_n 0): not at risk. e0 request 1: positions 0 and 1 (the
    # flip); e1 request 1: both positions, no flip.
    assert sorted(m.tolist()) == pytest.approx(sorted([0.5, 0.02, 5.0, 0.2]))
    assert dict(zip(m.round(3).tolist(), f.tolist())) == {0.5: 0, 0.02: 1, 5.0: 0, 0.2: 0}


def test_flip_by_margin_bins_with_wilson_intervals(tmp_path):
    _flip_pair(tmp_path)
    curve = margins.flip_by_margin(find_runs(tmp_path)).set_index("margin_bin")
    assert curve.loc["[0.01, 0.03)", ["positions", "flips"]].tolist() == [1, 1]
    assert curve.loc["[0.1, 0.3)", ["positions", "flips"]].tolist() == [1, 0]
    assert curve.loc["[0.3, 1)", ["positions", "flips"]].tolist() == [1, 0]
    assert curve.loc[">= 3", ["positions", "flips"]].tolist() == [1, 0]
    assert curve["positions"].sum() == 4
    # Wilson 95% for k = n = 1 in closed form: (1 + z^2/2 - z * z/2) / (1 + z^2) = 1 / (1 + z^2)
    z = 1.959963984540054
    assert curve.loc["[0.01, 0.03)", "wilson_lo"] == pytest.approx(1 / (1 + z * z), rel=1e-9)
    trend = margins.flip_trend(curve.reset_index())
    assert trend.iloc[0]["z"] < 0  # the only flip sits in the smallest occupied bin


def _page_exact(data: np.ndarray) -> tuple[float, float]:
    """Page's L and its exact one-sided p, enumerating every within-block ranking (null: all m! equally likely)."""
    n, m = data.shape
    ranks = np.argsort(np.argsort(data, axis=1), axis=1) + 1
    weights = np.arange(1, m + 1)
    L = float((ranks * weights).sum())
    per_block = [float(np.dot(p, weights)) for p in itertools.permutations(range(1, m + 1))]
    count = sum(1 for combo in itertools.product(per_block, repeat=n) if sum(combo) >= L - 1e-9)
    return L, count / len(per_block) ** n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_page_test_matches_exact_enumeration(seed):
    data = np.random.default_rng(seed).normal(size=(4, 3)) + np.array([0.0, 0.4, 0.8])
    L, p, method = margins.page_test(data)
    L_ref, p_ref = _page_exact(data)
    assert L == pytest.approx(L_ref)
    assert p == pytest.approx(p_ref, rel=1e-9)


def test_margin_trend_over_a_quantization_series(tmp_path):
    # Four episodes; every episode's median margin rises from Q3_K_M to Q4_K_M to Q8_0: every block ranks the
    # levels in the predicted order, so L = n * (1 + 4 + 9) = 56 and exact p = (1/3!)^4.
    eps = {f"e{i}": [[1, 2, 3]] for i in range(4)}
    for quant, base in (("Q8_0", 3.0), ("Q4_K_M", 1.0), ("Q3_K_M", 0.2)):
        lps = {(f"e{i}", 0): _lp([base + 0.1 * i] * 3, [1, 2, 3]) for i in range(4)}
        write_bfcl_run(tmp_path, "off", 1, eps, logprobs=lps, config=f"cfg-{quant}", model={**MODEL, "quant": quant})
    df = margins.margin_trend(find_runs(tmp_path))
    r = df.iloc[0]
    assert r["levels"] == "Q3_K_M < Q4_K_M < Q8_0"
    assert (r["episodes"], r["L"]) == (4, 56.0)
    assert r["p_value"] == pytest.approx(6.0**-4)


def test_margin_trend_needs_three_levels(tmp_path):
    write_bfcl_run(tmp_path, "off", 1, {"e0": [[1]]})
    r = margins.margin_trend(find_runs(tmp_path)).iloc[0]
    assert np.isnan(r["p_value"]) and "3 quantization levels" in r["note"]


# --- what the cache buys ----------------------------------------------------------------------------------------


def test_ratio_interval_matches_the_exact_bootstrap_distribution():
    on, off = np.array([10.0, 20.0, 30.0, 45.0]), np.array([40.0, 50.0, 70.0, 80.0])
    point, lo, hi = benefit.ratio_interval(on, off, n_resamples=40_000)
    assert point == pytest.approx(105 / 240)
    # Every one of the 4^4 equally likely paired resamples, exactly.
    exact = np.array([on[list(i)].mean() / off[list(i)].mean() for i in itertools.product(range(4), repeat=4)])
    ref_lo, ref_hi = np.quantile(exact, [0.025, 0.975], method="inverted_cdf")
    step = np.diff(np.unique(exact)).max()  # the percentile may land anywhere between neighbouring support points
    assert abs(lo - ref_lo) <= step and abs(hi - ref_hi) <= step
    assert ref_lo <= point <= ref_hi


def test_ratio_interval_degenerate_inputs():
    assert np.isnan(benefit.ratio_interval([1.0], [2.0])[1])
    assert benefit.ratio_interval([1.0], [2.0])[0] == 0.5
    assert all(np.isnan(benefit.ratio_interval([], [])))
    with pytest.raises(ValueError):
        benefit.ratio_interval([1.0, 2.0], [1.0])


def test_a_quantity_the_off_arm_never_spent_has_no_ratio_and_prints_no_warning():
    """An OFF arm whose requests report 0 for a quantity (a server without prompt timings): no ratio, NaN interval,
    and nothing on stderr (no warning from check on valid input); the other column is unaffected."""
    import warnings

    on = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
    off = np.array([[0.0, 4.0], [0.0, 8.0], [0.0, 13.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (p0, lo0, hi0), (p1, lo1, hi1) = benefit.ratio_intervals(on, off, n_resamples=999)
    assert np.isnan(p0) and np.isnan(lo0) and np.isnan(hi0)
    assert p1 == pytest.approx(13 / 25) and lo1 <= p1 <= hi1


def test_costs_and_ratios_from_known_savings(tmp_path):
    eps = {"e0": [[1], [2]], "e1": [[3], [4]]}
    on = write_bfcl_run(tmp_path, "on", 1, eps)  # requests after the first: 60 of 100 prompt tokens cached
    off = write_bfcl_run(tmp_path, "off", 1, eps)
    _patch(on, {"wall_s": 10.0}, lambda r: {**r, "prompt_ms": 4.0 if r["cache_n"] else 10.0})
    _patch(off, {"wall_s": 40.0}, lambda r: {**r, "prompt_ms": 10.0})
    runs = find_runs(tmp_path)
    costs = benefit.costs_frame(runs).set_index("arm")
    assert costs.loc["on", ["prompt_tokens", "cached_tokens", "evaluated_tokens"]].tolist() == [400, 120, 280]
    assert costs.loc["on", "cached_share"] == pytest.approx(0.3)
    assert costs.loc["on", "ttft_ms_mean"] == pytest.approx(28.0 / 4)
    r = benefit.ratios_frame(runs).iloc[0]
    assert r["evaluated_tokens_ratio"] == pytest.approx(280 / 400)
    assert r["prompt_ms_ratio"] == pytest.approx(28 / 40)
    assert r["wall_ratio"] == pytest.approx(0.25)
    assert r["episodes"] == 2


# --- reproducible cached serving ---------------------------------------------------------------------------------


def _arms(
    tmp_path, plan, on_eps, off_eps, *, runs=(1, 2), overrides=None, lifecycle="shared", wall=(10.0, 20.0), config="cfg"
):
    out = []
    for k in runs:
        for arm, eps, w in (("on", on_eps, wall[0]), ("off", off_eps, wall[1])):
            r = write_bfcl_run(tmp_path, arm, k, eps, plan=plan, lifecycle=lifecycle, config=config)
            out.append(_patch(r, {"wall_s": w, "plan_data": {"server_overrides": overrides or {}}}))
    return out


def test_mitigation_verdicts_cost_and_recommendation(tmp_path):
    agree = {"e0": [[1, 2], [3, 4]], "e1": [[5], [6]]}
    differ = {"e0": [[1, 2], [3, 9]], "e1": [[5], [6]]}
    _arms(tmp_path, "main", differ, agree, wall=(10.0, 20.0))
    _arms(tmp_path, "ub1", agree, agree, overrides={"ubatch_size": 1}, wall=(25.0, 50.0))
    _arms(tmp_path, "fa-off", differ, agree, overrides={"flash_attn": "off"}, wall=(12.0, 24.0))
    b = analyse(find_runs(tmp_path))
    v = {x.id: x for x in b.verdicts}
    assert v["BEYOND-MITIGATION-ub1"].status == "PASS"
    ub1 = v["BEYOND-MITIGATION-ub1"].observed
    assert "0/4 episode pairs" in ub1 and "bit-exact" in ub1
    assert v["BEYOND-MITIGATION-fa-off"].status == "FAIL"
    assert "2/4" in v["BEYOND-MITIGATION-fa-off"].observed
    assert "BEYOND-MITIGATION-main" not in v  # the plain plan is the baseline, not a mitigation
    rows = b.tables["mitigation.csv"].set_index("plan")
    assert rows.loc["ub1", "on_wall_s_vs_main"] == pytest.approx(2.5)
    assert rows.loc["ub1", "on_wall_vs_main_off"] == pytest.approx(1.25)
    assert rows.loc["main", "on_vs_off_diverged"] == 2 and rows.loc["main", "on_vs_off_episodes"] == 4
    rec = " ".join(b.recommendation)
    assert "ubatch_size=1 (plan ub1)" in rec and "2.50x" in rec
    assert "flash_attn=off (plan fa-off) does not suffice" in rec


def test_mitigation_cost_is_not_set_against_main_over_other_episodes(tmp_path):
    # ub1 ran one episode, main two: per-run wall times are not comparable, so no ratio against main
    agree = {"e0": [[1, 2], [3, 4]], "e1": [[5], [6]]}
    _arms(tmp_path, "main", agree, agree, wall=(10.0, 20.0))
    _arms(tmp_path, "ub1", {"e0": agree["e0"]}, {"e0": agree["e0"]}, overrides={"ubatch_size": 1}, wall=(5.0, 25.0))
    b = analyse(find_runs(tmp_path))
    row = b.tables["mitigation.csv"].set_index("plan").loc["ub1"]
    assert math.isnan(row["on_wall_s_vs_main"]) and math.isnan(row["on_wall_vs_main_off"])
    (v,) = [x for x in b.verdicts if x.id == "BEYOND-MITIGATION-ub1"]
    assert v.evidence == [
        "cost not set against the main plan: this plan ran 1 episodes, main 2 (times are per "
        "run); ON wall 0.20x its own OFF wall"
    ]
    assert "0.20x its own OFF wall" in " ".join(b.recommendation)


def test_max_logprob_gap_separates_token_identity_from_bit_identity(tmp_path):
    eps = {"e0": [[1, 2], [3, 4]]}
    a = write_bfcl_run(tmp_path, "on", 1, eps, logprobs={("e0", 1): [[[3, -0.1], [4, -2.5]], [[4, -0.2], [5, -2.0]]]})
    b = write_bfcl_run(
        tmp_path, "off", 1, eps, logprobs={("e0", 1): [[[3, -0.1], [4, -2.588]], [[4, -0.2], [5, -2.0]]]}
    )
    assert mitigation.max_logprob_gap(a, b) == pytest.approx(0.088)
    assert mitigation.max_logprob_gap(a, a) == 0.0


def test_fresh_verdict_pass_fail_and_not_run(tmp_path):
    eps = {"e0": [[1, 2], [3, 4]]}
    assert mitigation.fresh_verdicts(find_runs(_empty(tmp_path)))[0].status == "NOT-RUN"
    _arms(tmp_path / "a", "fresh", eps, eps, lifecycle="fresh")
    assert [v.status for v in mitigation.fresh_verdicts(find_runs(tmp_path / "a"))] == ["PASS"]
    root = tmp_path / "b"
    for k, eps_on in ((1, eps), (2, {"e0": [[1, 2], [3, 5]]})):
        write_bfcl_run(root, "on", k, eps_on, plan="fresh", lifecycle="fresh")
    (v,) = mitigation.fresh_verdicts(find_runs(root))
    assert v.status == "FAIL" and v.observed == "ON rerun diverged in 1/1 episodes"
    assert "e0: request 1, token 1" in v.evidence


def _empty(tmp_path):
    write_bfcl_run(tmp_path / "none", "off", 1, {"e0": [[1]]})
    return tmp_path / "none"


def test_check_writes_beyond_outputs_without_changing_the_exit_code(tmp_path):
    agree = {"e0": [[1, 2], [3, 4]]}
    differ = {"e0": [[1, 2], [3, 9]]}
    res = tmp_path / "res"
    _arms(res, "main", agree, agree)
    _arms(res, "fa-off", differ, agree, overrides={"flash_attn": "off"})
    out = tmp_path / "check"
    code = run_check(res, out, quiet=True)
    summary = json.loads((out / "check.json").read_text())
    assert code == summary["exit_code"] == 0  # a failed mitigation is a measurement, not an invalid result
    statuses = {v["id"]: v["status"] for v in summary["beyond"]["verdicts"]}
    assert statuses == {
        "BEYOND-FRESH": "NOT-RUN",
        "BEYOND-MITIGATION-fa-off": "FAIL",
        "BEYOND-TENANTS": "NOT-RUN",
        "BEYOND-TIERS": "NOT-RUN",
    }  # synthetic runs keep no server log: tiers unknown
    for name in (
        "margins.csv",
        "flip_by_margin.csv",
        "benefit_ratios.csv",
        "mitigation.csv",
        "beyond_verdicts.csv",
        "price.png",
        "flip_margin.png",
    ):
        assert (out / name).exists() and name in summary["files"]
    html = (out / "report.html").read_text()
    assert 'id="beyond"' in html and "flash_attn=off (plan fa-off) does not suffice" in html


def test_run_top2_batch_parse_equals_json_decoding(tmp_path):
    # The one-pass parse of the top-2 texts gives what json gives, record by record (exactly: the numbers are
    # correctly rounded); a record that is not top-2 everywhere (a position with one entry) is left out of the
    # parse and read from its own list.
    eps = {"e0": [[1, 2], [3]], "e1": [[4, 5, 6]]}
    lps = {
        ("e0", 0): [[[1, -1.5e-3], [7, -7.25]], [[2, -1e-7], [9, -16.0]]],
        ("e1", 0): [[[4, -0.7], [5, -0.8]], [[5, -0.9], [4, -1.4]], [[6, 0.0], [8, -14.5]]],
        ("e0", 1): [[[3, -0.009674947708845139], [5, -5.25]]],
    }
    run = write_bfcl_run(tmp_path / "a", "off", 1, eps, logprobs=lps)
    assert all(isinstance(getattr(r, "_raw", None), bytes) for r in run.requests)  # still undecoded: the batch path
    table = run.top2()
    for rec in run.requests:
        expect = np.asarray(json.loads(json.dumps(rec["top_logprobs"]))).reshape(-1, 4)
        assert np.array_equal(table[id(rec)], expect) and np.array_equal(margins.top2(run, rec), expect)
    odd = write_bfcl_run(tmp_path / "b", "off", 1, eps, logprobs={**lps, ("e0", 1): [[[3, -0.5]]]})
    by = {(r["episode_id"], r["request_index"]): margins.top2(odd, r) for r in odd.requests}
    assert len(odd.top2()) == 2 and by[("e0", 1)] is None and by[("e1", 0)][2].tolist() == [6, 0.0, 8, -14.5]
    assert np.isnan(margins.request_margins(odd.requests_by_episode()["e0"][1], odd)).all()


def test_ratio_intervals_share_resamples_and_match_the_one_column_interval():
    on = np.array([[10.0, 1.0], [20.0, 3.0], [30.0, 2.0], [45.0, 5.0]])
    off = np.array([[40.0, 2.0], [50.0, 2.0], [70.0, 4.0], [80.0, 6.0]])
    both = benefit.ratio_intervals(on, off)
    assert both[0] == pytest.approx(benefit.ratio_interval(on[:, 0], off[:, 0]))
    assert both[1] == pytest.approx(benefit.ratio_interval(on[:, 1], off[:, 1]))
    assert both[1][0] == pytest.approx(11 / 14)


def test_the_reports_tier_columns_come_from_the_engines_and_the_records(monkeypatch):
    """the tier columns were a fixed list, so a new engine's tier vanished from the report. They are the
    registered engines' declared `cache_tiers` now (a throwaway engine registered for the test, module and all), and
    a tier only the records name still gets its column."""
    import sys
    import types

    from artifact import engines
    from artifact.check.beyond import tier_columns
    from artifact.engines.base import Capabilities

    base = [t for t, _ in tier_columns()]
    assert base == ["none", "slot", "host", "slot_or_host", "blocks", "unknown"]
    module = types.ModuleType("throwaway_engine")
    module.ENGINE = types.SimpleNamespace(
        kind="throwaway",
        capabilities=Capabilities(
            per_request_cache_switch=False, cache_tiers=("gpu", "disk"), metrics_endpoint=None, image=None
        ),
    )
    monkeypatch.setitem(sys.modules, "throwaway_engine", module)
    monkeypatch.setitem(engines.REGISTRY, "throwaway", "throwaway_engine")
    cols = dict(tier_columns(["from_the_records"]))
    assert cols["gpu"] == "gpu (throwaway)" and cols["disk"] == "disk (throwaway)"
    assert cols["gpu_or_disk"] == "gpu or disk (throwaway)" and cols["from_the_records"] == "from_the_records"


def _scipy_ratio_intervals(on, off, confidence=0.95, n_resamples=benefit.N_RESAMPLES, seed=benefit.SEED):
    """scipy.stats.bootstrap's paired percentile interval of the ON/OFF mean ratios, as benefit first called it."""
    from scipy import stats

    def ratios(*cols, axis=-1):
        k = len(cols) // 2
        return np.stack([cols[j].mean(axis=axis) / cols[k + j].mean(axis=axis) for j in range(k)])

    with np.errstate(divide="ignore", invalid="ignore"):
        res = stats.bootstrap(
            tuple(on.T) + tuple(off.T),
            ratios,
            paired=True,
            vectorized=True,
            method="percentile",
            confidence_level=confidence,
            n_resamples=n_resamples,
            random_state=np.random.default_rng(seed),
        )
    return np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)


@pytest.mark.parametrize(
    "units, quantities, confidence, n_resamples, seed",
    [
        (2, 1, 0.95, 2999, 42),
        (3, 3, 0.95, 2999, 42),
        (7, 2, 0.9, 999, 1),
        (80, 3, 0.95, 2999, 42),
        (160, 3, 0.95, 2999, 42),
        (160, 3, 0.95, 2999, 42),
        (200, 4, 0.99, 500, 7),
        (641, 3, 0.95, 2999, 42),
    ],
)
def test_ratio_intervals_are_scipys_bootstrap_float_for_float(units, quantities, confidence, n_resamples, seed):
    """benefit computes scipy.stats.bootstrap's paired percentile interval itself (the same index draws, the same
    means and percentiles): the same floats as scipy's, so that a scipy upgrade that changes them shows here.
    Inputs: timings with many decimals, token counts, ties, an OFF column of zeros (inf/NaN ratios); the repeated
    case takes the kept draws."""
    rng = np.random.default_rng(units * 10 + quantities)
    on = rng.gamma(2.0, 150.0, (units, quantities))
    off = on * rng.uniform(0.5, 2.0, (units, quantities))
    on[:, 0] = np.round(on[:, 0])  # counts
    off[: units // 2, -1] = off[0, -1]  # ties
    if quantities > 2:
        off[:, 1] = 0.0
    lo, hi = _scipy_ratio_intervals(on, off, confidence, n_resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        mine = benefit._paired_percentile_bootstrap(on, off, confidence, n_resamples, seed)
    assert mine[0].tobytes() == lo.tobytes() and mine[1].tobytes() == hi.tobytes()
    got = benefit.ratio_intervals(on, off, confidence, n_resamples, seed)
    for j, (point, a, b) in enumerate(got):
        if not np.isnan(point):
            assert (a, b) == (float(lo[j]), float(hi[j]))


def _run_of(requests: list[dict], episodes: list[str]):
    from pathlib import Path

    from artifact.records.store import Run

    return Run(
        Path("/nonexistent"),
        {
            "config": "c",
            "plan": "main",
            "arm": "on",
            "run": 1,
            "episodes": episodes,
            "status": "complete",
            "wall_s": 12.5,
        },
        _requests=requests,
    )


def _costs_reference(run) -> dict:
    """run_costs' per-request formulas as first written."""
    reqs = [r for r in run.requests if r.get("error") is None]

    def total(key):
        return sum(float(r.get(key) or 0) for r in reqs)

    cached, prompt_tokens, prompt_ms = total("cache_n"), total("prompt_tokens"), total("prompt_ms")
    return {
        "requests": len(reqs),
        "prompt_tokens": int(prompt_tokens),
        "cached_tokens": int(cached),
        "evaluated_tokens": int(total("prompt_n")),
        "cached_share": cached / prompt_tokens if prompt_tokens else float("nan"),
        "prompt_ms": prompt_ms,
        "ttft_ms_mean": prompt_ms / len(reqs) if reqs else float("nan"),
        "predicted_ms": total("predicted_ms"),
    }


def _episode_sums_reference(run) -> dict:
    out = {}
    for eid, reqs in run.requests_by_episode().items():
        ok = [r for r in reqs if r.get("error") is None]
        out[eid] = [sum(float(r.get(f) or 0.0) for r in ok for f in fields) for fields in benefit.RATIO_FIELDS.values()]
    return out


def _same(a, b) -> bool:
    """Equal values of equal types; NaN equals NaN; -0.0 is not 0.0."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (math.isnan(a) and math.isnan(b)))
    return a == b


@pytest.mark.parametrize("errors", [False, True])
def test_run_costs_and_episode_sums_are_the_per_request_sums_float_for_float(errors):
    """The per-request sums benefit takes from lists built once per run: the floats (and types) of summing
    float(value or 0) request by request, for timings with many decimals, ints, nulls, zeros and -0.0, failed
    requests, requests out of order, an episode without requests and one the manifest does not list."""
    rng = np.random.default_rng(5)
    reqs = []
    for e in range(30):
        for i in rng.permutation(int(rng.integers(1, 12))).tolist():
            pt = int(rng.integers(50, 4000))
            cn = [None, 0, int(pt * 0.6)][int(rng.integers(3))]
            reqs.append(
                {
                    "episode_id": f"e{e}",
                    "request_index": i,
                    "prompt_tokens": pt,
                    "cache_n": cn,
                    "prompt_n": None if cn is None else pt - cn,
                    "prompt_ms": [None, 0, 0.0, -0.0, 17, float(rng.gamma(2, 80))][int(rng.integers(6))],
                    "predicted_ms": float(rng.gamma(2, 400)) if rng.random() < 0.9 else None,
                    "error": "timeout" if errors and rng.random() < 0.15 else None,
                }
            )
    reqs.append({**reqs[0], "episode_id": "unlisted"})
    run = _run_of(reqs, [f"e{e}" for e in range(31)])
    costs = benefit.run_costs(run)
    ref = _costs_reference(run)
    assert _same({k: costs[k] for k in ref}, ref)
    assert _same(benefit._episode_sums(run), _episode_sums_reference(run))
    served = [r for r in reqs if r["error"] is None][:3]
    for few in ([], served, [{**r, "prompt_ms": None, "predicted_ms": 0.0} for r in served]):
        run = _run_of(few, ["e0"])
        assert _same({k: benefit.run_costs(run)[k] for k in ref}, _costs_reference(run))
        assert _same(benefit._episode_sums(run), _episode_sums_reference(run))


def test_analyses_after_the_paper_tables_equal_those_without(tmp_path):
    """mitigation and tiers take the comparisons check's paper tables made (kept on the runs: `divergence.compared`;
    tiers either way round, `divergence.made_comparison`): the same tables and verdicts as comparing the runs afresh."""
    import pandas as pd

    from artifact.analysis import tables, tiers
    from artifact.analysis.divergence import made_comparison

    eps = {"e0": [[1], [2]], "e1": [[3]], "e2": [[4], [5]], "e3": [[6, 7]]}
    for k, changed in ((1, {}), (2, {"e2": [[4], [8]]}), (3, {"e3": [[6, 9]], "e0": [[1], [9]]})):
        write_bfcl_run(tmp_path, "off", k, eps)
        write_bfcl_run(tmp_path, "on", k, {**eps, "e0": [[1], [9]], **changed})

    def outputs(runs):
        costs = benefit.costs_frame(runs)
        rows = mitigation.plan_rows(runs, costs)
        frames, verdicts = tiers.analyse(runs)
        return rows, frames, [v.as_dict() for v in mitigation.fresh_verdicts(runs) + verdicts]

    fresh = outputs(find_runs(tmp_path))
    again = find_runs(tmp_path)
    tables.build_tables(again)
    assert any(made_comparison(a, b) is not None for a in again for b in again if a is not b)
    made = outputs(again)
    pd.testing.assert_frame_equal(made[0], fresh[0])
    for name in fresh[1]:
        pd.testing.assert_frame_equal(made[1][name], fresh[1][name])
    assert made[2] == fresh[2]
    s = fresh[1]["tiers.csv"]
    assert set(s["reference"]) == {"off run 1", "on run 1", "on run 2"} and (s["level"] == "episode").any()
    assert fresh[0]["on_rerun_diverged"].tolist() == [1]


def test_the_report_s_tier_rows_are_pandas_groupby_s():
    """The report's tier table (`_tier_rows`, one pass in Python) is what grouping tiers.csv by configuration, plan,
    run, reference and level gives (pandas' groupby, sorted, rows with a missing key left out, a tier listed twice
    in a group: its last row)."""
    import pandas as pd

    from artifact.check.beyond import _tier_rows, tier_columns

    rows = [
        ("b", "main", 2, "off run 1", "request", "host", 10, 3),
        ("a", "main", 1, "off run 1", "episode", "slot", 4, 1),
        ("a", "main", 1, "off run 1", "episode", "host", 5, 5),
        ("a", "main", 1, "off run 1", "episode", "host", 6, 0),
        ("a", "fresh", 1, None, "episode", "slot", 2, 1),
        ("a", "main", 1, "on run 1", "request", "none", 7, 2),
    ]
    df = pd.DataFrame(rows, columns=["config", "plan", "run", "reference", "level", "tier", "n", "differ"])
    df["rate"] = df["differ"] / df["n"]
    cols = tier_columns(df["tier"].unique())
    keys = ["config", "plan", "run", "reference", "level"]
    expected = []
    for key, g in df.groupby(keys, sort=True):
        cells = {r["tier"]: f"{int(r['differ'])}/{int(r['n'])} ({100 * r['rate']:.0f}%)" for r in g.to_dict("records")}
        expected.append({**dict(zip(keys, key)), "cells": [cells.get(t, "-") for t, _ in cols]})
    assert _tier_rows(df, cols) == expected
    assert len(expected) == 3
