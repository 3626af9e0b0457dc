"""RQ5: GSM8K answers flip both ways without a significant accuracy shift (McNemar p > 0.05); each path is
internally deterministic.

The claim reads the table of a cache-bridge workload (`Workload.cache_bridge`: the GSM8K workload's Tab. 3), never a
workload by name; which of its rows are the paper's data, the servings per item and the power's net shift are the
workload's."""

from __future__ import annotations

from typing import Any

import pandas as pd

from artifact.analysis.stats import mcnemar_exact, mcnemar_items_for_power, mcnemar_power
from artifact.check.core import (
    ALPHA,
    FAIL,
    INCONCLUSIVE,
    INVALID,
    MIN_POWER,
    NOT_RUN,
    PASS,
    Claim,
    Context,
    fmt_p,
    make_claim,
    Paper,
    pct,
    power_note,
    Verdict,
)
from artifact.check.rules import rule, text
from artifact.workloads import cache_bridges
from artifact.workloads.base import CacheBridge

ID = "RQ5"
RULE = rule(ID)  # statement, hard, rule, minimum_evidence: claims/rules.toml
TEXT = text(ID)


RQ5_MAX_FLAGGED = 0.10  # above this share of flagged servings a configuration cannot be judged


TAB3_COLUMNS = (
    "config",
    "status",
    "data",
    "n",
    "items",
    "cold_identical",
    "warm_identical",
    "flips_numeric_cache",
    "flips_numeric_recompute",
    "mcnemar_p",
    "flagged_servings",
)


def pooled_power(n: int, flips: int, net_shift: float) -> float | None:
    """Exact McNemar power to detect a 1 pp net shift over n items at the observed discordant rate (at least 1 pp,
    the smallest rate at which such a shift is possible)."""
    if not n:
        return None
    return mcnemar_power(n, min(1.0, max(flips / n, net_shift)), net_shift)


def items_needed(n: int, flips: int, net_shift: float) -> str:
    """How many items would give the pooled test its power at the observed discordant rate (as `pooled_power`)."""
    rate = min(1.0, max(flips / n, net_shift)) if n else net_shift
    need = mcnemar_items_for_power(rate, net_shift, MIN_POWER, ALPHA)
    where = f"at the observed discordant rate ({flips}/{n} = {pct(flips / n)})" if n else "at the smallest rate"
    if need is None:
        return f"{where} no practical number of items reaches {MIN_POWER}"
    step = 100 if need >= 1000 else 10
    return f"{where} about {-(-need // step) * step:,} items would reach {MIN_POWER}"


def default_bridge() -> CacheBridge | None:
    """The first registered cache-bridge workload's (the claim's table when the caller names none)."""
    return next((b for _, b in cache_bridges().values()), None)


def rq5(
    tab3: pd.DataFrame | None,
    paper: Paper,
    invalid_configs: dict[str, list[str]] | None = None,
    bridge: CacheBridge | None = None,
) -> Claim:
    bridge = bridge or default_bridge()
    flips: list[Any] = [paper.value(k) for k in paper.needs(ID, "context") or []]  # all(flips): none is None
    expected = (
        TEXT["expected_with_paper"].format(*(f["value"] for f in flips)) if flips and all(flips) else TEXT["expected"]
    )
    band = (
        f"p > 0.05, >= 1 flip each way, internal identity n/n; <= {RQ5_MAX_FLAGGED:.0%} flagged servings; "
        f"pooled power >= {MIN_POWER} for a 1 pp shift"
    )
    invalid_configs = invalid_configs or {}
    if tab3 is None or tab3.empty or bridge is None:
        return make_claim(ID, RULE, [], TEXT["none_observed"], expected, band, [TEXT["none_why"]], NOT_RUN)
    missing = [c for c in TAB3_COLUMNS if c not in tab3.columns]
    if missing:
        return make_claim(
            ID,
            RULE,
            [],
            "Tab. 3 could not be read",
            expected,
            band,
            [f"Tab. 3 lacks column(s) {', '.join(missing)}"],
            NOT_RUN,
        )
    rows = tab3[(tab3["config"] != "pooled") & (tab3["status"] == "complete")]
    details, judged = [], []
    for _, r in rows.iterrows():
        n, items = int(r["n"]), int(r["items"])
        b, c = int(r["flips_numeric_cache"]), int(r["flips_numeric_recompute"])
        flagged = int(r["flagged_servings"])
        share = flagged / (bridge.servings_per_item * items) if items else 1.0
        obs = (
            f"cold {int(r['cold_identical'])}/{n}, warm {int(r['warm_identical'])}/{n} identical; flips "
            f"{b} cache / {c} recompute, McNemar p = {fmt_p(r['mcnemar_p'])}; flagged servings {flagged} "
            f"({pct(share)})"
        )
        if r["data"] != bridge.paper_data:
            details.append(
                Verdict.of_claim(
                    ID,
                    str(r["config"]),
                    "direction",
                    NOT_RUN,
                    TEXT["other_data_observed"].format(data=r["data"], obs=obs),
                    expected,
                    band,
                    [TEXT["other_data_why"].format(data=r["data"])],
                )
            )
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
                reasons = [
                    f"{pct(share)} of servings flagged (more than {RQ5_MAX_FLAGGED:.0%}): the counted items "
                    "are a selection; this configuration cannot be judged"
                ]
            else:
                status = PASS
                judged.append((n, b, c, str(r["config"])))
        details.append(
            Verdict.of_claim(
                ID,
                str(r["config"]),
                "direction",
                status,
                obs,
                "cold n/n, warm n/n identical; p > 0.05",
                band,
                reasons or [f"Tab. 3 row {r['config']} (data = {bridge.paper_data})"],
            )
        )
    real = rows[rows["data"] == bridge.paper_data]
    if judged:
        n = sum(j[0] for j in judged)
        b, c = sum(j[1] for j in judged), sum(j[2] for j in judged)
        p = mcnemar_exact(b, c)
        power = pooled_power(n, b + c, bridge.net_shift)
        if not p > ALPHA:
            status, reasons = FAIL, [f"McNemar p = {fmt_p(p)} <= {ALPHA}: a significant accuracy shift"]
        elif power is None or power < MIN_POWER:
            status, reasons = (
                INCONCLUSIVE,
                [
                    f"{power_note(power)} to detect a 1 pp net accuracy shift over {n} items (below {MIN_POWER}): "
                    "'no significant shift' on so few items is no evidence; " + items_needed(n, b + c, bridge.net_shift)
                ],
            )
        elif not (b and c):
            status, reasons = FAIL, ["flips do not go both ways"]
        else:
            status, reasons = PASS, [f"sum over Tab. 3 rows {', '.join(j[3] for j in judged)}"]
        details.append(
            Verdict.of_claim(
                ID,
                TEXT["pooled_scope"].format(n=len(judged)),
                "pooled",
                status,
                f"{n} items, {b + c} flips: {b} cache / {c} recompute, McNemar p = {fmt_p(p)}, "
                f"{power_note(power)} for a 1 pp shift",
                expected,
                band,
                reasons,
            )
        )
        status = None
    elif len(real):
        status = None  # the per-configuration verdicts (FAIL, INVALID or INCONCLUSIVE) decide
    else:
        status = NOT_RUN
    observed = "; ".join(f"{d.scope}: {d.observed}" for d in details) or "no complete bridge runs"
    ev = [f"{d.scope}: {d.status}" for d in details]
    if status == NOT_RUN:
        data = ", ".join(sorted(set(map(str, rows["data"])))) or "none"
        ev = [TEXT["only_synthetic"].format(data=data)] + ev
    return make_claim(ID, RULE, details, observed, expected, band, ev, status)


def judge(ctx: Context) -> Claim:
    """The table is the cache-bridge workload's own (its `cache_bridge`); bridge runs that cannot be used make their
    rows invalid."""
    tab3, bridge = None, None
    for name, (_, b) in cache_bridges().items():
        tab3, bridge = ctx.workload_tables.get(name, {}).get(b.table), b
        if tab3 is not None:
            break
    invalid_configs: dict[str, list[str]] = {}
    runs = ctx.tables.runs
    if not runs.empty and "problems" in runs.columns:
        for _, r in runs[(runs["arm"] == "bridge") & runs["problems"].notna()].iterrows():
            invalid_configs.setdefault(str(r["config"]), []).append(str(r["problems"]))
    return rq5(tab3, ctx.paper, invalid_configs, bridge)
