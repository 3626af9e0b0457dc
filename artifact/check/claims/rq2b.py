"""RQ2b: With the host prompt cache off, or the cache state reset between runs, cache-ON reruns agree (paper: 79/80,
against 38.8% diverging with the default)."""

from __future__ import annotations

from typing import Any
from pathlib import Path

from artifact.analysis.stats import mcnemar_exact, mcnemar_power
from artifact.analysis.tables import PAPER_PLAN, Tables
from artifact.check.core import (
    ALPHA,
    FAIL,
    INCONCLUSIVE,
    INVALID,
    MIN_POWER,
    NOT_RUN,
    PASS,
    band_verdict,
    Claim,
    Context,
    fmt_p,
    fmt_rate,
    group_problems,
    make_claim,
    pair_evidence,
    paired_flags,
    Paper,
    power_note,
    rollup,
    scope_of,
    Verdict,
    without_evidence,
)
from artifact.check.rules import rule

ID = "RQ2b"
RULE = rule(ID)  # statement, hard, rule, minimum_evidence: claims/rules.toml


def rq2b(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details = []
    for g in tables.groups:
        if g.plan not in ("cram0", "fresh"):
            continue
        pair = g.headline("on_rerun")
        base_g = tables.group(g.config, PAPER_PLAN)
        base = base_g.headline("on_rerun") if base_g else None
        if pair is None and not group_problems(g):
            continue
        what = "host prompt cache off" if g.plan == "cram0" else "new server per run"
        # rate stats, or None (`without_evidence` tells)
        s: Any = pair.stats if pair else None
        bs: Any = base.stats if base else None
        obs = f"ON reruns ({what}) {fmt_rate(s)}; default ON reruns {fmt_rate(bs)}"
        invalid = group_problems(g) + group_problems(base_g)
        if invalid:
            status, why = INVALID, invalid
        elif base is None:
            status, why = (
                NOT_RUN,
                ["the default ON reruns (plan main) of this configuration did not run: nothing to compare with"],
            )
        elif without_evidence(s) or without_evidence(bs):
            status, why = (
                INCONCLUSIVE,
                ["the reruns compared no episode in which both runs made a request without an error"],
            )
        else:
            n, b, c = paired_flags(base, pair)  # type: ignore[arg-type]  # pair is not None: its stats have evidence
            p = mcnemar_exact(b, c)
            rate = bs["rate"]
            power = mcnemar_power(n, rate, rate) if n and rate else None
            obs += (
                f"; paired over {n} episodes: {b} agree only with the layer off, {c} only by default, exact "
                f"McNemar p = {fmt_p(p)}; {power_note(power)} to detect full agreement"
            )
            if b > c and p < ALPHA:
                status, why = PASS, [f"reruns diverge less with the {what} (p = {fmt_p(p)} < {ALPHA})"]
            elif not bs["k"]:
                status, why = (
                    INCONCLUSIVE,
                    ["the default ON reruns do not diverge: nothing for the host prompt cache to explain"],
                )
            elif power is not None and power >= MIN_POWER:
                status, why = (
                    FAIL,
                    [
                        f"reruns did not come into agreement (p = {fmt_p(p)}) although the data had "
                        f"power {power:.2f} to show it"
                    ],
                )
            else:
                status, why = (
                    INCONCLUSIVE,
                    [
                        f"no significant reduction (p = {fmt_p(p)}) and too little power "
                        f"({power_note(power)} < {MIN_POWER}) to count that against the paper"
                    ],
                )
        ev = why + pair_evidence(g, "on_rerun", root) + pair_evidence(base_g, "on_rerun", root)
        details.append(
            Verdict.of_claim(
                ID,
                scope_of(g),
                "direction",
                status,
                obs,
                "ON reruns agree (paper: 79/80 with --cache-ram 0, vs 38.8% default)",
                "paired McNemar p < 0.05 for PASS; power >= 0.80 for FAIL",
                ev,
            )
        )
        for v in paper.for_group(g, "on_rerun") if g.plan == "cram0" and not invalid else []:
            details.append(
                band_verdict(
                    "RQ2b",
                    s,
                    v,
                    paper,
                    f"{v['config']} ON reruns, --cache-ram 0 ({scope_of(g)})",
                    pair_evidence(g, "on_rerun", root),
                )
            )
    fig1 = paper.value("fig1_on_rerun_cram0")
    if fig1 and not any(d.kind == "band" for d in details):
        details.append(
            band_verdict(
                "RQ2b",
                None,
                fig1,
                paper,
                f"{fig1['config']} ON reruns, --cache-ram 0",
                [f"no cram0-plan run of {fig1['config']} in these results"],
            )
        )
    directions = [d for d in details if d.kind == "direction"]
    status = (
        rollup(directions + [d for d in details if d.kind == "band" and d.status != NOT_RUN]) if directions else NOT_RUN
    )
    observed = "; ".join(f"{d.scope}: {d.observed}" for d in directions) or "no cram0 or fresh ON reruns"
    return make_claim(
        ID,
        RULE,
        details,
        observed,
        "79/80 ON reruns agree with --cache-ram 0 (Fig. 1, §IV-C)",
        "paired McNemar against the default ON reruns; magnitude: the value band for Qwen2.5-7B Q4_K_M",
        [f"{d.scope}: {d.status}" for d in details],
        status,
    )


def judge(ctx: Context) -> Claim:
    return rq2b(ctx.tables, ctx.paper, ctx.root)
