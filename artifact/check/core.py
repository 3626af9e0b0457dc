"""The checker's shared core: verdicts and claims, their statuses, the paper's values, the value band, and the helpers
every claim module (artifact/check/claims/) uses.

A claim's status (and that of each of its scopes) is one of
  PASS          the claim holds on these results, on at least the evidence its rule names as its minimum;
  FAIL          the results contradict it (evidence against the paper, not merely too little evidence for it);
  OUT-OF-BAND   the direction holds but a rate differs from the paper's value for the same configuration by more
                than sampling error allows (`BAND_RULE`); a statement about magnitude, never a failure;
  INCONCLUSIVE  the runs the claim needs are there and valid, but hold less evidence than the claim's minimum
                (each claim module's RULE["minimum_evidence"]): too few episodes or items, requests that all failed, too
                many flagged servings, too little power; neither for nor against the paper;
  INVALID       the runs the claim needs are there but cannot be used as evidence (incomplete, not whole, made
                without a pairing fingerprint, a pairing refused, an OFF run served cached tokens);
  NOT-RUN       the runs the claim needs are not in the results (hardware, models, plans or data not run).
A claim that needs runs which did not happen is NOT-RUN, never PASS. A claim's status is the most severe of its
scopes' in the order FAIL, INVALID, INCONCLUSIVE, OUT-OF-BAND, PASS, NOT-RUN. RQ1 is the only hard claim.
`BAND_RULE` here, each claim module's `RULE` (collected in `artifact.check.claims.CLAIM_RULES`) and
`artifact.check.exit_codes.EXIT_CODES` are the text ARTIFACT.md quotes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from dataclasses import dataclass, fields
import math
from pathlib import Path
import re

from artifact.analysis.stats import wilson_interval
from artifact.analysis.tables import exposure, Pair, PlanGroup, quant_level, relative, Tables, widest_interval
from artifact.check.rules import BAND_RULE as BAND_RULE  # the value band's rule, in claims/rules.toml (re-exported)
from artifact.verdict import (  # the claims' names (re-exported: `X as X`)
    FAIL as FAIL,
    INCONCLUSIVE as INCONCLUSIVE,
    INVALID as INVALID,
    NOT_RUN as NOT_RUN,
    OUT as OUT,
    PASS as PASS,
    SEVERITY as SEVERITY,
    STATUSES as STATUSES,
    TESTED as TESTED,
    Verdict as Verdict,
)
from artifact.check.facts import engine_of
from artifact.engines.base import OBSERVES

if TYPE_CHECKING:
    from artifact.records.store import Run


ALPHA = 0.05


ROUNDING = 0.0005  # the paper prints percentages to one decimal: 0.05 percentage points


MIN_POWER = 0.80  # power a "no effect" result needs before it counts (the paper's GSM8K power is 0.81)


@dataclass
class Claim:
    id: str
    statement: str
    hard: bool
    rule: str
    status: str
    observed: str
    expected: str
    band: str
    evidence: list[str]
    details: list[Verdict]
    minimum_evidence: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**out, "evidence": list(self.evidence), "details": [v.as_dict() for v in self.details]}


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def fmt_rate(s: dict[str, Any] | None) -> str:
    if not s or not s.get("n"):
        return "not run"
    out = f"{s['k']}/{s['n']} = {pct(s['rate'])}"
    if s.get("wilson_lo") is not None:
        out += f" (Wilson {pct(s['wilson_lo'])}-{pct(s['wilson_hi'])}"
        if s.get("boot_lo") is not None:
            out += f", bootstrap {pct(s['boot_lo'])}-{pct(s['boot_hi'])}"
        out += ")"
    return out


def fmt_p(p: float | None) -> str:
    return "-" if p is None or (isinstance(p, float) and math.isnan(p)) else f"{p:.2g}"


def word_list(s: str | None) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9.]+", (s or "").lower()) if w]


def model_matches(paper_model: str | None, family: str | None, name: str | None) -> bool:
    """The paper's model name appears as consecutive words of the run's model name or family."""
    want = word_list(paper_model)
    if not want:
        return False  # the paper does not name the model: no run can be shown to be that configuration
    for cand in (name, family):
        words = word_list(cand)
        if any(words[i : i + len(want)] == want for i in range(len(words) - len(want) + 1)):
            return True
    return False


def paper_configs_for(meta: dict[str, Any], configs: list[dict[str, Any]], *, with_quant: bool = True) -> list[str]:
    """Ids of the paper's [[config]] entries this run's engine, model (and quantization level) match. The model is
    the one the checkout's configurations pin the run's weights as (`meta["pinned_model"]`: configs/paper/ pins the
    paper's models file by file), never the name or family the run's manifest carries; weights no configuration pins
    match no paper configuration. The level is held to the weights' pin at admission (`facts.model_problem`)."""
    out = []
    level = quant_level(meta.get("quant"))
    pinned = meta.get("pinned_model")
    family, name = pinned if isinstance(pinned, (tuple, list)) and len(pinned) == 2 else (None, None)
    for c in configs:
        if str(c["engine"]).lower() != str(meta.get("engine") or "").lower():
            continue
        if not model_matches(c.get("model"), family, name):
            continue
        if with_quant and (level is None or quant_level(c["quant"]) is not level):
            continue
        out.append(c["id"])
    return out


# comparison in expected/paper.toml -> (comparison kind in the tables, plan)
PAPER_COMPARISONS = {
    "off_rerun": ("off_rerun", "main"),
    "on_rerun": ("on_rerun", "main"),
    "on_vs_off": ("on_vs_off", "main"),
    "on_rerun_cram0": ("on_rerun", "cram0"),
}


class Paper:
    """expected/paper.toml, indexed for the checker."""

    def __init__(self, doc: dict[str, Any]):
        self.meta, self.configs, self.values = doc["meta"], doc["config"], doc["value"]
        self.claims: dict[str, Any] = doc.get("claim", {})  # [claim.ID]: what a claim reads of the paper
        self.config_ids = {c["id"] for c in self.configs}
        self.by_slot: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for v in self.values.values():
            if v["reported"] and v.get("config") in self.config_ids and v.get("comparison") in PAPER_COMPARISONS:
                kind, plan = PAPER_COMPARISONS[v["comparison"]]
                self.by_slot.setdefault((v["config"], kind, plan), []).append(v)

    def needs(self, claim_id: str, field: str) -> Any:
        """What claim `claim_id` reads of the paper ([claim.ID] in expected/paper.toml), or None."""
        return (self.claims.get(claim_id) or {}).get(field)

    def value(self, key: str) -> dict[str, Any] | None:
        v = self.values.get(key)
        return v if v and v["reported"] else None

    def for_group(self, g: PlanGroup, kind: str) -> list[dict[str, Any]]:
        return [v for cid in paper_configs_for(g.meta, self.configs) for v in self.by_slot.get((cid, kind, g.plan), [])]

    def n_of(self, v: dict[str, Any]) -> int:
        return int(v.get("n") or self.meta["episodes"])

    def k_of(self, v: dict[str, Any]) -> int:
        return int(v["k"]) if "k" in v else int(round(v["value"] * self.n_of(v)))


def value_band(r: float, lo: float, hi: float, p0: float, p_lo: float, p_hi: float) -> tuple[float, float]:
    """BAND_RULE: the observed interval [lo, hi] around r widened by the paper's interval [p_lo, p_hi] around p0
    in quadrature (Newcombe 1998, method 10), plus the rounding tolerance."""
    return (r - math.hypot(r - lo, p_hi - p0) - ROUNDING, r + math.hypot(hi - r, p0 - p_lo) + ROUNDING)


def band_verdict(
    claim: str, s: dict[str, Any] | None, v: dict[str, Any], paper: Paper, scope: str, evidence: list[str]
) -> Verdict:
    n0, k0 = paper.n_of(v), paper.k_of(v)
    p0 = v["value"]
    p_lo, p_hi = wilson_interval(k0, n0)
    expected = f"{pct(p0)} ({v['source']}; paper Wilson 95% {pct(p_lo)}-{pct(p_hi)} at n = {n0})"
    if not s or not s.get("n"):
        return Verdict.of_claim(
            claim,
            scope,
            "band",
            NOT_RUN,
            "not run",
            expected,
            "not applicable: not run",
            evidence or [f"no run of {v['config']} under the plan this value needs"],
        )
    lo, hi = widest_interval(s)  # type: ignore[misc]  # rate stats with an n have an interval
    b_lo, b_hi = value_band(s["rate"], lo, hi, p0, p_lo, p_hi)
    status = PASS if b_lo <= p0 <= b_hi else OUT
    band = f"{pct(max(0.0, b_lo))}-{pct(min(1.0, b_hi))} (observed {pct(lo)}-{pct(hi)} widened by the paper's error)"
    return Verdict.of_claim(claim, scope, "band", status, fmt_rate(s), expected, band, evidence)


def pair_evidence(g: PlanGroup | None, kind: str, root: Path | None, every: bool = False) -> list[str]:
    """'<name>: <run a> vs <run b>' for the headline comparison of a kind (every one of that kind if asked)."""
    if g is None:
        return []
    pairs = g.pairs(kind) if every else [p for p in [g.headline(kind)] if p is not None]
    return [f"{p.name}: {relative(p.a.path, root)} vs {relative(p.b.path, root)}" for p in pairs]


def scope_of(g: PlanGroup) -> str:
    return f"{g.config} / {g.plan}"


def rollup(details: list[Verdict]) -> str:
    statuses = {d.status for d in details}
    return next((s for s in SEVERITY if s in statuses), NOT_RUN)


def make_claim(
    cid: str,
    rule: dict[str, Any],
    details: list[Verdict],
    observed: str,
    expected: str,
    band: str,
    evidence: list[str],
    status: str | None = None,
) -> Claim:
    """A claim module's verdict from its rule (the module's ID and RULE), its details and their most severe status."""
    return Claim(
        cid,
        rule["statement"],
        rule["hard"],
        rule["rule"],
        status or rollup(details),
        observed,
        expected,
        band,
        evidence,
        details,
        rule["minimum_evidence"],
    )


def group_problems(g: PlanGroup | None) -> list[str]:
    """Why a configuration-plan cannot be used as evidence (its runs' problems and refused pairings)."""
    return [] if g is None else list(g.problems)


def without_evidence(s: dict[str, Any] | None) -> bool:
    """A comparison that did not run, or compared no episode in which both runs made a request without an error."""
    return s is None or not s.get("n") or not s.get("n_evidence")


def zero_contradicts(n: int, paper: Paper) -> bool:
    """Whether 0 of n diverging contradicts the smallest ON-vs-OFF rate the paper reports (Wilson upper bound
    below it), i.e. is evidence against 'enabling the cache changes trajectories' rather than too few episodes."""
    v = paper.value("on_vs_off_divergence_min")
    return bool(n) and v is not None and wilson_interval(0, n)[1] < v["value"]


def power_note(power: float | None) -> str:
    return "power not computable" if power is None else f"power {power:.2f}"


def off_exposure(offs: list[Any], root: Path | None) -> tuple[int, list[str], list[str]]:
    """Cached tokens served to OFF runs, the runs that were served any (with counts), and unreported requests."""
    cached, hits, unreported = 0, [], []
    for r in offs:
        e = exposure(r)
        if e is None:
            unreported.append(f"{r.label} (all {len(r.requests)} requests)")
            continue
        if e.unreported:
            unreported.append(f"{r.label} ({e.unreported} of {e.requests} requests)")
        if e.cached_tokens or e.requests_with_cache:
            cached += e.cached_tokens
            hits.append(f"{relative(r.path, root)}: {e.requests_with_cache} requests, {e.cached_tokens} cached tokens")
    return cached, hits, unreported


def observes(run: Run) -> dict[str, Any]:
    """What the run's engine observed of its server (artifact.engines.base.OBSERVES), derived from facts:
    an engine that starts its own server (it loads the configuration's weights, sha256-verified, and records the
    command line it started: `Capabilities.loads_weights`) observes everything; any other (a server the user runs,
    an engine this version does not know) observes what its manifest's `observes` says it did, and nothing where the
    manifest says nothing (an absent `observes` was read as "observes everything")."""
    engine = engine_of(run)
    if engine is not None and engine.capabilities.loads_weights:
        return {k: True for k in OBSERVES}
    said = run.manifest.get("observes")
    said = said if isinstance(said, dict) else {}
    return {k: said.get(k, False) for k in OBSERVES}


def unobserved(runs: list[Any], key: str) -> list[str]:
    """The runs whose engine did not observe `key` of its server (`observes`)."""
    return [r.label for r in runs if observes(r)[key] in (False, None)]


def observation_note(runs: list[Any]) -> list[str]:
    """An evidence line naming what the runs' engine could not observe of its server (none if it observed all)."""
    keys = sorted({k for r in runs for k, v in observes(r).items() if v in (False, None)})
    return (
        [
            f"not observable by the engine (a server the artifact did not start): {', '.join(keys)}; the verdict is "
            "about that server as it answered, not about a pinned build"
        ]
        if keys
        else []
    )


def cache_unverified(run: Run) -> str | None:
    """Why a run cannot show what its cache served (None if it can): it ran on an engine that reports cache use on
    every request it serves (`Capabilities.reports_cache_use`), yet some of its served requests report none (a null
    cache_n). Such a null is not the engine's answer; read as 0, it would let a cache hit pass for none."""
    engine = engine_of(run)
    if engine is None or not engine.capabilities.reports_cache_use:
        return None
    served = [r for r in run.requests if dict.get(r, "error") is None]
    null = sum(dict.get(r, "cache_n") is None for r in served)
    if not null:
        return None
    return (
        f"{run.label} reports no cache use on {null} of its {len(served)} served requests (cache_n null), "
        f"although {engine.kind} reports it on every request it serves: not shown to be served no cached token"
    )


def paired_flags(x: Pair, y: Pair) -> tuple[int, int, int]:
    """Over the episodes both comparisons compared: (n, b, c), b = diverged in x only, c = diverged in y only."""
    fx = {d.episode_id: d.diverged for d in x.cmp.episodes}
    fy = {d.episode_id: d.diverged for d in y.cmp.episodes}
    common = [e for e in fx if e in fy]
    return (len(common), sum(fx[e] and not fy[e] for e in common), sum(fy[e] and not fx[e] for e in common))


@dataclass
class Context:
    """What every claim module judges: the tables of the paired runs, each workload's own tables, the paper's
    values and the results directory (evidence paths are given relative to it)."""

    tables: Tables
    workload_tables: dict[str, Any]
    paper: Paper
    root: Path | None = None
