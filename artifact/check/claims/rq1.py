"""RQ1: With the cache off, reruns are bit-identical (0 diverging episodes) and OFF runs are served no cached
tokens, in every configuration run."""

from __future__ import annotations

from typing import Any
from pathlib import Path

from artifact.analysis.divergence import record_problems
from artifact.analysis.tenant_effect import under_load
from artifact.analysis.tables import Tables, exposure
from artifact.check.core import (
    FAIL,
    INCONCLUSIVE,
    INVALID,
    NOT_RUN,
    PASS,
    TESTED,
    Claim,
    Context,
    cache_unverified,
    fmt_rate,
    make_claim,
    observation_note,
    off_exposure,
    pair_evidence,
    Paper,
    scope_of,
    Verdict,
)
from artifact.check.rules import rule

ID = "RQ1"
RULE = rule(ID)  # statement, hard, rule, minimum_evidence: claims/rules.toml


def rq1(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details, k_tot, n_tot, loaded = [], 0, 0, []
    for g in tables.groups:
        offs = [r for r in g.runs if r.manifest["arm"] == "off"]
        if not offs:
            continue
        if any(under_load(r) for r in g.runs):
            loaded.append(scope_of(g))  # background tenants: not the protocol's isolated condition
            continue
        pairs = g.pairs("off_rerun")
        cached, hits, unreported = off_exposure(offs, root)
        diverged: dict[str, Any] = {}  # episode -> (the first pair it diverges in, its diff)
        for p in pairs:
            for d in p.cmp.diverged:
                diverged.setdefault(d.episode_id, (p, d))
        compared = {d.episode_id for p in pairs for d in p.cmp.episodes}
        evidence = min((p.cmp.n_evidence for p in pairs), default=0)
        invalid = [x for r in offs for x in record_problems(r)] + [
            why for kind, why in g.refused if kind == "off_rerun"
        ]
        k_tot, n_tot = k_tot + len(diverged), n_tot + len(compared)
        head = g.headline("off_rerun")
        unverified = [w for r in offs if (w := cache_unverified(r))]
        silent = [] if unverified else silent_runs(offs)
        if hits or (diverged and not silent):
            status, why = FAIL, []
        elif invalid:
            status, why = INVALID, invalid
        elif not pairs:
            status, why = NOT_RUN, ["only one OFF run: no rerun to compare"]
        elif unverified:
            status, why = INCONCLUSIVE, unverified
        elif silent:
            status, why = INCONCLUSIVE, [unreported_reason(offs, silent, len(diverged))]
        elif not evidence:
            status, why = (
                INCONCLUSIVE,
                [
                    "no compared episode in which both OFF runs made a request without an "
                    "error (runs without requests, or whose requests all failed)"
                ],
            )
        else:
            status, why = PASS, []
        obs = f"OFF reruns {fmt_rate(head.stats)}" if head else "no OFF pair compared"
        if len(pairs) > 1:
            obs += f"; {len(diverged)}/{len(compared)} episodes diverge in any of the {len(pairs)} OFF pairs"
        obs += f"; cached prompt tokens in OFF runs: {cached}"
        if unreported:
            obs += f" (cache use not reported for {', '.join(unreported)})"
        ev = (
            why + pair_evidence(g, "off_rerun", root, every=True) + [f"OFF run served cached tokens: {h}" for h in hits]
        )
        ev += observation_note(offs)
        mism = sorted({e for p in pairs for e in p.cmp.prompt_mismatches})
        if mism:
            ev.append(
                f"warning: identical outputs but different prompts in {len(mism)} episode(s) "
                f"({', '.join(mism[:5])}): a nondeterministic harness"
            )
        ev += [
            f"diverged: {eid} (request {d.first_request}, token {d.first_token}) in {p.name}"
            for eid, (p, d) in list(diverged.items())[:5]
        ]
        details.append(
            Verdict.of_claim(
                ID,
                scope_of(g),
                "hard",
                status,
                obs,
                "0 diverging episodes, 0 cached tokens",
                "exact (no tolerance)",
                ev,
            )
        )
    v = paper.value("off_rerun_divergence_all")
    expected = (
        (f"{v['k']}/{v['n']} diverging episodes over 10 configurations ({v['source']}); 0 cached tokens in OFF runs")
        if v
        else "0 diverging episodes"
    )
    n_cfg = sum(d.status in TESTED for d in details)
    observed = (
        f"{k_tot}/{n_tot} diverging episodes over {n_cfg} configuration-plan(s) with OFF reruns"
        if n_cfg
        else "no configuration-plan with two valid OFF runs that made requests"
    )
    others = [d for d in details if d.status not in TESTED]
    if others:
        observed += "; " + ", ".join(f"{d.scope}: {d.status}" for d in others)
    failing = [d.scope for d in details if d.status == FAIL]
    ev = [f"FAIL in: {', '.join(failing)}"] if failing else [f"{d.scope}: {d.status}" for d in details]
    if loaded:
        ev.append(f"not judged (background tenants, measured as BEYOND-TENANTS): {', '.join(loaded)}")
    return make_claim(
        ID, RULE, details, observed, expected, "exact: 0 diverging episodes, 0 cached tokens (no tolerance)", ev
    )


def silent_runs(offs: list[Any]) -> list[str]:
    """The OFF runs with served requests (no error) that do not report their cache use (cache_n null), with counts:
    an engine that does not report it on every request (`Capabilities.reports_cache_use` false: a server the
    artifact did not start) cannot show that its OFF runs were served no cached token. A failed request's null says
    nothing about the cache and does not count."""
    out = []
    for r in offs:
        served = [q for q in r.requests if dict.get(q, "error") is None]
        null = sum(dict.get(q, "cache_n") is None for q in served)
        if null:
            out.append(f"{r.label} ({null} of {len(served)} served requests)")
    return out


def unreported_reason(offs: list[Any], unreported: list[str], diverged: int) -> str:
    """Why OFF runs whose requests do not report their cache use cannot decide RQ1."""
    none = sum(1 for r in offs if exposure(r) is None)
    head = (
        "the server reports no cache use"
        if none == len(offs)
        else f"cache use not reported on every OFF request ({', '.join(unreported)})"
    )
    return (
        f"{head}: that the OFF runs were served no cached token is not shown, so the OFF reruns' "
        + (
            f"{diverged} diverging episode(s) are no evidence against the claim either"
            if diverged
            else "agreement does not show the claim"
        )
        + " (RQ1 needs cache_n reported on every OFF request)"
    )


def judge(ctx: Context) -> Claim:
    return rq1(ctx.tables, ctx.paper, ctx.root)
