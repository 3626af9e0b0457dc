"""Verdicts on the paper's claims (RQ1-RQ5) from the tables, with the rule for each written down as data.

A claim's status (and that of each of its scopes) is one of
  PASS          the claim holds on these results, on at least the evidence its rule names as its minimum;
  FAIL          the results contradict it (evidence against the paper, not merely too little evidence for it);
  OUT-OF-BAND   the direction holds but a rate differs from the paper's value for the same configuration by more
                than sampling error allows (`BAND_RULE`); a statement about magnitude, never a failure;
  INCONCLUSIVE  the runs the claim needs are there and valid, but hold less evidence than the claim's minimum
                (`CLAIM_RULES[...]["minimum_evidence"]`): too few episodes or items, requests that all failed, too
                many flagged servings, too little power; neither for nor against the paper;
  INVALID       the runs the claim needs are there but cannot be used as evidence (incomplete, not whole, made
                without a pairing fingerprint, a pairing refused, an OFF run served cached tokens);
  NOT-RUN       the runs the claim needs are not in the results (hardware, models, plans or data not run).
A claim that needs runs which did not happen is NOT-RUN, never PASS. A claim's status is the most severe of its
scopes' in the order FAIL, INVALID, INCONCLUSIVE, OUT-OF-BAND, PASS, NOT-RUN. RQ1 is the only hard claim.
`CLAIM_RULES`, `BAND_RULE` and `EXIT_CODES` are the text ARTIFACT.md quotes.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from artifact.analysis.compare import record_problems
from artifact.analysis.gsm8k_table import NET_SHIFT
from artifact.analysis.stats import cochran_armitage, mcnemar_exact, mcnemar_power, wilson_interval
from artifact.analysis.tables import (
    PAPER_PLAN, Pair, PlanGroup, Tables, exposure, quant_level, relative, widest_interval,
)
from artifact.check.exit_codes import EXIT_CODES  # noqa: F401  (re-exported: the text ARTIFACT.md quotes)
from artifact.check.expected import load_document

PASS, FAIL, OUT, NOT_RUN = "PASS", "FAIL", "OUT-OF-BAND", "NOT-RUN"
INCONCLUSIVE, INVALID = "INCONCLUSIVE", "INVALID"
STATUSES = (PASS, FAIL, OUT, INCONCLUSIVE, INVALID, NOT_RUN)
SEVERITY = (FAIL, INVALID, INCONCLUSIVE, OUT, PASS, NOT_RUN)  # a claim takes the first of its scopes' statuses
TESTED = (PASS, FAIL, OUT)  # statuses of a claim that was tested (judged on enough valid evidence)
ALPHA = 0.05
ROUNDING = 0.0005  # the paper prints percentages to one decimal: 0.05 percentage points
MIN_POWER = 0.80  # power a "no effect" result needs before it counts (the paper's GSM8K power is 0.81)
RQ5_MAX_FLAGGED = 0.10  # above this share of flagged servings a GSM8K configuration cannot be judged


BAND_RULE = (
    "Value band (RQ2, RQ2b; only where the paper reports a rate for the same configuration). Same configuration: "
    "same engine, same model (the paper's model name, e.g. Qwen2.5-7B, appears as consecutive words of the run's "
    "model name or family) and same quantization level, run under the paper's plan (main: one server per arm, host "
    "prompt cache at its 8192 MiB default; cram0 for the 79/80 value). Observed interval [L, U]: the wider of the "
    "Wilson and the circular block bootstrap 95% intervals of the observed rate r = k/n. The paper's value p0 is itself "
    "an estimate from n = 80 episodes (k = round(p0 n) unless the paper states k), with Wilson 95% interval [l, u]. "
    "Band: the observed interval widened by the paper's sampling error in quadrature, plus 0.05 percentage points "
    "for the paper's one-decimal rounding: [r - sqrt((r - L)^2 + (u - p0)^2) - 0.0005, "
    "r + sqrt((U - r)^2 + (p0 - l)^2) + 0.0005]. The paper's value outside the band is OUT-OF-BAND; equivalently, "
    "Newcombe's (1998, Stat. Med. 17:873, method 10) hybrid-score 95% interval for observed minus paper excludes 0. "
    "Why: the observed interval alone treats the paper's number as exact and would flag about 17% of exact "
    "reproductions (two equal-size samples: |Z| > 1.96/sqrt(2)); combining both sampling errors keeps that near 5%, "
    "whereas asking only that the two intervals overlap would accept differences significant at p = 0.006. The band "
    "covers sampling and rounding only: another GPU, driver or engine build (the paper: RTX 4090, CUDA 12.6, "
    "llama.cpp b10434) changes floating-point kernels and can move the rate legitimately, so OUT-OF-BAND says the "
    "magnitude did not transfer to this setup; it is not a FAIL and does not change the exit code. No band for "
    "values the paper gives only as ranges over unnamed configurations (36.2-91.2%, 8.8-77.5%), for unnamed models "
    "(vLLM 16-bit), for a different experiment (Fig. 1's 81.2% ON vs OFF within one run), or for configurations the "
    "paper did not measure (the SmolLM2 demo)."
)

CLAIM_RULES: dict[str, dict] = {
    "RQ1": {
        "statement": "With the cache off, reruns are bit-identical (0 diverging episodes) and OFF runs are served "
                     "no cached tokens, in every configuration run.",
        "hard": True,
        "rule": "Every configuration-plan with cache-OFF runs: every pair of its OFF runs (run i vs run j, i < j) "
                "diverges in 0 episodes (an episode diverges when any generated token id or the number of requests "
                "differs), and no OFF run of any plan was served a cached prompt token: cache_n = 0 on every "
                "request that reports it, failed requests included. A null cache_n means 'not reported' and is "
                "shown so; it never hides a non-zero count on another request. No tolerance: bit-identity is "
                "exact, and one diverging episode means a source of nondeterminism escaped the protocol's control "
                "(paper: 0/800). FAIL on any divergence or cached token; INVALID where an OFF run or an OFF pairing "
                "is invalid; NOT-RUN with a single OFF run.",
        "minimum_evidence": "per configuration-plan, at least one episode compared in every OFF pair in which both "
                            "runs made a request without an error; below it INCONCLUSIVE (e.g. runs whose requests "
                            "all failed).",
    },
    "RQ2": {
        "statement": "Enabling the cache changes trajectories: ON-vs-OFF divergence > 0 and above same-arm rerun "
                     "divergence.",
        "hard": False,
        "rule": "Direction, per configuration-plan with both arms: the headline ON-vs-OFF divergence (ON run 1 vs "
                "OFF run 1) is > 0 and strictly above the ON rerun and the OFF rerun divergence (a comparison of "
                "rates, as the paper makes it). FAIL if a rerun diverges in significantly more episodes than ON vs "
                "OFF (exact McNemar over the paired episodes, p < 0.05), or if ON vs OFF is 0/n with n large "
                "enough that its Wilson 95% upper bound lies below the smallest ON-vs-OFF rate the paper reports "
                "(36.2%; n >= 7); a tie, a rerun not significantly above, or a smaller 0/n is INCONCLUSIVE. "
                "Applies to any configuration, the demo included, under every plan that keeps the configuration's "
                "server settings (plans with server_overrides are mitigation arms, judged in the beyond-the-paper "
                "section instead). "
                "Magnitude: the value band (BAND_RULE) for each ON-vs-OFF and ON-rerun rate the paper reports for a "
                "named configuration; NOT-RUN where that configuration did not run.",
        "minimum_evidence": "the three comparisons the rule compares (ON vs OFF, ON rerun, OFF rerun), each over "
                            ">= 1 episode in which both runs made a request without an error; without the reruns "
                            "INCONCLUSIVE.",
    },
    "RQ2b": {
        "statement": "With the host prompt cache off, or the cache state reset between runs, cache-ON reruns agree "
                     "(paper: 79/80, against 38.8% diverging with the default).",
        "hard": False,
        "rule": "Per configuration with cache-ON reruns under --cache-ram 0 (plan cram0) or a new server per run "
                "(plan fresh), against the default cache-ON reruns (plan main) of the same configuration, episode "
                "by episode: b = episodes that diverge by default but agree under cram0/fresh, c = the reverse; "
                "exact McNemar test on (b, c). PASS if the reruns diverge less (b > c) with two-sided p < 0.05: "
                "switching the layer off brings reruns into agreement beyond chance. FAIL if not, although the data "
                "had power >= 0.80 to show it (exact McNemar power at n episodes, for reruns that agree wherever "
                "the default ones diverge: discordant rate = net shift = the default rerun rate). Otherwise "
                "INCONCLUSIVE, with the power shown; INCONCLUSIVE too where the default reruns do not diverge "
                "(nothing for the layer to explain). NOT-RUN without the default ON reruns. The paper's 1/80 "
                "(Qwen2.5-7B Q4_K_M, llama.cpp) gets a value band (BAND_RULE) for that configuration.",
        "minimum_evidence": "a paired McNemar p < 0.05 for PASS (at least 6 episodes that diverge by default and "
                            "agree under cram0/fresh); power >= 0.80 for FAIL.",
    },
    "RQ3": {
        "statement": "Coarser quantization amplifies ON-vs-OFF divergence (trend test significant at 0.05).",
        "hard": False,
        "rule": "Per model and engine under plan main, where >= 3 quantization levels ran: Cochran-Armitage test "
                "of the ON-vs-OFF divergence (run 1 vs run 1) across levels ordered finest to coarsest by "
                "tables.QUANT_LEVELS, scores 0..m-1 over the levels that ran (the paper does not report its "
                "scores). PASS if z > 0 and two-sided p < 0.05. FAIL needs evidence against the paper: a "
                "significant trend the other way (z < 0, p < 0.05), or, for a model and engine the paper measured "
                "run at the paper's scale (>= 80 episodes at every level), no PASS. Otherwise INCONCLUSIVE (a model "
                "the paper never measured whose trend is not significant is no evidence against it). NOT-RUN with "
                "fewer than 3 levels. Exception: for a series whose own paper rates would not reach p < 0.05 under "
                "this test (Llama-3.1-8B: 44, 56, 55 of 80 give z = 1.82, p = 0.069), only the direction z > 0 is "
                "required, so that an exact reproduction of the paper cannot FAIL. No band on z: it depends on "
                "which levels ran and on the scores.",
        "minimum_evidence": "3 quantization levels; p < 0.05 for PASS; for FAIL a significant opposite trend, or "
                            "the paper's scale (80 episodes per level) on a series the paper measured.",
    },
    "RQ4": {
        "statement": "vLLM shows the same direction: OFF reruns identical, ON-vs-OFF divergence > 0.",
        "hard": False,
        "rule": "Per vLLM configuration-plan: PASS if its cache-OFF reruns diverge in 0 episodes and its ON-vs-OFF "
                "divergence is > 0; FAIL if the OFF reruns diverge, or ON vs OFF is 0/n with n >= 7 (as in RQ2); "
                "INCONCLUSIVE for a smaller 0/n; NOT-RUN if either comparison is missing, and NOT-RUN without vLLM "
                "runs (`./run.sh demo --vllm` makes them on a CPU; `./run.sh all` on a GPU host). The paper's vLLM "
                "values (8.8% and 27.5% ON reruns in two sessions, 62.5% ON vs OFF) are context, not a band: the "
                "summary does not name the model.",
        "minimum_evidence": "both comparisons over >= 1 episode in which both runs made a request without an error.",
    },
    "RQ5": {
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
    },
}


@dataclass
class Verdict:
    """One verdict row: a claim on one scope (a configuration-plan, a model series, a paper value, or 'all')."""

    claim: str
    scope: str
    kind: str  # direction | band | hard | trend | pooled
    status: str
    observed: str
    expected: str
    band: str
    evidence: list[str] = field(default_factory=list)


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

    def as_dict(self) -> dict:
        return asdict(self)


# --- formatting -----------------------------------------------------------------------------------------------

def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def fmt_rate(s: dict | None) -> str:
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


# --- the paper's configurations and values --------------------------------------------------------------------

def _words(s: str | None) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9.]+", (s or "").lower()) if w]


def model_matches(paper_model: str | None, family: str | None, name: str | None) -> bool:
    """The paper's model name appears as consecutive words of the run's model name or family."""
    want = _words(paper_model)
    if not want:
        return False  # the paper does not name the model: no run can be shown to be that configuration
    for cand in (name, family):
        words = _words(cand)
        if any(words[i:i + len(want)] == want for i in range(len(words) - len(want) + 1)):
            return True
    return False


def paper_configs_for(meta: dict, configs: list[dict], *, with_quant: bool = True) -> list[str]:
    """Ids of the paper's [[config]] entries this run's engine, model (and quantization level) match."""
    out = []
    level = quant_level(meta.get("quant"))
    for c in configs:
        if str(c["engine"]).lower() != str(meta.get("engine") or "").lower():
            continue
        if not model_matches(c.get("model"), meta.get("model_family"), meta.get("model_name")):
            continue
        if with_quant and (level is None or quant_level(c["quant"]) is not level):
            continue
        out.append(c["id"])
    return out


# comparison in expected/paper.toml -> (comparison kind in the tables, plan)
PAPER_COMPARISONS = {"off_rerun": ("off_rerun", "main"), "on_rerun": ("on_rerun", "main"),
                     "on_vs_off": ("on_vs_off", "main"), "on_rerun_cram0": ("on_rerun", "cram0")}


class Paper:
    """expected/paper.toml, indexed for the checker."""

    def __init__(self, doc: dict):
        self.meta, self.configs, self.values = doc["meta"], doc["config"], doc["value"]
        self.config_ids = {c["id"] for c in self.configs}
        self.by_slot: dict[tuple[str, str, str], list[dict]] = {}
        for v in self.values.values():
            if v["reported"] and v.get("config") in self.config_ids and v.get("comparison") in PAPER_COMPARISONS:
                kind, plan = PAPER_COMPARISONS[v["comparison"]]
                self.by_slot.setdefault((v["config"], kind, plan), []).append(v)

    def value(self, key: str) -> dict | None:
        v = self.values.get(key)
        return v if v and v["reported"] else None

    def for_group(self, g: PlanGroup, kind: str) -> list[dict]:
        return [v for cid in paper_configs_for(g.meta, self.configs)
                for v in self.by_slot.get((cid, kind, g.plan), [])]

    def n_of(self, v: dict) -> int:
        return int(v.get("n") or self.meta["episodes"])

    def k_of(self, v: dict) -> int:
        return int(v["k"]) if "k" in v else int(round(v["value"] * self.n_of(v)))


def value_band(r: float, lo: float, hi: float, p0: float, p_lo: float, p_hi: float) -> tuple[float, float]:
    """BAND_RULE: the observed interval [lo, hi] around r widened by the paper's interval [p_lo, p_hi] around p0
    in quadrature (Newcombe 1998, method 10), plus the rounding tolerance."""
    return (r - math.hypot(r - lo, p_hi - p0) - ROUNDING, r + math.hypot(hi - r, p0 - p_lo) + ROUNDING)


def band_verdict(claim: str, s: dict | None, v: dict, paper: Paper, scope: str, evidence: list[str]) -> Verdict:
    n0, k0 = paper.n_of(v), paper.k_of(v)
    p0 = v["value"]
    p_lo, p_hi = wilson_interval(k0, n0)
    expected = f"{pct(p0)} ({v['source']}; paper Wilson 95% {pct(p_lo)}-{pct(p_hi)} at n = {n0})"
    if not s or not s.get("n"):
        return Verdict(claim, scope, "band", NOT_RUN, "not run", expected, "not applicable: not run",
                       evidence or [f"no run of {v['config']} under the plan this value needs"])
    lo, hi = widest_interval(s)
    b_lo, b_hi = value_band(s["rate"], lo, hi, p0, p_lo, p_hi)
    status = PASS if b_lo <= p0 <= b_hi else OUT
    band = f"{pct(max(0.0, b_lo))}-{pct(min(1.0, b_hi))} (observed {pct(lo)}-{pct(hi)} widened by the paper's error)"
    return Verdict(claim, scope, "band", status, fmt_rate(s), expected, band, evidence)


# --- helpers on groups ----------------------------------------------------------------------------------------

def _pair_evidence(g: PlanGroup | None, kind: str, root: Path | None, every: bool = False) -> list[str]:
    """'<name>: <run a> vs <run b>' for the headline comparison of a kind (every one of that kind if asked)."""
    if g is None:
        return []
    pairs = g.pairs(kind) if every else [p for p in [g.headline(kind)] if p is not None]
    return [f"{p.name}: {relative(p.a.path, root)} vs {relative(p.b.path, root)}" for p in pairs]


def _scope(g: PlanGroup) -> str:
    return f"{g.config} / {g.plan}"


def _rollup(details: list[Verdict]) -> str:
    statuses = {d.status for d in details}
    return next((s for s in SEVERITY if s in statuses), NOT_RUN)


def _claim(cid: str, details: list[Verdict], observed: str, expected: str, band: str,
           evidence: list[str], status: str | None = None) -> Claim:
    r = CLAIM_RULES[cid]
    return Claim(cid, r["statement"], r["hard"], r["rule"], status or _rollup(details), observed, expected, band,
                 evidence, details, r["minimum_evidence"])


def _invalid(g: PlanGroup | None) -> list[str]:
    """Why a configuration-plan cannot be used as evidence (its runs' problems and refused pairings)."""
    return [] if g is None else list(g.problems)


def _without_evidence(s: dict | None) -> bool:
    """A comparison that did not run, or compared no episode in which both runs made a request without an error."""
    return s is None or not s.get("n") or not s.get("n_evidence")


def _zero_contradicts(n: int, paper: Paper) -> bool:
    """Whether 0 of n diverging contradicts the smallest ON-vs-OFF rate the paper reports (Wilson upper bound
    below it), i.e. is evidence against 'enabling the cache changes trajectories' rather than too few episodes."""
    v = paper.value("on_vs_off_divergence_min")
    return bool(n) and v is not None and wilson_interval(0, n)[1] < v["value"]


def _power_note(power: float | None) -> str:
    return "power not computable" if power is None else f"power {power:.2f}"


# --- RQ1 ------------------------------------------------------------------------------------------------------

def _off_exposure(offs: list, root: Path | None) -> tuple[int, list[str], list[str]]:
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


def rq1(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details, k_tot, n_tot = [], 0, 0
    for g in tables.groups:
        offs = [r for r in g.runs if r.manifest["arm"] == "off"]
        if not offs:
            continue
        pairs = g.pairs("off_rerun")
        cached, hits, unreported = _off_exposure(offs, root)
        diverged: dict = {}  # episode -> (the first pair it diverges in, its diff)
        for p in pairs:
            for d in p.cmp.diverged:
                diverged.setdefault(d.episode_id, (p, d))
        compared = {d.episode_id for p in pairs for d in p.cmp.episodes}
        evidence = min((p.cmp.n_evidence for p in pairs), default=0)
        invalid = [x for r in offs for x in record_problems(r)] + [why for kind, why in g.refused if kind == "off_rerun"]
        k_tot, n_tot = k_tot + len(diverged), n_tot + len(compared)
        head = g.headline("off_rerun")
        if diverged or hits:
            status, why = FAIL, []
        elif invalid:
            status, why = INVALID, invalid
        elif not pairs:
            status, why = NOT_RUN, ["only one OFF run: no rerun to compare"]
        elif not evidence:
            status, why = INCONCLUSIVE, ["no compared episode in which both OFF runs made a request without an "
                                         "error (runs without requests, or whose requests all failed)"]
        else:
            status, why = PASS, []
        obs = (f"OFF reruns {fmt_rate(head.stats)}" if head else "no OFF pair compared")
        if len(pairs) > 1:
            obs += f"; {len(diverged)}/{len(compared)} episodes diverge in any of the {len(pairs)} OFF pairs"
        obs += f"; cached prompt tokens in OFF runs: {cached}"
        if unreported:
            obs += f" (cache use not reported for {', '.join(unreported)})"
        ev = why + _pair_evidence(g, "off_rerun", root, every=True) + [f"OFF run served cached tokens: {h}" for h in hits]
        mism = sorted({e for p in pairs for e in p.cmp.prompt_mismatches})
        if mism:
            ev.append(f"warning: identical outputs but different prompts in {len(mism)} episode(s) "
                      f"({', '.join(mism[:5])}): a nondeterministic harness")
        ev += [f"diverged: {eid} (request {d.first_request}, token {d.first_token}) in {p.name}"
               for eid, (p, d) in list(diverged.items())[:5]]
        details.append(Verdict("RQ1", _scope(g), "hard", status, obs, "0 diverging episodes, 0 cached tokens",
                               "exact (no tolerance)", ev))
    v = paper.value("off_rerun_divergence_all")
    expected = (f"{v['k']}/{v['n']} diverging episodes over 10 configurations ({v['source']}); "
                "0 cached tokens in OFF runs") if v else "0 diverging episodes"
    n_cfg = sum(d.status in TESTED for d in details)
    observed = (f"{k_tot}/{n_tot} diverging episodes over {n_cfg} configuration-plan(s) with OFF reruns"
                if n_cfg else "no configuration-plan with two valid OFF runs that made requests")
    others = [d for d in details if d.status not in TESTED]
    if others:
        observed += "; " + ", ".join(f"{d.scope}: {d.status}" for d in others)
    failing = [d.scope for d in details if d.status == FAIL]
    ev = [f"FAIL in: {', '.join(failing)}"] if failing else [f"{d.scope}: {d.status}" for d in details]
    return _claim("RQ1", details, observed, expected, "exact: 0 diverging episodes, 0 cached tokens (no tolerance)",
                  ev)


# --- RQ2 and RQ2b ---------------------------------------------------------------------------------------------

def rq2(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details, bands = [], []
    banded: set[str] = set()
    for g in tables.groups:
        s = g.stats.get("on_vs_off")
        if not {"on", "off"} <= {r.manifest["arm"] for r in g.runs}:
            continue  # a plan with one arm only (cram0): no ON-vs-OFF comparison to make
        if any((r.manifest.get("plan_data") or {}).get("server_overrides") for r in g.runs):
            continue  # a mitigation plan (server_overrides) is meant to remove the divergence: judged in "beyond"
        on_r, off_r = g.stats.get("on_rerun"), g.stats.get("off_rerun")
        reasons = []
        invalid = _invalid(g)
        if invalid:
            status, reasons = INVALID, invalid
        elif _without_evidence(s):
            status, reasons = INCONCLUSIVE, ["ON vs OFF compared no episode in which both runs made a request "
                                             "without an error" if s else "no valid ON-vs-OFF pair"]
        else:
            contradicted = False
            if not s["k"]:
                reasons.append(f"ON vs OFF diverged in 0 of {s['n']} episodes")
                contradicted = _zero_contradicts(s["n"], paper)
                if not contradicted:
                    reasons.append(f"0/{s['n']} is too few episodes to contradict the paper's smallest ON-vs-OFF "
                                   "rate (its Wilson 95% upper bound is above it)")
            for name, kind, other in (("ON rerun", "on_rerun", on_r), ("OFF rerun", "off_rerun", off_r)):
                if s["k"] and not _without_evidence(other) and not s["rate"] > other["rate"]:
                    below, test = _rerun_above(g.headline(kind), g.headline("on_vs_off"))
                    contradicted |= below
                    reasons.append(f"ON vs OFF ({pct(s['rate'])}) not above the {name} ({pct(other['rate'])}); "
                                   + (f"the {name} diverges significantly more, {test}" if below else
                                      f"not significantly below it either, {test}: a tie or too few episodes"))
            missing = [name for name, other in (("ON rerun", on_r), ("OFF rerun", off_r)) if _without_evidence(other)]
            if contradicted:
                status = FAIL
            elif reasons:
                status = INCONCLUSIVE
            elif missing:
                status = INCONCLUSIVE
                reasons.append(f"the {' and the '.join(missing)} the rule compares against did not run (or compared "
                               "no episode)")
            else:
                status = PASS
        obs = f"ON vs OFF {fmt_rate(s)}; ON rerun {fmt_rate(on_r)}; OFF rerun {fmt_rate(off_r)}"
        matched = paper_configs_for(g.meta, paper.configs)
        if matched:
            band = f"value band: see the band rows for {', '.join(matched)}"
        else:
            band = "no value band: not a configuration the paper measured"
        details.append(Verdict("RQ2", _scope(g), "direction", status, obs,
                               "ON vs OFF > 0 and > same-arm reruns (paper: 36.2-91.2% ON vs OFF, "
                               "8.8-77.5% ON reruns, across its configurations)", band,
                               reasons + _pair_evidence(g, "on_vs_off", root) + _pair_evidence(g, "on_rerun", root)
                               + _pair_evidence(g, "off_rerun", root)))
        for kind in ("on_vs_off", "on_rerun"):
            for v in paper.for_group(g, kind):
                banded.add(v["key"])
                if invalid:
                    continue
                bands.append(band_verdict("RQ2", g.stats.get(kind), v, paper,
                                          f"{v['config']} {kind.replace('_', ' ')} ({_scope(g)})",
                                          _pair_evidence(g, kind, root)))
    # paper values for configurations that did not run
    for (cid, kind, plan), vs in sorted(paper.by_slot.items()):
        if kind in ("on_vs_off", "on_rerun") and plan == PAPER_PLAN:
            for v in vs:
                if v["key"] not in banded:
                    bands.append(band_verdict("RQ2", None, v, paper, f"{cid} {kind.replace('_', ' ')}",
                                              [f"no {plan}-plan run of {cid} in these results"]))
    directions = [d for d in details if d.kind == "direction"]
    n_pass = sum(d.status == PASS for d in directions)
    compared = [b for b in bands if b.status != NOT_RUN]
    observed = (f"direction holds in {n_pass}/{len(directions)} configuration-plan(s); "
                f"{len(compared)}/{len(bands)} paper values compared "
                f"({sum(b.status == OUT for b in compared)} out of band)") if directions else "no run with both arms"
    others = [d for d in directions if d.status not in TESTED]
    if others:
        observed += "; " + ", ".join(f"{d.scope}: {d.status}" for d in others)
    ev = [f"{d.scope}: {d.status}" for d in details] + [f"{b.scope}: {b.status}" for b in compared]
    status = _rollup(directions + compared) if directions else NOT_RUN
    return _claim("RQ2", details + bands, observed, "ON vs OFF > 0 and above same-arm reruns; paper values per "
                  "configuration where reported", "direction: strict; magnitude: BAND_RULE", ev, status)


def _rerun_above(rerun: Pair, on_vs_off: Pair) -> tuple[bool, str]:
    """Whether a rerun diverges in significantly more episodes than ON vs OFF (exact McNemar over the episodes both
    compared, two-sided at ALPHA), and the test in words."""
    n, b, c = _paired_flags(rerun, on_vs_off)
    p = mcnemar_exact(b, c)
    return b > c and p < ALPHA, (f"exact McNemar over {n} paired episodes: {b} diverged in the rerun only, {c} in "
                                 f"ON vs OFF only, p = {fmt_p(p)}")


def _paired_flags(x: Pair, y: Pair) -> tuple[int, int, int]:
    """Over the episodes both comparisons compared: (n, b, c), b = diverged in x only, c = diverged in y only."""
    fx = {d.episode_id: d.diverged for d in x.cmp.episodes}
    fy = {d.episode_id: d.diverged for d in y.cmp.episodes}
    common = [e for e in fx if e in fy]
    return (len(common), sum(fx[e] and not fy[e] for e in common), sum(fy[e] and not fx[e] for e in common))


def rq2b(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details = []
    for g in tables.groups:
        if g.plan not in ("cram0", "fresh"):
            continue
        pair = g.headline("on_rerun")
        base_g = tables.group(g.config, PAPER_PLAN)
        base = base_g.headline("on_rerun") if base_g else None
        if pair is None and not _invalid(g):
            continue
        what = "host prompt cache off" if g.plan == "cram0" else "new server per run"
        s, bs = (pair.stats if pair else None), (base.stats if base else None)
        obs = f"ON reruns ({what}) {fmt_rate(s)}; default ON reruns {fmt_rate(bs)}"
        invalid = _invalid(g) + _invalid(base_g)
        if invalid:
            status, why = INVALID, invalid
        elif base is None:
            status, why = NOT_RUN, ["the default ON reruns (plan main) of this configuration did not run: nothing "
                                    "to compare with"]
        elif _without_evidence(s) or _without_evidence(bs):
            status, why = INCONCLUSIVE, ["the reruns compared no episode in which both runs made a request without "
                                         "an error"]
        else:
            n, b, c = _paired_flags(base, pair)
            p = mcnemar_exact(b, c)
            rate = bs["rate"]
            power = mcnemar_power(n, rate, rate) if n and rate else None
            obs += (f"; paired over {n} episodes: {b} agree only with the layer off, {c} only by default, exact "
                    f"McNemar p = {fmt_p(p)}; {_power_note(power)} to detect full agreement")
            if b > c and p < ALPHA:
                status, why = PASS, [f"reruns diverge less with the {what} (p = {fmt_p(p)} < {ALPHA})"]
            elif not bs["k"]:
                status, why = INCONCLUSIVE, ["the default ON reruns do not diverge: nothing for the host prompt "
                                             "cache to explain"]
            elif power is not None and power >= MIN_POWER:
                status, why = FAIL, [f"reruns did not come into agreement (p = {fmt_p(p)}) although the data had "
                                     f"power {power:.2f} to show it"]
            else:
                status, why = INCONCLUSIVE, [f"no significant reduction (p = {fmt_p(p)}) and too little power "
                                             f"({_power_note(power)} < {MIN_POWER}) to count that against the paper"]
        ev = why + _pair_evidence(g, "on_rerun", root) + _pair_evidence(base_g, "on_rerun", root)
        details.append(Verdict("RQ2b", _scope(g), "direction", status, obs,
                               "ON reruns agree (paper: 79/80 with --cache-ram 0, vs 38.8% default)",
                               "paired McNemar p < 0.05 for PASS; power >= 0.80 for FAIL", ev))
        for v in paper.for_group(g, "on_rerun") if g.plan == "cram0" and not invalid else []:
            details.append(band_verdict("RQ2b", s, v, paper, f"{v['config']} ON reruns, --cache-ram 0 ({_scope(g)})",
                                        _pair_evidence(g, "on_rerun", root)))
    v = paper.value("fig1_on_rerun_cram0")
    if v and not any(d.kind == "band" for d in details):
        details.append(band_verdict("RQ2b", None, v, paper, f"{v['config']} ON reruns, --cache-ram 0",
                                    [f"no cram0-plan run of {v['config']} in these results"]))
    directions = [d for d in details if d.kind == "direction"]
    status = _rollup(directions + [d for d in details if d.kind == "band" and d.status != NOT_RUN]) \
        if directions else NOT_RUN
    observed = "; ".join(f"{d.scope}: {d.observed}" for d in directions) or "no cram0 or fresh ON reruns"
    return _claim("RQ2b", details, observed, "79/80 ON reruns agree with --cache-ram 0 (Fig. 1, §IV-C)",
                  "paired McNemar against the default ON reruns; magnitude: BAND_RULE for Qwen2.5-7B Q4_K_M",
                  [f"{d.scope}: {d.status}" for d in details], status)


# --- RQ3 ------------------------------------------------------------------------------------------------------

def rq3(tables: Tables, paper: Paper) -> Claim:
    details = []
    trend = tables.fig2_trend
    paper_n = int(paper.meta["episodes"])
    for _, t in (trend.iterrows() if not trend.empty else []):
        rows = tables.fig2[tables.fig2["series"] == t["series"]]
        meta = {"engine": rows["engine"].iloc[0], "model_family": rows["model_family"].iloc[0],
                "model_name": rows["model_name"].iloc[0]}
        ids = paper_configs_for(meta, paper.configs, with_quant=False)
        expected = "z > 0, p < 0.05"
        direction_only = False  # the paper's own rates for this series are not significant: ask only for z > 0
        if any(i.startswith("qwen2.5-7b/llama.cpp/") for i in ids):
            z, p = paper.value("trend_z_qwen2.5-7b"), paper.value("trend_p_qwen2.5-7b")
            if z and p:
                expected = f"z = {z['value']}, p = {p['value']:.2g} ({z['source']}; levels F16, Q8_0, Q4_K_M, Q3_K_M)"
        elif any(i.startswith("llama-3.1-8b/llama.cpp/") for i in ids):
            expected = "rising: Q8_0 55.0% -> Q4_K_M 70.0% -> Q3_K_M 68.8% (Tab. 2; no test reported)"
            vals = [paper.value(f"on_vs_off_llama-3.1-8b_{q}") for q in ("Q8_0", "Q4_K_M", "Q3_K_M")]
            if all(vals):
                z, p = cochran_armitage([paper.k_of(v) for v in vals], [paper.n_of(v) for v in vals])
                expected += (f"; computed here, the same test on those values gives z = {z:.2f}, p = {p:.2g}, "
                             "so this series would not reach 0.05 even at the paper's own rates")
                direction_only = p >= ALPHA
        obs = f"{t['levels']}: k = {t['k']} of n = {t['n']}" if t["n_levels"] else "no known quantization level"
        groups = [tables.group(c, PAPER_PLAN) for c in rows["config"]]
        invalid = [x for g in groups for x in _invalid(g)]
        at_scale = bool(len(rows)) and bool((rows["div_n"] >= paper_n).all())
        why = []
        testable = t["n_levels"] >= 3 and t["z"] is not None and not pd.isna(t["z"])
        if invalid and testable:
            status, why = INVALID, invalid
        elif testable:
            obs += f"; Cochran-Armitage z = {t['z']:.2f}, p = {fmt_p(t['p'])}"
            if t["z"] > 0 and (direction_only or t["p"] < ALPHA):
                status = PASS
            elif t["z"] < 0 and t["p"] < ALPHA:
                status, why = FAIL, ["significant trend the other way (z < 0, p < 0.05)"]
            elif ids and at_scale:
                status, why = FAIL, [f"a series the paper measured, at the paper's scale (>= {paper_n} episodes per "
                                     "level), without the paper's trend"]
            else:
                status = INCONCLUSIVE
                why = [("trend not significant" if not direction_only else "no rising direction") + (
                    f" on fewer than the paper's {paper_n} episodes per level" if ids else
                    " on a model and engine the paper did not measure: no evidence against the paper")]
        else:
            status = NOT_RUN
            obs += f" ({t['n_levels']} known level(s); the test needs >= 3)"
            if t.get("unknown_levels"):
                obs += f"; not in the quantization order: {t['unknown_levels']}"
        ev = why + [f"configs: {', '.join(rows['config'])} (plan main, ON run 1 vs OFF run 1)"]
        if t.get("unknown_levels"):
            ev.append(f"levels not in QUANT_LEVELS, left out: {t['unknown_levels']}")
        rule = ("z > 0 (direction only: the paper's own rates for this series are not significant)"
                if direction_only else "significance at 0.05, z > 0 (no band on z)")
        details.append(Verdict("RQ3", str(t["series"]), "trend", status, obs, expected, rule, ev))
    tested = [d for d in details if d.status != NOT_RUN]
    observed = "; ".join(f"{d.scope}: {d.status}: {d.observed}" for d in tested) or \
        "no model with >= 3 quantization levels run"
    if len(tested) < len(details):
        observed += f" ({len(details) - len(tested)} series with < 3 levels not tested)"
    return _claim("RQ3", details, observed, "Qwen2.5-7B llama.cpp: z = 5.68, p = 1.3e-8 (§IV-D)",
                  "trend significant at 0.05 with >= 3 levels", [f"{d.scope}: {d.status}" for d in details])


# --- RQ4 ------------------------------------------------------------------------------------------------------

def rq4(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details = []
    for g in tables.groups:
        if str(g.meta["engine"]).lower() != "vllm":
            continue
        off, onoff = g.stats.get("off_rerun"), g.stats.get("on_vs_off")
        obs = f"OFF reruns {fmt_rate(off)}; ON vs OFF {fmt_rate(onoff)}"
        invalid = _invalid(g)
        why = []
        if invalid:
            status, why = INVALID, invalid
        elif off is None or onoff is None:
            status = NOT_RUN
        elif _without_evidence(off) or _without_evidence(onoff):
            status, why = INCONCLUSIVE, ["a comparison holds no episode in which both runs made a request without "
                                         "an error"]
        elif off["k"]:
            status, why = FAIL, ["the OFF reruns diverge"]
        elif onoff["k"]:
            status = PASS
        elif _zero_contradicts(onoff["n"], paper):
            status, why = FAIL, [f"ON vs OFF diverged in 0 of {onoff['n']} episodes"]
        else:
            status, why = INCONCLUSIVE, [f"ON vs OFF 0/{onoff['n']}: too few episodes to contradict the paper"]
        details.append(Verdict("RQ4", _scope(g), "direction", status, obs,
                               "OFF reruns 0 diverging; ON vs OFF > 0", "direction only (model not named by the paper)",
                               why + _pair_evidence(g, "off_rerun", root) + _pair_evidence(g, "on_vs_off", root)))
    ctx = [paper.value(k) for k in ("on_rerun_vllm_16bit", "on_rerun_vllm_16bit_other_session", "on_vs_off_vllm_16bit")]
    expected = ("OFF reruns identical, ON vs OFF > 0; paper vLLM 16-bit: ON reruns "
                f"{pct(ctx[0]['value'])} / {pct(ctx[1]['value'])}, ON vs OFF {pct(ctx[2]['value'])} (§IV-E, Tab. 2)"
                if all(ctx) else "OFF reruns identical, ON vs OFF > 0")
    if not details:
        return _claim("RQ4", [], "no vLLM runs", expected, "direction only",
                      ["no run with engine = vllm in these results: `./run.sh demo --vllm` makes them on a CPU "
                       "(vLLM 0.11.0 CPU build), `./run.sh all` on a GPU host"],
                      NOT_RUN)
    return _claim("RQ4", details, "; ".join(f"{d.scope}: {d.observed}" for d in details), expected,
                  "direction only", [f"{d.scope}: {d.status}" for d in details])


# --- RQ5 ------------------------------------------------------------------------------------------------------

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
        return _claim("RQ5", [], "no GSM8K bridge runs", expected, band,
                      ["no run with workload = gsm8k and arm = bridge in these results"], NOT_RUN)
    missing = [c for c in TAB3_COLUMNS if c not in tab3.columns]
    if missing:
        return _claim("RQ5", [], "Tab. 3 could not be read", expected, band,
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
            details.append(Verdict("RQ5", str(r["config"]), "direction", NOT_RUN, f"{r['data']} items: {obs}",
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
        details.append(Verdict("RQ5", str(r["config"]), "direction", status, obs,
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
                f"{_power_note(power)} to detect a 1 pp net accuracy shift over {n} items (below {MIN_POWER}): "
                "'no significant shift' on so few items is no evidence"]
        elif not (b and c):
            status, reasons = FAIL, ["flips do not go both ways"]
        else:
            status, reasons = PASS, [f"sum over Tab. 3 rows {', '.join(j[3] for j in judged)}"]
        details.append(Verdict("RQ5", f"pooled over {len(judged)} GSM8K configuration(s)", "pooled", status,
                               f"{n} items, {b + c} flips: {b} cache / {c} recompute, McNemar p = {fmt_p(p)}, "
                               f"{_power_note(power)} for a 1 pp shift", expected, band, reasons))
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
    return _claim("RQ5", details, observed, expected, band, ev, status)


# --- all claims -----------------------------------------------------------------------------------------------

def evaluate_claims(tables: Tables, tab3: pd.DataFrame | None = None, *, root: Path | None = None,
                    expected_path: Path | None = None) -> list[Claim]:
    paper = Paper(load_document(expected_path))
    invalid_bridge: dict[str, list[str]] = {}
    if not tables.runs.empty and "problems" in tables.runs.columns:
        for _, r in tables.runs[(tables.runs["arm"] == "bridge") & tables.runs["problems"].notna()].iterrows():
            invalid_bridge.setdefault(str(r["config"]), []).append(str(r["problems"]))
    return [rq1(tables, paper, root), rq2(tables, paper, root), rq2b(tables, paper, root), rq3(tables, paper),
            rq4(tables, paper, root), rq5(tab3, paper, invalid_bridge)]


def annotate_with_paper(tables: Tables, expected_path: Path | None = None) -> None:
    """Add the paper's value (and its source) beside the observed rates of Tab. 2, Fig. 1 and Fig. 2."""
    paper = Paper(load_document(expected_path))

    def lookup(config: str, plan: str, kind: str) -> tuple[float | None, str | None]:
        g = tables.group(config, plan)
        vs = paper.for_group(g, kind) if g else []
        if not vs and g is None:  # a condition that did not run: look up by the configuration's identity
            other = next((x for x in tables.groups if x.config == config), None)
            if other is not None:
                ids = paper_configs_for(other.meta, paper.configs)
                vs = [v for cid in ids for v in paper.by_slot.get((cid, kind, plan), [])]
        return (vs[0]["value"], f"{vs[0]['source']} ({vs[0]['key']})") if vs else (None, None)

    if not tables.tab2.empty:
        tables.tab2["paper_config"] = [", ".join(paper_configs_for(g.meta, paper.configs)) or None
                                       for g in tables.groups]
        for kind in ("on_vs_off", "on_rerun"):
            vals = [lookup(g.config, g.plan, kind) for g in tables.groups]
            tables.tab2[f"paper_{kind}"] = [v for v, _ in vals]
    for df in (tables.fig1, tables.fig2):
        if df.empty:
            df["paper_value"], df["paper_source"] = [], []
            continue
        plan_col = df["plan"] if "plan" in df.columns else [PAPER_PLAN] * len(df)
        kind_col = df["comparison"] if "comparison" in df.columns else ["on_vs_off"] * len(df)
        vals = [lookup(c, p, k) for c, p, k in zip(df["config"], plan_col, kind_col)]
        df["paper_value"] = [v for v, _ in vals]
        df["paper_source"] = [s for _, s in vals]
