"""Tab. 3: the GSM8K bridge per configuration, plus a pooled row.

Per run of the bridge (arm "bridge", workload "gsm8k"), from its records:
  * identity, in three columns of the same form "identical k/N" (items whose two servings generated the same token
    ids): identical_cold1_cold2 and identical_warm1_warm2 (each path against itself), identical_cold1_warm1 (the
    recompute path against the cache path);
  * divergence_cold1_warm1: the share of items whose cold1 and warm1 token ids differ (the paper's Tab. 3 rate);
  * accuracy of the recompute path (cold1) and the cache path (warm1), under the strict and the numeric scorer;
  * answer flips: items correct on one path only, split by direction (cache = correct on warm1 only,
    recompute = correct on cold1 only), under both scorers, and the strict/numeric flip inflation;
  * exact McNemar p on the numeric flips, and the power to detect a 1 pp net accuracy shift at the observed
    discordant rate (None when that rate is below 1 pp: such a shift is then impossible), and how many items would
    give that test a power of 0.80 at the same rate (items_for_power_1pp);
  * flagged servings (cache check failed, request error or missing) and `data` (synthetic or gsm8k).

Answers are re-scored here from the stored response text (`requests.jsonl`), with the reference stored per item in
`episodes.jsonl`, so a scorer fix applies to old runs. Items with any flagged serving are left out of every count
above (so all columns are over the same N items) and counted in `flagged_items`; nothing flagged is counted as a
cold or warm observation.
"""

from __future__ import annotations

import pandas as pd

from artifact.workloads.gsm8k.scoring import answer_flips, score_numeric, score_strict
from artifact.analysis.stats import mcnemar_exact, mcnemar_items_for_power, mcnemar_power
from artifact.records.store import Run
from artifact.analysis.fmt import missing, num, pct, records
from artifact.workloads.gsm8k.prompts import NET_SHIFT, SERVINGS, cache_check  # NET_SHIFT: the power's 1 pp shift
from artifact.workloads.gsm8k.records import item_sources

COUNT_KEYS = (
    "items",
    "n",
    "flagged_items",
    "flagged_servings",
    "truncated",
    "cold_identical",
    "warm_identical",
    "cold_warm_diverged",
    "cold_strict_correct",
    "warm_strict_correct",
    "cold_numeric_correct",
    "warm_numeric_correct",
    "flips_strict_recompute",
    "flips_strict_cache",
    "flips_numeric_recompute",
    "flips_numeric_cache",
)
_SERVING_NAMES = tuple(s for s, _ in SERVINGS)


def is_bridge_run(run: Run) -> bool:
    return run.manifest.get("workload") == "gsm8k" and run.manifest.get("arm") == "bridge"


def serving_problem(record: dict | None) -> str | None:
    """Why a serving cannot be counted (None if it can): missing, failed, or cache use not as its path demands."""
    if record is None:
        return "missing"
    if record.get("error") is not None:
        return f"request failed: {record['error']}"
    if record.get("cache_check", "ok") != "ok":
        return record["cache_check"]
    check = cache_check(record["serving"], record["cache_n"], record["prompt_tokens"])
    return None if check == "ok" else check


def _data(run: Run) -> str:
    """Where the items came from, as each item's own record says ("mixed" if they differ); the manifest's label for
    records whose items do not name their source (check refuses a label that contradicts the items: records.py)."""
    own = item_sources(run)
    if own:
        return own.pop() if len(own) == 1 else "mixed"
    prov = run.manifest.get("items_provenance") or {}
    if "synthetic" in prov:
        return "synthetic" if prov["synthetic"] else "gsm8k"
    return run.manifest.get("data", "unknown")


def counts(run: Run) -> dict:
    """The additive counts behind one run's row (summed over runs for the pooled row)."""
    refs = {e["item_id"]: e["reference"] for e in run.episodes}
    by_item: dict[str, dict[str, dict]] = {i: {} for i in run.manifest["episodes"]}
    for r in run.requests:
        by_item.setdefault(r["item_id"], {})[r["serving"]] = r
    c = dict.fromkeys(COUNT_KEYS, 0)
    cold_s, warm_s, cold_n, warm_n = [], [], [], []
    for item_id, servings in by_item.items():
        c["items"] += 1
        problems = [p for p in (serving_problem(servings.get(s)) for s in _SERVING_NAMES) if p is not None]
        if item_id not in refs:
            problems.append("no reference")
        c["flagged_servings"] += sum(1 for s in _SERVING_NAMES if serving_problem(servings.get(s)) is not None)
        if problems:
            c["flagged_items"] += 1
            continue
        c["n"] += 1
        tok = {s: servings[s]["output_tokens"] for s in _SERVING_NAMES}
        c["cold_identical"] += tok["cold1"] == tok["cold2"]
        c["warm_identical"] += tok["warm1"] == tok["warm2"]
        c["cold_warm_diverged"] += tok["cold1"] != tok["warm1"]
        c["truncated"] += sum(servings[s].get("stop_type") == "limit" for s in ("cold1", "warm1"))
        ref = refs[item_id]
        cold_s.append(score_strict(servings["cold1"]["output_text"], ref).correct)
        warm_s.append(score_strict(servings["warm1"]["output_text"], ref).correct)
        cold_n.append(score_numeric(servings["cold1"]["output_text"], ref).correct)
        warm_n.append(score_numeric(servings["warm1"]["output_text"], ref).correct)
    c["cold_strict_correct"], c["warm_strict_correct"] = sum(cold_s), sum(warm_s)
    c["cold_numeric_correct"], c["warm_numeric_correct"] = sum(cold_n), sum(warm_n)
    c["flips_strict_recompute"], c["flips_strict_cache"] = answer_flips(cold_s, warm_s)
    c["flips_numeric_recompute"], c["flips_numeric_cache"] = answer_flips(cold_n, warm_n)
    return c


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def _row(c: dict) -> dict:
    n = c["n"]
    flips_strict = c["flips_strict_recompute"] + c["flips_strict_cache"]
    flips_numeric = c["flips_numeric_recompute"] + c["flips_numeric_cache"]
    discordant = _rate(flips_numeric, n)
    power = need = None
    if discordant is not None and discordant >= NET_SHIFT:
        power = mcnemar_power(n, discordant, NET_SHIFT)
        need = mcnemar_items_for_power(discordant, NET_SHIFT)  # items for power 0.80 at this discordant rate
    return {
        "N": n,
        # identity columns all count items whose two servings generated the same token ids, k/N
        "identical_cold1_cold2": f"{c['cold_identical']}/{n}",
        "identical_warm1_warm2": f"{c['warm_identical']}/{n}",
        "identical_cold1_warm1": f"{n - c['cold_warm_diverged']}/{n}",
        "divergence_cold1_warm1": _rate(c["cold_warm_diverged"], n),  # the paper's Tab. 3 rate: diverged share
        "acc_cold_strict": _rate(c["cold_strict_correct"], n),
        "acc_warm_strict": _rate(c["warm_strict_correct"], n),
        "acc_cold_numeric": _rate(c["cold_numeric_correct"], n),
        "acc_warm_numeric": _rate(c["warm_numeric_correct"], n),
        "flips_strict": flips_strict,
        "flips_strict_cache": c["flips_strict_cache"],
        "flips_strict_recompute": c["flips_strict_recompute"],
        "flips_numeric": flips_numeric,
        "flips_numeric_cache": c["flips_numeric_cache"],
        "flips_numeric_recompute": c["flips_numeric_recompute"],
        "flip_inflation": flips_strict / flips_numeric if flips_numeric else None,
        "mcnemar_p": mcnemar_exact(c["flips_numeric_recompute"], c["flips_numeric_cache"]),
        "discordant_rate": discordant,
        "power_1pp": power,
        "items_for_power_1pp": need,
        **c,
    }


def tab3_row(run: Run) -> dict:
    """One configuration's Tab. 3 row from its bridge run."""
    m = run.manifest
    model = m.get("model") or {}
    meta = {
        "config": m["config"],
        "plan": m["plan"],
        "run": m["run"],
        "status": m.get("status"),
        "engine": m.get("engine"),
        "model": model.get("name"),
        "quant": model.get("quant"),
        "data": _data(run),
    }
    return {**meta, **_row(counts(run))}


def tab3(runs: list[Run]) -> pd.DataFrame:
    """Tab. 3: a row per bridge run (one per configuration), then a pooled row over the complete ones.

    Runs that are not bridge runs are ignored. Incomplete runs get a row (status "incomplete") but are not pooled.
    The pooled row's `data` is the common value, or "mixed".
    """
    bridge = sorted(
        (r for r in runs if is_bridge_run(r)),
        key=lambda r: (r.manifest["config"], r.manifest["plan"], r.manifest["run"]),
    )
    rows = [tab3_row(r) for r in bridge]
    pooled_runs = [r for r in bridge if r.complete]
    if pooled_runs:
        per_run = [counts(r) for r in pooled_runs]
        total = {k: sum(c[k] for c in per_run) for k in COUNT_KEYS}
        data = {_data(r) for r in pooled_runs}
        rows.append(
            {
                "config": "pooled",
                "plan": "",
                "run": None,
                "status": f"{len(pooled_runs)} runs",
                "engine": "",
                "model": "",
                "quant": "",
                "data": data.pop() if len(data) == 1 else "mixed",
                **_row(total),
            }
        )
    df = pd.DataFrame(rows)
    if not df.empty:
        df["run"] = df["run"].astype("Int64")  # the pooled row has none
        df["items_for_power_1pp"] = df["items_for_power_1pp"].astype("Int64")  # a count, or none where no power
    return df


# --- its section of report.html (tab3.html.j2) ----------------------------------------------------------------

TAB3_DISPLAY = (  # (column, heading, kind)
    ("config", "Configuration", "text"),
    ("quant", "Quant", "text"),
    ("data", "Data", "text"),
    ("N", "N", "text"),
    ("identical_cold1_cold2", "Identical: cold 1 = cold 2", "text"),
    ("identical_warm1_warm2", "Identical: warm 1 = warm 2", "text"),
    ("identical_cold1_warm1", "Identical: cold 1 = warm 1", "text"),
    ("divergence_cold1_warm1", "Diverged: cold 1 vs warm 1", "pct"),
    ("paper_cold_vs_warm", "Paper, Tab. 3: diverged", "pct"),  # added by check beside rows of GSM8K items
    ("acc_cold_numeric", "Accuracy recompute", "pct"),
    ("acc_warm_numeric", "Accuracy cache", "pct"),
    ("flips_numeric_cache", "Flips to cache", "text"),
    ("flips_numeric_recompute", "Flips to recompute", "text"),
    ("mcnemar_p", "McNemar p", "num"),
    ("power_1pp", "Power (1 pp)", "num"),
    ("flips_strict", "Flips (strict scorer)", "text"),
    ("flagged_servings", "Flagged servings", "text"),
)


def report_rows(tab3: pd.DataFrame | None) -> dict:
    if tab3 is None or tab3.empty:
        return {"head": [], "rows": []}
    cols = [c for c in TAB3_DISPLAY if c[0] in tab3.columns]
    fmt = {"pct": pct, "num": num, "text": lambda v: "-" if missing(v) else str(v)}
    return {
        "head": [h for _, h, _ in cols],
        "rows": [[fmt[kind](r.get(c)) for c, _, kind in cols] for r in records(tab3)],
    }
