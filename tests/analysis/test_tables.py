"""Tab. 2, Fig. 1, Fig. 2 and the diverging example on synthetic runs written through the real RunWriter.

Expected values are worked out by hand in the comments (Wilson closed form, bootstrap by enumeration of blocks,
Cochran-Armitage by hand); the run writer lives in synthetic_runs.py.
"""

from __future__ import annotations

import math

import pytest

from artifact.report.example import divergence_example, top2_margin
from artifact.analysis.tables import (
    QUANT_LEVELS,
    build_tables,
    exposure,
    quant_level,
    run_problems,
)
from artifact.records.store import RunWriter, load_run
from synthetic_runs import OFF, ON1, ON2, main_plan, trend_runs, write_bfcl_run


def test_tab2_rates_intervals_medians_accuracy_exposure(tmp_path):
    runs = main_plan(tmp_path, OFF, ON1, ON2, valid={"e0", "e1"})
    t = build_tables(runs, tmp_path)
    row = t.tab2.iloc[0]
    assert (row["off_rerun_k"], row["off_rerun_n"]) == (0, 4)
    assert (row["on_rerun_k"], row["on_rerun_n"]) == (1, 4)  # ON1 vs ON2 differ in e3 only
    assert (row["on_vs_off_k"], row["on_vs_off_n"]) == (2, 4)  # headline: ON run 1 vs OFF run 1
    assert row["on_vs_off_all_pairs"] == "run 1: 2/4; run 2: 3/4"
    # Wilson 2/4: centre (2 + z^2/2)/(4 + z^2) = 1/2; half-width z/(4 + z^2) * sqrt(1 + z^2/4)
    #   = 1.959964/7.841459 * sqrt(1.960365) = 0.249949 * 1.400130 = 0.349961
    assert row["on_vs_off_wilson_lo"] == pytest.approx(0.150039, abs=1e-5)
    assert row["on_vs_off_wilson_hi"] == pytest.approx(0.849961, abs=1e-5)
    # Bootstrap: flags e0..e3 = 1, 0, 1, 0; block length capped at n // 2 = 2; every block of 2 neighbours holds
    # exactly one 1, so every replicate mean is 2/4 and the interval is the point 0.5.
    assert (row["on_vs_off_boot_lo"], row["on_vs_off_boot_hi"]) == (0.5, 0.5)
    # Wilson 0/4: [0, z^2/(4 + z^2)] = [0, 3.841459/7.841459] = [0, 0.489891]
    assert row["off_rerun_wilson_lo"] == 0.0 and row["off_rerun_wilson_hi"] == pytest.approx(0.489891, abs=1e-5)
    # diverged (request, token), 0-based: e0 (1, 2), e2 (0, 4): request 1-based median (2 + 1)/2, token (2 + 4)/2
    assert row["median_first_request"] == 1.5 and row["median_first_token"] == 3.0
    # BFCL valid: e0, e1 in each of 2 runs per arm
    assert (row["valid_off"], row["episodes_off"]) == (4, 8)
    assert row["accuracy_on"] == 0.5
    # ON: per episode request 0 none cached, request 1 60 of 100 -> 60/200 = 0.3; OFF 0
    assert row["cached_share_on"] == pytest.approx(0.3) and row["cached_share_off"] == 0.0
    assert row["invalid"] is None and t.problems == []
    comps = t.comparisons
    assert list(comps["comparison"]) == ["off_rerun", "on_rerun", "on_vs_off", "on_vs_off"]
    assert list(comps["headline"]) == [True, True, True, False]


def test_paired_comparisons_are_the_papers_three_kinds(tmp_path):
    from artifact.analysis.divergence import paired_comparisons

    pairs = paired_comparisons(main_plan(tmp_path, OFF, ON1, ON2))
    assert [(p.kind, p.k, p.name) for p in pairs] == [
        ("off_rerun", 1, "OFF run 1 vs run 2"),
        ("on_rerun", 1, "ON run 1 vs run 2"),
        ("on_vs_off", 1, "ON run 1 vs OFF run 1"),
        ("on_vs_off", 2, "ON run 2 vs OFF run 2"),
    ]
    assert [p.cmp.k for p in pairs] == [0, 1, 2, 3]  # ON2 adds e3 to ON1's e0 and e2


def test_quantization_order_is_explicit():
    order = ["F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_1", "Q4_0", "Q3_K_M", "Q2_K"]
    ranks = [quant_level(q).rank for q in order]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert quant_level("bf16").rank == quant_level("F16").rank  # both 16-bit
    assert quant_level("q4_k") is quant_level("Q4_K_M") and quant_level("16-bit") is quant_level("F16")
    assert quant_level("IQ2_XS") is None and quant_level(None) is None
    # The one documented disagreement with bits per weight: legacy Q4_1 is larger than Q4_K_M but coarser.
    assert quant_level("Q4_1").bpw > quant_level("Q4_K_M").bpw and quant_level("Q4_1").rank > quant_level("Q4_K_M").rank
    # bpw from llama.cpp's Llama-3-8B sizes: Q8_0 7.96 GiB * 2^30 * 8 / 8.03e9 = 8.52
    assert quant_level("Q8_0").bpw == pytest.approx(7.96 * 2**30 * 8 / 8.03e9, abs=0.01)
    ppl = [q.ppl_increase for q in QUANT_LEVELS if q.ppl_increase is not None]
    assert ppl == sorted(ppl)  # the rank order is the order of llama.cpp's documented perplexity increase


def test_fig2_series_and_trend_hand_computed(tmp_path):
    t = build_tables(trend_runs(tmp_path, {"Q4_K_M": 70, "F16": 10, "Q8_0": 40}), tmp_path)
    assert list(t.fig2["level"]) == ["F16", "Q8_0", "Q4_K_M"]  # sorted finest -> coarsest
    tr = t.fig2_trend.iloc[0]
    assert tr["levels"] == "F16 < Q8_0 < Q4_K_M" and tr["n_levels"] == 3
    # p = 120/240 = 1/2; sum s (k - n p) = 0*(-30) + 1*0 + 2*30 = 60;
    # sum n s^2 - (sum n s)^2 / N = 80*5 - 240^2/240 = 160; z = 60 / sqrt(0.25 * 160) = 60 / sqrt(40)
    assert tr["z"] == pytest.approx(60 / math.sqrt(40), rel=1e-9)
    assert tr["p"] < 1e-15


def test_fig1_lists_the_conditions_that_ran(tmp_path):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    runs += [write_bfcl_run(tmp_path, "on", k, ON1, plan="cram0", cache_ram_mib=0) for k in (1, 2)]
    t = build_tables(runs, tmp_path)
    assert [(r["comparison"], r["plan"]) for _, r in t.fig1.iterrows()] == [
        ("off_rerun", "main"),
        ("on_rerun", "cram0"),
        ("on_rerun", "main"),
        ("on_vs_off", "main"),
    ]
    assert list(t.fig1["div_k"]) == [0, 0, 1, 2]


def test_divergence_example_text_tokens_and_margins(tmp_path):
    off = {"e0": [[5, 6], [10, 11, 12, 13]]}
    on = {"e0": [[5, 6], [10, 11, 14, 13]]}
    texts_on = {("e0", 1): "The answer is 43"}
    texts_off = {("e0", 1): "The answer is 42"}
    # at the flip (request 1, token 2): ON 14 (-0.70) over 12 (-0.75); OFF 12 (-0.60) over 14 (-1.00)
    lp_on = {
        ("e0", 1): [
            [[10, -0.01], [3, -5.0]],
            [[11, -0.02], [3, -4.0]],
            [[14, -0.70], [12, -0.75]],
            [[13, -0.1], [1, -3]],
        ]
    }
    lp_off = {
        ("e0", 1): [
            [[10, -0.01], [3, -5.0]],
            [[11, -0.02], [3, -4.0]],
            [[12, -0.60], [14, -1.00]],
            [[13, -0.1], [1, -3]],
        ]
    }
    runs = [
        write_bfcl_run(tmp_path, "off", 1, off, texts=texts_off, logprobs=lp_off),
        write_bfcl_run(tmp_path, "on", 1, on, texts=texts_on, logprobs=lp_on),
    ]
    ex = divergence_example(build_tables(runs, tmp_path).groups)
    assert (ex["episode_id"], ex["first_request"], ex["first_request_1based"], ex["first_token"]) == ("e0", 1, 2, 2)
    on_side, off_side = ex["sides"]
    assert on_side["arm"] == "ON" and off_side["arm"] == "OFF" and ex["same_prompt"]
    assert on_side["common"] == "The answer is 4" and on_side["rest"] == "3" and off_side["rest"] == "2"
    assert on_side["tokens"]["before"] == [10, 11] and on_side["tokens"]["at"] == 14 and off_side["tokens"]["at"] == 12
    assert on_side["margin"]["top1_id"] == 14 and on_side["margin"]["margin"] == pytest.approx(0.05)
    assert off_side["margin"]["top1_id"] == 12 and off_side["margin"]["margin"] == pytest.approx(0.40)


def test_top2_margin_edge_cases():
    assert top2_margin([], 0) is None and top2_margin([[[1, -0.1]]], 0) is None and top2_margin([[]], None) is None
    assert top2_margin([[[1, -1.0], [2, -0.25]]], 0)["top1_id"] == 2


def test_engine_without_cache_counts_is_not_reported_not_zero(tmp_path):
    runs = main_plan(tmp_path, OFF, ON1, ON2, engine="vllm", cache_n="null")
    assert exposure(runs[0]) is None and run_problems(runs[0]) == []
    row = build_tables(runs, tmp_path).tab2.iloc[0]
    assert not row["cache_reported_on"] and row["cached_share_on"] is None


def test_gsm8k_bridge_runs_are_not_bfcl_groups(tmp_path):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    d = tmp_path / "g" / "bridge" / "bridge-run1"
    w = RunWriter(d, {"config": "g", "plan": "bridge", "arm": "bridge", "run": 1, "episodes": [], "workload": "gsm8k"})
    w.finish()
    t = build_tables(runs + [load_run(d)], tmp_path)
    assert [(g.config, g.plan) for g in t.groups] == [("cfg", "main")] and len(t.runs) == 5


def test_divergence_example_falls_back_to_a_rerun(tmp_path):
    off2 = {**OFF, "e2": [[1, 2, 3, 4, 5], [6, 7, 0]]}  # only the OFF rerun diverges: e2, request 1, token 2
    runs = [write_bfcl_run(tmp_path, "off", 1, OFF), write_bfcl_run(tmp_path, "off", 2, off2)]
    ex = divergence_example(build_tables(runs, tmp_path).groups)
    assert ex["kind"] == "off_rerun" and (ex["episode_id"], ex["first_request"], ex["first_token"]) == ("e2", 1, 2)
    assert [s["label"] for s in ex["sides"]] == ["cfg/main/off-run1", "cfg/main/off-run2"]
    assert divergence_example(build_tables(runs[:1], tmp_path).groups) is None
