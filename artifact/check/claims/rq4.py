"""RQ4: vLLM shows the same direction: OFF reruns identical, ON-vs-OFF divergence > 0."""

from __future__ import annotations

from typing import Any
from pathlib import Path

from artifact.analysis.tables import PlanGroup, Tables
from artifact.analysis.tenant_effect import under_load
from artifact.check.core import (
    FAIL,
    INCONCLUSIVE,
    INVALID,
    NOT_RUN,
    PASS,
    Claim,
    Context,
    fmt_rate,
    group_problems,
    make_claim,
    pair_evidence,
    Paper,
    pct,
    scope_of,
    Verdict,
    without_evidence,
    zero_contradicts,
)
from artifact.check.rules import rule, text
from artifact.engines import server_family

ID = "RQ4"
RULE = rule(ID)  # statement, hard, rule, minimum_evidence: claims/rules.toml
TEXT = text(ID)


def served_by(g: PlanGroup, family: str | None) -> bool:
    """Every run of the group was served by a server of `family` (the manifest's server_family; for older records
    the family its engine declares), whichever engine talked to it."""
    return family is not None and all(server_family(r.manifest) == family for r in g.runs)


def rq4(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details = []
    family = paper.needs(ID, "server_family")  # which servers the paper's claim is about (expected/paper.toml)
    for g in tables.groups:
        if not served_by(g, family):
            continue
        if not {"on", "off"} <= {r.manifest["arm"] for r in g.runs}:
            continue  # a plan with one arm only (an OFF arm by cache_salt): no ON-vs-OFF comparison to make
        if any((r.manifest.get("plan_data") or {}).get("server_overrides") for r in g.runs):
            continue  # a mitigation plan (batch invariance) is meant to remove the divergence: judged in "beyond"
        if any(under_load(r) for r in g.runs):
            continue  # background tenants: not the protocol's isolated condition
        off, onoff = g.stats.get("off_rerun"), g.stats.get("on_vs_off")
        build = g.meta.get("engine_build") or TEXT["observed_server"]
        obs = f"OFF reruns {fmt_rate(off)}; ON vs OFF {fmt_rate(onoff)} ({build})"
        invalid = group_problems(g)
        why = []
        if invalid:
            status, why = INVALID, invalid
        elif off is None or onoff is None:
            status = NOT_RUN
        elif without_evidence(off) or without_evidence(onoff):
            status, why = (
                INCONCLUSIVE,
                ["a comparison holds no episode in which both runs made a request without an error"],
            )
        elif unused := g.cache_unused(("on_vs_off",)):
            status, why = INCONCLUSIVE, unused
        elif off["k"]:
            status, why = FAIL, ["the OFF reruns diverge"]
        elif onoff["k"]:
            status = PASS
        elif zero_contradicts(onoff["n"], paper):
            status, why = FAIL, [f"ON vs OFF diverged in 0 of {onoff['n']} episodes"]
        else:
            status, why = INCONCLUSIVE, [f"ON vs OFF 0/{onoff['n']}: too few episodes to contradict the paper"]
        details.append(
            Verdict.of_claim(
                ID,
                scope_of(g),
                "direction",
                status,
                obs,
                "OFF reruns 0 diverging; ON vs OFF > 0",
                "direction only (model not named by the paper)",
                why + pair_evidence(g, "off_rerun", root) + pair_evidence(g, "on_vs_off", root),
            )
        )
    ctx: list[Any] = [paper.value(k) for k in paper.needs(ID, "context") or []]  # all(ctx): none is None
    expected = (
        TEXT["expected_with_paper"].format(*(pct(c["value"]) for c in ctx)) if ctx and all(ctx) else TEXT["expected"]
    )
    if not details:
        return make_claim(ID, RULE, [], TEXT["none_observed"], expected, "direction only", [TEXT["none_why"]], NOT_RUN)
    return make_claim(
        ID,
        RULE,
        details,
        "; ".join(f"{d.scope}: {d.observed}" for d in details),
        expected,
        "direction only",
        [f"{d.scope}: {d.status}" for d in details],
    )


def judge(ctx: Context) -> Claim:
    return rq4(ctx.tables, ctx.paper, ctx.root)
