"""Tab. 3 (GSM8K bridge) on bridge runs written with the real RunWriter; expected values computed by hand."""

from __future__ import annotations

import hashlib
import math

import pytest

from artifact.workloads.gsm8k.table import counts, serving_problem, tab3, tab3_row
from artifact.records.store import RunWriter, load_run
from artifact.workloads.gsm8k.prompts import SERVINGS, cache_check

PROMPT_TOKENS = 50
OK_10 = "10 - 3 = 7 so ...\nAnswer: 10"  # strict and numeric correct for reference 10
LOOSE_10 = "So the answer is 10."  # numeric correct, strict wrong (format)
WRONG_7 = "Answer: 7"
WRONG_3 = "Answer: 3"


def serve(tokens, text, **over) -> dict:
    return {"tokens": tokens, "text": text, **over}


def write_bridge(root, config: str, items: dict, *, data: str = "synthetic", complete: bool = True):
    """A bridge run: `items[item_id] = (reference, {serving: serve(...)})`, records as the runner writes them."""
    d = root / config / "bridge" / "bridge-run1"
    w = RunWriter(
        d,
        {
            "config": config,
            "plan": "bridge",
            "arm": "bridge",
            "run": 1,
            "session": "bridge",
            "episodes": list(items),
            "workload": "gsm8k",
            "lifecycle": "shared",
            "engine": "llama.cpp",
            "model": {"name": "TestLM", "quant": "Q8_0"},
            "data": data,
            "items_provenance": {"synthetic": data == "synthetic"},
            "fingerprint": "x",
        },
    )
    for item_id, (ref, servings) in items.items():
        for index, (name, cache_prompt) in enumerate(SERVINGS):
            s = servings[name]
            cache_n = s.get("cache_n", PROMPT_TOKENS - 1 if cache_prompt else 0)
            error = s.get("error")
            record = {
                "episode_id": item_id,
                "item_id": item_id,
                "serving": name,
                "turn": 0,
                "step": 0,
                "request_index": index,
                "prompt_sha256": hashlib.sha256(item_id.encode()).hexdigest(),
                "prompt_tokens": PROMPT_TOKENS,
                "output_tokens": s["tokens"],
                "output_text": s["text"],
                "top_logprobs": [None] * len(s["tokens"]),
                "cache_n": cache_n,
                "prompt_n": PROMPT_TOKENS - cache_n,
                "prompt_ms": 1.0,
                "predicted_ms": 1.0,
                "stop_type": s.get("stop_type", "eos"),
                "n_predict": 64,
                "error": error,
            }
            record["cache_check"] = s.get("cache_check") or (
                f"request failed: {error}" if error else cache_check(name, cache_n, PROMPT_TOKENS)
            )
            w.request(record)
        w.episode({"episode_id": item_id, "item_id": item_id, "reference": ref, "n_requests": 4})
    if complete:
        w.finish(wall_s=1.0)
    else:
        w.close()
    return load_run(d)


def same(tokens, text, **over) -> dict:
    return {s: serve(tokens, text, **over) for s, _ in SERVINGS}


def run_a(root, **kw):
    """Seven items, reference 10; i5 and i6 flagged. Hand counts in test_row_a."""
    return write_bridge(
        root,
        "cfg-a",
        {
            # all four identical, correct under both scorers; warm1 hit the n_predict limit
            "i0": ("10", {**same([1, 2, 3], OK_10), "warm1": serve([1, 2, 3], OK_10, stop_type="limit")}),
            # cold/warm diverge; warm drops the demanded format: a strict-only flip towards recompute
            "i1": (
                "10",
                {
                    "cold1": serve([1, 2], OK_10),
                    "cold2": serve([1, 2], OK_10),
                    "warm1": serve([1, 3], LOOSE_10),
                    "warm2": serve([1, 3], LOOSE_10),
                },
            ),
            # cold wrong, warm right: a flip towards the cache path under both scorers
            "i2": (
                "10",
                {
                    "cold1": serve([4], WRONG_7),
                    "cold2": serve([4], WRONG_7),
                    "warm1": serve([5], OK_10),
                    "warm2": serve([5], OK_10),
                },
            ),
            # cold right, warm wrong (and warm1 != warm2): a flip towards recompute under both scorers
            "i3": (
                "10",
                {
                    "cold1": serve([6], OK_10),
                    "cold2": serve([6], OK_10),
                    "warm1": serve([7], WRONG_3),
                    "warm2": serve([8], WRONG_3),
                },
            ),
            # cold1 != cold2 (tokens), warm equal to cold1: no cold/warm divergence
            "i4": (
                "10",
                {
                    "cold1": serve([9], OK_10),
                    "cold2": serve([10], OK_10),
                    "warm1": serve([9], OK_10),
                    "warm2": serve([9], OK_10),
                },
            ),
            # warm1 missed the cache (cache_n 0) though its record claims "ok": flagged, item left out
            "i5": (
                "10",
                {
                    "cold1": serve([11], OK_10, stop_type="limit"),
                    "cold2": serve([11], OK_10),
                    "warm1": serve([12], WRONG_3, cache_n=0, cache_check="ok"),
                    "warm2": serve([12], WRONG_3),
                },
            ),
            # cold1 read 5 cached tokens and warm2 failed: two flagged servings, item left out
            "i6": (
                "10",
                {
                    "cold1": serve([13], OK_10, cache_n=5),
                    "cold2": serve([13], OK_10),
                    "warm1": serve([14], WRONG_3),
                    "warm2": serve([], "", error="HTTP 500: boom"),
                },
            ),
        },
        **kw,
    )


def run_b(root, **kw):
    """Three items, every serving identical and correct, real-GSM8K label."""
    return write_bridge(
        root, "cfg-b", {f"g{i}": (str(i), same([i], f"Answer: {i}")) for i in range(3)}, data="gsm8k", **kw
    )


def test_serving_problem_rechecks_cache_use():
    assert serving_problem(None) == "missing"
    rec = {"serving": "warm1", "cache_n": 48, "prompt_tokens": 50, "cache_check": "ok", "error": None}
    assert "warm serving read 48 of 50" in serving_problem(rec)
    assert serving_problem({**rec, "cache_n": 49}) is None
    assert serving_problem({**rec, "serving": "cold2", "cache_n": 0}) is None
    assert "cold serving read 1" in serving_problem({**rec, "serving": "cold1", "cache_n": 1})
    assert serving_problem({**rec, "cache_n": 49, "error": "x"}) == "request failed: x"


def test_row_a(tmp_path):
    row = tab3_row(run_a(tmp_path))
    assert (row["config"], row["data"], row["model"], row["quant"], row["status"]) == (
        "cfg-a",
        "synthetic",
        "TestLM",
        "Q8_0",
        "complete",
    )
    assert (row["items"], row["N"], row["flagged_items"], row["flagged_servings"]) == (7, 5, 2, 3)
    # every identity column reads "identical k/N": cold 1 = cold 2, warm 1 = warm 2, cold 1 = warm 1 (3 of 5 diverge)
    assert (row["identical_cold1_cold2"], row["identical_warm1_warm2"], row["identical_cold1_warm1"]) == (
        "4/5",
        "4/5",
        "2/5",
    )
    assert row["divergence_cold1_warm1"] == pytest.approx(0.6) and row["cold_warm_diverged"] == 3
    assert (row["acc_cold_strict"], row["acc_warm_strict"]) == (pytest.approx(0.8), pytest.approx(0.6))
    assert (row["acc_cold_numeric"], row["acc_warm_numeric"]) == (pytest.approx(0.8), pytest.approx(0.8))
    assert (row["flips_strict"], row["flips_strict_cache"], row["flips_strict_recompute"]) == (3, 1, 2)
    assert (row["flips_numeric"], row["flips_numeric_cache"], row["flips_numeric_recompute"]) == (2, 1, 1)
    assert row["flip_inflation"] == pytest.approx(1.5)
    assert row["mcnemar_p"] == pytest.approx(1.0)  # b = c = 1
    assert row["discordant_rate"] == pytest.approx(0.4)
    # n = 5: even d = 5 discordant pairs all one way give p = 2/32 > 0.05, so the test can never reject
    assert row["power_1pp"] == pytest.approx(0.0, abs=1e-12)
    assert row["truncated"] == 1  # i0 warm1; i5 (flagged) does not count


def test_row_without_flips(tmp_path):
    row = tab3_row(run_b(tmp_path))
    assert (row["N"], row["identical_cold1_cold2"], row["identical_warm1_warm2"], row["identical_cold1_warm1"]) == (
        3,
        "3/3",
        "3/3",
        "3/3",
    )
    assert row["data"] == "gsm8k" and row["flagged_servings"] == 0
    assert row["acc_cold_strict"] == row["acc_warm_numeric"] == pytest.approx(1.0)
    assert (row["flips_strict"], row["flips_numeric"], row["mcnemar_p"]) == (0, 0, 1.0)
    assert row["flip_inflation"] is None  # no numeric flips to inflate
    assert row["power_1pp"] is None  # discordant rate 0 < 1 pp: a 1 pp net shift is impossible


def test_tab3_rows_and_pooled(tmp_path, make_run):
    a, b = run_a(tmp_path), run_b(tmp_path)
    bfcl_run = make_run("off", 1, {"e0": [[1]]})  # not a bridge run: ignored
    unfinished = write_bridge(tmp_path, "cfg-c", {"x0": ("1", same([1], WRONG_3))}, complete=False)
    df = tab3([b, bfcl_run, unfinished, a])
    assert list(df["config"]) == ["cfg-a", "cfg-b", "cfg-c", "pooled"]
    assert list(df["status"]) == ["complete", "complete", "incomplete", "2 runs"]
    pooled = df.iloc[-1].to_dict()
    assert pooled["data"] == "mixed"
    assert (pooled["N"], pooled["items"], pooled["flagged_items"], pooled["flagged_servings"]) == (8, 10, 2, 3)
    assert (pooled["identical_cold1_cold2"], pooled["identical_warm1_warm2"], pooled["identical_cold1_warm1"]) == (
        "7/8",
        "7/8",
        "5/8",
    )
    assert pooled["acc_cold_strict"] == pytest.approx(7 / 8) and pooled["acc_warm_strict"] == pytest.approx(6 / 8)
    assert pooled["acc_cold_numeric"] == pytest.approx(7 / 8) and pooled["acc_warm_numeric"] == pytest.approx(7 / 8)
    assert (pooled["flips_strict"], pooled["flips_numeric"]) == (3, 2)
    assert pooled["flip_inflation"] == pytest.approx(1.5) and pooled["mcnemar_p"] == pytest.approx(1.0)
    # Power by hand: n = 8, discordant rate r = 2/8, a discordant pair favours one arm with p = (r + .01) / 2r
    # = 0.52. The exact test at 0.05 rejects only at b = 0 or b = d, and only for d >= 6 (2 / 2^6 < .05).
    r, p = 0.25, 0.52
    power = sum(math.comb(8, d) * r**d * (1 - r) ** (8 - d) * (p**d + (1 - p) ** d) for d in (6, 7, 8))
    assert pooled["power_1pp"] == pytest.approx(power, rel=1e-9)


def test_pooled_data_label_and_counts_additive(tmp_path):
    a = run_a(tmp_path)
    df = tab3([a])
    assert list(df["data"]) == ["synthetic", "synthetic"]
    assert (
        df.iloc[0].drop(["config", "plan", "run", "status", "engine", "model", "quant"]).to_dict()
        == df.iloc[1].drop(["config", "plan", "run", "status", "engine", "model", "quant"]).to_dict()
    )
    assert counts(a)["n"] == 5
