"""RQ2: Enabling the cache changes trajectories: ON-vs-OFF divergence > 0 and above same-arm rerun divergence."""

from __future__ import annotations

from typing import Any
from pathlib import Path

from artifact.analysis.stats import mcnemar_exact
from artifact.analysis.tenant_effect import under_load
from artifact.analysis.tables import PAPER_PLAN, Pair, Tables
from artifact.check.core import (
    ALPHA,
    FAIL,
    INCONCLUSIVE,
    INVALID,
    NOT_RUN,
    OUT,
    PASS,
    TESTED,
    band_verdict,
    Claim,
    Context,
    fmt_p,
    fmt_rate,
    group_problems,
    make_claim,
    observation_note,
    pair_evidence,
    paired_flags,
    Paper,
    paper_configs_for,
    pct,
    rollup,
    scope_of,
    Verdict,
    without_evidence,
    zero_contradicts,
)
from artifact.check.rules import rule

ID = "RQ2"
RULE = rule(ID)  # statement, hard, rule, minimum_evidence: claims/rules.toml


def rerun_above(rerun: Pair, on_vs_off: Pair) -> tuple[bool, str]:
    """Whether a rerun diverges in significantly more episodes than ON vs OFF (exact McNemar over the episodes both
    compared, two-sided at ALPHA), and the test in words."""
    n, b, c = paired_flags(rerun, on_vs_off)
    p = mcnemar_exact(b, c)
    return b > c and p < ALPHA, (
        f"exact McNemar over {n} paired episodes: {b} diverged in the rerun only, {c} in ON vs OFF only, p = {fmt_p(p)}"
    )


def rq2(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details, bands = [], []
    banded: set[str] = set()
    for g in tables.groups:
        s: Any = g.stats.get("on_vs_off")  # rate stats, or None (`without_evidence` tells)
        if not {"on", "off"} <= {r.manifest["arm"] for r in g.runs}:
            continue  # a plan with one arm only (cram0): no ON-vs-OFF comparison to make
        if any((r.manifest.get("plan_data") or {}).get("server_overrides") for r in g.runs):
            continue  # a mitigation plan (server_overrides) is meant to remove the divergence: judged in "beyond"
        if any(under_load(r) for r in g.runs):
            continue  # background tenants: not the protocol's isolated condition (BEYOND-TENANTS in "beyond")
        on_r: Any = g.stats.get("on_rerun")  # rate stats, or None (`without_evidence` tells)
        off_r: Any = g.stats.get("off_rerun")
        reasons = []
        invalid = group_problems(g)
        if invalid:
            status, reasons = INVALID, invalid
        elif without_evidence(s):
            status, reasons = (
                INCONCLUSIVE,
                [
                    "ON vs OFF compared no episode in which both runs made a request without an error"
                    if s
                    else "no valid ON-vs-OFF pair"
                ],
            )
        elif unused := g.cache_unused(("on_vs_off", "on_rerun")):
            status, reasons = INCONCLUSIVE, unused
        else:
            contradicted = False
            if not s["k"]:
                reasons.append(f"ON vs OFF diverged in 0 of {s['n']} episodes")
                contradicted = zero_contradicts(s["n"], paper)
                if not contradicted:
                    reasons.append(
                        f"0/{s['n']} is too few episodes to contradict the paper's smallest ON-vs-OFF "
                        "rate (its Wilson 95% upper bound is above it)"
                    )
            for name, kind, other in (("ON rerun", "on_rerun", on_r), ("OFF rerun", "off_rerun", off_r)):
                if s["k"] and not without_evidence(other) and not s["rate"] > other["rate"]:
                    below, test = rerun_above(g.headline(kind), g.headline("on_vs_off"))  # type: ignore[arg-type]  # both ran: their stats have evidence
                    contradicted |= below
                    reasons.append(
                        f"ON vs OFF ({pct(s['rate'])}) not above the {name} ({pct(other['rate'])}); "
                        + (
                            f"the {name} diverges significantly more, {test}"
                            if below
                            else f"not significantly below it either, {test}: a tie or too few episodes"
                        )
                    )
            missing = [name for name, other in (("ON rerun", on_r), ("OFF rerun", off_r)) if without_evidence(other)]
            if contradicted:
                status = FAIL
            elif reasons:
                status = INCONCLUSIVE
            elif missing:
                status = INCONCLUSIVE
                reasons.append(
                    f"the {' and the '.join(missing)} the rule compares against did not run (or compared no episode)"
                )
            else:
                status = PASS
        obs = f"ON vs OFF {fmt_rate(s)}; ON rerun {fmt_rate(on_r)}; OFF rerun {fmt_rate(off_r)}"
        matched = paper_configs_for(g.meta, paper.configs)
        if matched:
            band = f"value band: see the band rows for {', '.join(matched)}"
        else:
            band = "no value band: not a configuration the paper measured"
        details.append(
            Verdict.of_claim(
                ID,
                scope_of(g),
                "direction",
                status,
                obs,
                "ON vs OFF > 0 and > same-arm reruns (paper: 36.2-91.2% ON vs OFF, "
                "8.8-77.5% ON reruns, across its configurations)",
                band,
                reasons
                + pair_evidence(g, "on_vs_off", root)
                + pair_evidence(g, "on_rerun", root)
                + pair_evidence(g, "off_rerun", root)
                + observation_note(g.runs),
            )
        )
        for kind in ("on_vs_off", "on_rerun"):
            for v in paper.for_group(g, kind):
                banded.add(v["key"])
                if invalid:
                    continue
                bands.append(
                    band_verdict(
                        "RQ2",
                        g.stats.get(kind),
                        v,
                        paper,
                        f"{v['config']} {kind.replace('_', ' ')} ({scope_of(g)})",
                        pair_evidence(g, kind, root),
                    )
                )
    # paper values of configurations these results did not run: one NOT-RUN row naming them all (one row each
    # would bury the verdicts of what ran under lines about what did not)
    absent = [
        (cid, kind, v)
        for (cid, kind, plan), vs in sorted(paper.by_slot.items())
        if kind in ("on_vs_off", "on_rerun") and plan == PAPER_PLAN
        for v in vs
        if v["key"] not in banded
    ]
    if absent:
        bands.append(
            Verdict.of_claim(
                "RQ2",
                f"the paper's configurations not in these results ({len(absent)} value(s))",
                "band",
                NOT_RUN,
                "not run",
                "; ".join(f"{cid} {kind.replace('_', ' ')}: {pct(v['value'])}" for cid, kind, v in absent),
                "not applicable: not run",
                [f"no {PAPER_PLAN}-plan run of " + ", ".join(dict.fromkeys(cid for cid, _, _ in absent))],
            )
        )
    directions = [d for d in details if d.kind == "direction"]
    n_pass = sum(d.status == PASS for d in directions)
    compared = [b for b in bands if b.status != NOT_RUN]
    n_values = len(bands) - bool(absent) + len(absent)
    observed = (
        (
            f"direction holds in {n_pass}/{len(directions)} configuration-plan(s); "
            f"{len(compared)}/{n_values} paper values compared "
            f"({sum(b.status == OUT for b in compared)} out of band)"
        )
        if directions
        else "no run with both arms"
    )
    others = [d for d in directions if d.status not in TESTED]
    if others:
        observed += "; " + ", ".join(f"{d.scope}: {d.status}" for d in others)
    ev = [f"{d.scope}: {d.status}" for d in details] + [f"{b.scope}: {b.status}" for b in compared]
    status = rollup(directions + compared) if directions else NOT_RUN
    return make_claim(
        ID,
        RULE,
        details + bands,
        observed,
        "ON vs OFF > 0 and above same-arm reruns; paper values per configuration where reported",
        "direction: strict; magnitude: the value band",
        ev,
        status,
    )


def judge(ctx: Context) -> Claim:
    return rq2(ctx.tables, ctx.paper, ctx.root)
