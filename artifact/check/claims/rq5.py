"""RQ5: GSM8K answers flip both ways without a significant accuracy shift (McNemar p > 0.05); each path is
internally deterministic."""

from __future__ import annotations

import pandas as pd

from artifact.analysis.stats import mcnemar_exact, mcnemar_power
from artifact.check.core import (
    ALPHA, FAIL, INCONCLUSIVE, INVALID, MIN_POWER, NOT_RUN, PASS, Claim, Context, fmt_p, make_claim, Paper, pct,
    power_note, Verdict,
)
from artifact.workloads.gsm8k.table import NET_SHIFT

ID = "RQ5"
RULE = {
    "statement": "GSM8K answers flip both ways without a significant accuracy shift (McNemar p > 0.05); each "
                 "path is internally deterministic.",
    "hard": False,
    "rule": "From Tab. 3 (GSM8K bridge; answers re-scored numerically from the stored text). Per "
            "configuration: both paths internally deterministic (cold1 = cold2 and warm1 = warm2 token ids on "
            "every counted item) and exact McNemar p > 0.05 on its cache/recompute flips; FAIL if a path is "
            "not deterministic or p <= 0.05. Pooled over the judged configurations: FAIL if McNemar p <= 0.05; "
            "INCONCLUSIVE if the exact McNemar power to detect a 1 pp net accuracy shift, at the observed "
            "discordant rate (at least 1 pp), is below 0.80 (a 'no shift' on a handful of items is vacuous; the "
            "paper's 1300 items give 0.81); otherwise PASS if flips go both ways (>= 1 each way), FAIL if not. "
            "A configuration with more than 10% of its servings flagged (cache check failed, request failed or "
            "missing) cannot be judged: its counted items are a selection; INCONCLUSIVE, left out of the "
            "pooled test. NOT-RUN without bridge runs, and NOT-RUN when only synthetic items ran: the "
            "artifact's generated arithmetic problems are not GSM8K (their difficulty and answer forms set the "
            "accuracy and the flip count), so they exercise the pipeline but are no evidence for or against "
            "the paper's GSM8K result; their numbers are shown as observed values. Tab. 3's per-quantization "
            "rates get no band: the summary does not name their model or engine.",
    "minimum_evidence": "<= 10% flagged servings per configuration; pooled power >= 0.80 to detect a 1 pp net "
                        "shift (about 800 or more items).",
}


RQ5_MAX_FLAGGED = 0.10  # above this share of flagged servings a GSM8K configuration cannot be judged


TAB3_COLUMNS = ("config", "status", "data", "n", "items", "cold_identical", "warm_identical",
                "flips_numeric_cache", "flips_numeric_recompute", "mcnemar_p", "flagged_servings")


SERVINGS_PER_ITEM = 4


def pooled_power(n: int, flips: int) -> float | None:
    """Exact McNemar power to detect a 1 pp net shift over n items at the observed discordant rate (at least 1 pp,
    the smallest rate at which such a shift is possible)."""
    if not n:
        return None
    return mcnemar_power(n, min(1.0, max(flips / n, NET_SHIFT)), NET_SHIFT)


def rq5(tab3: pd.DataFrame | None, paper: Paper, invalid_configs: dict[str, list[str]] | None = None) -> Claim:
    flips = [paper.value(k) for k in ("gsm8k_flips", "gsm8k_flips_favor_cache", "gsm8k_flips_favor_recompute",
                                      "gsm8k_mcnemar_p")]
    expected = (f"{flips[0]['value']} flips, {flips[1]['value']} favour cache vs {flips[2]['value']} recompute, "
                f"McNemar p = {flips[3]['value']}; cold 200/200, warm 200/200 per configuration (§IV-F, Tab. 3)"
                if all(flips) else "flips both ways, McNemar p > 0.05, paths deterministic")
    band = (f"p > 0.05, >= 1 flip each way, internal identity n/n; <= {RQ5_MAX_FLAGGED:.0%} flagged servings; "
            f"pooled power >= {MIN_POWER} for a 1 pp shift")
    invalid_configs = invalid_configs or {}
    if tab3 is None or tab3.empty:
        return make_claim(ID, RULE, [], "no GSM8K bridge runs", expected, band,
                      ["no run with workload = gsm8k and arm = bridge in these results"], NOT_RUN)
    missing = [c for c in TAB3_COLUMNS if c not in tab3.columns]
    if missing:
        return make_claim(ID, RULE, [], "Tab. 3 could not be read", expected, band,
                      [f"Tab. 3 lacks column(s) {', '.join(missing)}"], NOT_RUN)
    rows = tab3[(tab3["config"] != "pooled") & (tab3["status"] == "complete")]
    details, judged = [], []
    for _, r in rows.iterrows():
        n, items = int(r["n"]), int(r["items"])
        b, c = int(r["flips_numeric_cache"]), int(r["flips_numeric_recompute"])
        flagged = int(r["flagged_servings"])
        share = flagged / (SERVINGS_PER_ITEM * items) if items else 1.0
        obs = (f"cold {int(r['cold_identical'])}/{n}, warm {int(r['warm_identical'])}/{n} identical; flips "
               f"{b} cache / {c} recompute, McNemar p = {fmt_p(r['mcnemar_p'])}; flagged servings {flagged} "
               f"({pct(share)})")
        if r["data"] != "gsm8k":
            details.append(Verdict.of_claim(ID, str(r["config"]), "direction", NOT_RUN, f"{r['data']} items: {obs}",
                                   expected, band, [f"data = {r['data']}: items generated by this artifact, not "
                                                    "GSM8K; no evidence for or against the paper's GSM8K result"]))
            continue
        reasons, status = [], None
        if str(r["config"]) in invalid_configs:
            status, reasons = INVALID, invalid_configs[str(r["config"])]
        else:
            if int(r["cold_identical"]) != n or int(r["warm_identical"]) != n:
                reasons.append("a path is not internally deterministic")
            if not r["mcnemar_p"] > ALPHA:
                reasons.append(f"McNemar p = {fmt_p(r['mcnemar_p'])} <= {ALPHA}")
            if reasons:
                status = FAIL
                judged.append((n, b, c, str(r["config"])))
            elif share > RQ5_MAX_FLAGGED or not n:
                status = INCONCLUSIVE
                reasons = [f"{pct(share)} of servings flagged (more than {RQ5_MAX_FLAGGED:.0%}): the counted items "
                           "are a selection; this configuration cannot be judged"]
            else:
                status = PASS
                judged.append((n, b, c, str(r["config"])))
        details.append(Verdict.of_claim(ID, str(r["config"]), "direction", status, obs,
                               "cold n/n, warm n/n identical; p > 0.05", band,
                               reasons or [f"Tab. 3 row {r['config']} (data = gsm8k)"]))
    real = rows[rows["data"] == "gsm8k"]
    if judged:
        n = sum(j[0] for j in judged)
        b, c = sum(j[1] for j in judged), sum(j[2] for j in judged)
        p = mcnemar_exact(b, c)
        power = pooled_power(n, b + c)
        if not p > ALPHA:
            status, reasons = FAIL, [f"McNemar p = {fmt_p(p)} <= {ALPHA}: a significant accuracy shift"]
        elif power is None or power < MIN_POWER:
            status, reasons = INCONCLUSIVE, [
                f"{power_note(power)} to detect a 1 pp net accuracy shift over {n} items (below {MIN_POWER}): "
                "'no significant shift' on so few items is no evidence"]
        elif not (b and c):
            status, reasons = FAIL, ["flips do not go both ways"]
        else:
            status, reasons = PASS, [f"sum over Tab. 3 rows {', '.join(j[3] for j in judged)}"]
        details.append(Verdict.of_claim(ID, f"pooled over {len(judged)} GSM8K configuration(s)", "pooled", status,
                               f"{n} items, {b + c} flips: {b} cache / {c} recompute, McNemar p = {fmt_p(p)}, "
                               f"{power_note(power)} for a 1 pp shift", expected, band, reasons))
        status = None
    elif len(real):
        status = None  # the per-configuration verdicts (FAIL, INVALID or INCONCLUSIVE) decide
    else:
        status = NOT_RUN
    observed = "; ".join(f"{d.scope}: {d.observed}" for d in details) or "no complete bridge runs"
    ev = [f"{d.scope}: {d.status}" for d in details]
    if status == NOT_RUN:
        ev = [f"only synthetic items ran (data = {', '.join(sorted(set(map(str, rows['data'])))) or 'none'}): "
              "the claim is about GSM8K; rerun the bridge with workload.gsm8k_source = \"hub\""] + ev
    return make_claim(ID, RULE, details, observed, expected, band, ev, status)


def judge(ctx: Context) -> Claim:
    """Tab. 3 is the GSM8K workload's own table; bridge runs that cannot be used make their rows invalid."""
    tab3 = ctx.workload_tables.get("gsm8k", {}).get("tab3.csv")
    invalid_configs: dict[str, list[str]] = {}
    runs = ctx.tables.runs
    if not runs.empty and "problems" in runs.columns:
        for _, r in runs[(runs["arm"] == "bridge") & runs["problems"].notna()].iterrows():
            invalid_configs.setdefault(str(r["config"]), []).append(str(r["problems"]))
    return rq5(tab3, ctx.paper, invalid_configs)
