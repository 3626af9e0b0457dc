"""Verdicts on the paper's claims (RQ1-RQ5) from the tables, with the rule for each written down as data.

A claim's status is one of
  PASS         the claim holds on these results;
  FAIL         the results contradict it;
  OUT-OF-BAND  the direction holds but a rate differs from the paper's value for the same configuration by more
               than sampling error allows (`BAND_RULE`); a statement about magnitude, never a failure;
  NOT-RUN      the runs the claim needs are not in the results (hardware, models, plans or data not run).
A claim that needs runs which did not happen is NOT-RUN, never PASS. RQ1 is the only hard claim: its FAIL makes
`./run.sh check` exit non-zero. `CLAIM_RULES` and `BAND_RULE` are the text ARTIFACT.md quotes.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from artifact.analysis.stats import cochran_armitage, mcnemar_exact, wilson_interval
from artifact.analysis.tables import (
    PAPER_PLAN, PlanGroup, Tables, exposure, quant_level, relative, widest_interval,
)
from artifact.check.expected import load_document

PASS, FAIL, OUT, NOT_RUN = "PASS", "FAIL", "OUT-OF-BAND", "NOT-RUN"
STATUSES = (PASS, FAIL, OUT, NOT_RUN)
ALPHA = 0.05
ROUNDING = 0.0005  # the paper prints percentages to one decimal: 0.05 percentage points

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
        "rule": "Every configuration-plan with two complete cache-OFF runs: 0 episodes diverge (an episode diverges "
                "when any generated token id or the number of requests differs), and no OFF run of any plan was "
                "served a cached prompt token (cache_n = 0 on every request). No tolerance: bit-identity is exact, "
                "and one diverging episode means a source of nondeterminism escaped the protocol's control (paper: "
                "0/800). An engine that does not report cache use (null cache_n) is shown as 'cache use not "
                "reported', never as 0. A FAIL, like invalid results, makes check exit 1.",
    },
    "RQ2": {
        "statement": "Enabling the cache changes trajectories: ON-vs-OFF divergence > 0 and above same-arm rerun "
                     "divergence.",
        "hard": False,
        "rule": "Direction, per configuration-plan with both arms: the headline ON-vs-OFF divergence (ON run 1 vs "
                "OFF run 1) is > 0 and strictly above the ON rerun and the OFF rerun divergence where those ran "
                "(a comparison of rates, as the paper makes it; no significance test). Applies to any "
                "configuration, the demo included. Magnitude: the value band (BAND_RULE) for each ON-vs-OFF and "
                "ON-rerun rate the paper reports for a named configuration; NOT-RUN where that configuration did "
                "not run.",
    },
    "RQ2b": {
        "statement": "With the host prompt cache off, or the cache state reset between runs, cache-ON reruns agree "
                     "(paper: 79/80).",
        "hard": False,
        "rule": "Per configuration with cache-ON reruns under --cache-ram 0 (plan cram0) or a new server per run "
                "(plan fresh): PASS if those reruns diverge in 0 episodes, or in a smaller share than the default "
                "cache-ON reruns (plan main) of the same configuration; FAIL if they diverge at least as often; "
                "NOT-RUN if they diverge and the default ON reruns did not run (nothing to compare with). The "
                "paper's 1/80 (Qwen2.5-7B Q4_K_M, llama.cpp) gets a value band (BAND_RULE) for that configuration.",
    },
    "RQ3": {
        "statement": "Coarser quantization amplifies ON-vs-OFF divergence (trend test significant at 0.05).",
        "hard": False,
        "rule": "Per model and engine under plan main, where >= 3 quantization levels ran: Cochran-Armitage test "
                "of the ON-vs-OFF divergence (run 1 vs run 1) across levels ordered finest to coarsest by "
                "tables.QUANT_LEVELS, scores 0..m-1 over the levels that ran (the paper does not report its "
                "scores). PASS if z > 0 and two-sided p < 0.05, FAIL otherwise; NOT-RUN with fewer than 3 levels. "
                "Exception: for a series whose own paper rates would not reach p < 0.05 under this test "
                "(Llama-3.1-8B: 44, 56, 55 of 80 give z = 1.82, p = 0.069), only the direction z > 0 is required, "
                "so that an exact reproduction of the paper cannot FAIL. "
                "No band on z: it depends on which levels ran and on the scores.",
    },
    "RQ4": {
        "statement": "vLLM shows the same direction: OFF reruns identical, ON-vs-OFF divergence > 0.",
        "hard": False,
        "rule": "Per vLLM configuration-plan: PASS if its cache-OFF reruns diverge in 0 episodes and its ON-vs-OFF "
                "divergence is > 0; FAIL otherwise; NOT-RUN if either comparison is missing, and NOT-RUN without "
                "vLLM runs (they need a GPU host with vLLM 0.11.0). The paper's vLLM values (8.8% and 27.5% ON "
                "reruns in two sessions, 62.5% ON vs OFF) are context, not a band: the summary does not name the "
                "model.",
    },
    "RQ5": {
        "statement": "GSM8K answers flip both ways without a significant accuracy shift (McNemar p > 0.05); each "
                     "path is internally deterministic.",
        "hard": False,
        "rule": "From Tab. 3 (GSM8K bridge; answers re-scored numerically from the stored text). Per "
                "configuration: both paths internally deterministic (cold1 = cold2 and warm1 = warm2 token ids on "
                "every counted item) and exact McNemar p > 0.05 on its cache/recompute flips. Pooled over the "
                "configurations: flips in both directions (>= 1 each way) and exact McNemar p > 0.05. PASS if all "
                "hold, FAIL otherwise. NOT-RUN without bridge runs, and NOT-RUN when only synthetic items ran: the "
                "artifact's generated arithmetic problems are not GSM8K (their difficulty and answer forms set the "
                "accuracy and the flip count), so they exercise the pipeline but are no evidence for or against "
                "the paper's GSM8K result; their numbers are shown as observed values. Tab. 3's per-quantization "
                "rates get no band: the summary does not name their model or engine.",
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

def _pair_evidence(g: PlanGroup, kind: str, root: Path | None) -> list[str]:
    p = g.headline(kind)
    if p is None:
        return []
    arms = {"off_rerun": (("off", 1), ("off", 2)), "on_rerun": (("on", 1), ("on", 2)),
            "on_vs_off": (("on", p.k), ("off", p.k))}[kind]
    runs = [g.run(a, k) for a, k in arms]
    return [f"{p.name}: " + " vs ".join(relative(r.path, root) for r in runs if r is not None)]


def _scope(g: PlanGroup) -> str:
    return f"{g.config} / {g.plan}"


def _rollup(details: list[Verdict]) -> str:
    statuses = {d.status for d in details}
    for s in (FAIL, OUT, PASS):
        if s in statuses:
            return s
    return NOT_RUN


def _claim(cid: str, details: list[Verdict], observed: str, expected: str, band: str,
           evidence: list[str], status: str | None = None) -> Claim:
    r = CLAIM_RULES[cid]
    return Claim(cid, r["statement"], r["hard"], r["rule"], status or _rollup(details), observed, expected, band,
                 evidence, details)


# --- RQ1 ------------------------------------------------------------------------------------------------------

def rq1(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details, k_tot, n_tot = [], 0, 0
    for g in tables.groups:
        offs = [r for r in g.runs if r.complete and r.manifest["arm"] == "off"]
        if not offs:
            continue
        s = g.stats.get("off_rerun")
        cached, unreported, hits = 0, [], []
        for r in offs:
            e = exposure(r)
            if e is None:
                unreported.append(r.label)
            elif e.cached_tokens or e.requests_with_cache:
                cached += e.cached_tokens
                hits.append(f"{relative(r.path, root)}: {e.requests_with_cache} requests, {e.cached_tokens} cached tokens")
        if s is not None:
            k_tot, n_tot = k_tot + s["k"], n_tot + s["n"]
        diverged = s is not None and s["k"] > 0
        status = FAIL if diverged or hits else (PASS if s is not None and s["n"] else NOT_RUN)
        obs = f"OFF reruns {fmt_rate(s)}" if s else "only one complete OFF run: no rerun to compare"
        obs += f"; cached prompt tokens in OFF runs: {cached}"
        if unreported:
            obs += f" (cache use not reported by the engine for {', '.join(unreported)})"
        ev = _pair_evidence(g, "off_rerun", root) + [f"OFF run served cached tokens: {h}" for h in hits]
        p = g.headline("off_rerun")
        if p is not None and p.cmp.prompt_mismatches:
            ev.append(f"warning: identical outputs but different prompts in {len(p.cmp.prompt_mismatches)} "
                      f"episode(s) ({', '.join(p.cmp.prompt_mismatches[:5])}): a nondeterministic harness")
        if diverged and p is not None:
            ev += [f"diverged: {d.episode_id} (request {d.first_request}, token {d.first_token})"
                   for d in p.cmp.diverged[:5]]
        details.append(Verdict("RQ1", _scope(g), "hard", status, obs, "0 diverging episodes, 0 cached tokens",
                               "exact (no tolerance)", ev))
    v = paper.value("off_rerun_divergence_all")
    expected = (f"{v['k']}/{v['n']} diverging episodes over 10 configurations ({v['source']}); "
                "0 cached tokens in OFF runs") if v else "0 diverging episodes"
    n_cfg = sum(d.status != NOT_RUN for d in details)
    observed = (f"{k_tot}/{n_tot} diverging episodes over {n_cfg} configuration-plan(s) with OFF reruns"
                if n_cfg else "no configuration with two complete OFF runs")
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
        if s is None:
            continue
        on_r, off_r = g.stats.get("on_rerun"), g.stats.get("off_rerun")
        reasons = []
        if not s["k"]:
            reasons.append("ON vs OFF diverged in 0 episodes")
        for name, other in (("ON rerun", on_r), ("OFF rerun", off_r)):
            if other is not None and other["n"] and s["rate"] is not None and not s["rate"] > other["rate"]:
                reasons.append(f"ON vs OFF ({pct(s['rate'])}) not above the {name} ({pct(other['rate'])})")
        status = NOT_RUN if not s["n"] else (FAIL if reasons else PASS)
        obs = f"ON vs OFF {fmt_rate(s)}; ON rerun {fmt_rate(on_r)}; OFF rerun {fmt_rate(off_r)}"
        matched = paper_configs_for(g.meta, paper.configs)
        if matched:
            band = f"value band: see the band rows for {', '.join(matched)}"
        else:
            band = "no value band: not a configuration the paper measured"
        details.append(Verdict("RQ2", _scope(g), "direction", status, obs,
                               "ON vs OFF > 0 and > same-arm reruns (paper: 36.2-91.2% ON vs OFF, "
                               "8.8-77.5% ON reruns, across its configurations)", band,
                               reasons + _pair_evidence(g, "on_vs_off", root) + _pair_evidence(g, "on_rerun", root)))
        for kind in ("on_vs_off", "on_rerun"):
            for v in paper.for_group(g, kind):
                banded.add(v["key"])
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
    ev = [f"{d.scope}: {d.status}" for d in details] + [f"{b.scope}: {b.status}" for b in compared]
    status = _rollup(directions) if directions else NOT_RUN
    if status == PASS and any(b.status == OUT for b in bands):
        status = OUT
    return _claim("RQ2", details + bands, observed, "ON vs OFF > 0 and above same-arm reruns; paper values per "
                  "configuration where reported", "direction: strict; magnitude: BAND_RULE", ev, status)


def rq2b(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details = []
    for g in tables.groups:
        if g.plan not in ("cram0", "fresh"):
            continue
        s = g.stats.get("on_rerun")
        if s is None:
            continue
        base_g = tables.group(g.config, PAPER_PLAN)
        base = base_g.stats.get("on_rerun") if base_g else None
        what = "host prompt cache off" if g.plan == "cram0" else "new server per run"
        obs = f"ON reruns ({what}) {fmt_rate(s)}; default ON reruns {fmt_rate(base)}"
        if not s["n"]:
            status, why = NOT_RUN, "the two runs have no episode in common"
        elif s["k"] == 0:
            status, why = PASS, "reruns agree on every episode"
        elif base is None or not base["n"]:
            status, why = NOT_RUN, "reruns diverge and the default ON reruns (plan main) did not run"
        elif s["rate"] < base["rate"]:
            status, why = PASS, "fewer diverging reruns than with the default"
        else:
            status, why = FAIL, "diverging reruns not fewer than with the default"
        ev = [why] + _pair_evidence(g, "on_rerun", root) + (_pair_evidence(base_g, "on_rerun", root) if base_g else [])
        details.append(Verdict("RQ2b", _scope(g), "direction", status, obs,
                               "ON reruns agree (paper: 79/80 with --cache-ram 0, vs 38.8% default)",
                               "0 diverging, or fewer than the default ON reruns", ev))
        for v in paper.for_group(g, "on_rerun") if g.plan == "cram0" else []:
            details.append(band_verdict("RQ2b", s, v, paper, f"{v['config']} ON reruns, --cache-ram 0 ({_scope(g)})",
                                        _pair_evidence(g, "on_rerun", root)))
    v = paper.value("fig1_on_rerun_cram0")
    if v and not any(d.kind == "band" for d in details):
        details.append(band_verdict("RQ2b", None, v, paper, f"{v['config']} ON reruns, --cache-ram 0",
                                    [f"no cram0-plan run of {v['config']} in these results"]))
    directions = [d for d in details if d.kind == "direction"]
    status = _rollup(directions)
    if status == PASS and any(d.status == OUT for d in details):
        status = OUT
    observed = "; ".join(f"{d.scope}: {d.observed}" for d in directions) or "no cram0 or fresh ON reruns"
    return _claim("RQ2b", details, observed, "79/80 ON reruns agree with --cache-ram 0 (Fig. 1, §IV-C)",
                  "direction: 0 or fewer than default; magnitude: BAND_RULE for Qwen2.5-7B Q4_K_M",
                  [f"{d.scope}: {d.status}" for d in details], status)


# --- RQ3 ------------------------------------------------------------------------------------------------------

def rq3(tables: Tables, paper: Paper) -> Claim:
    details = []
    trend = tables.fig2_trend
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
        if t["n_levels"] >= 3 and t["z"] is not None and not pd.isna(t["z"]):
            status = PASS if t["z"] > 0 and (direction_only or t["p"] < ALPHA) else FAIL
            obs += f"; Cochran-Armitage z = {t['z']:.2f}, p = {fmt_p(t['p'])}"
        else:
            status = NOT_RUN
            obs += f" ({t['n_levels']} known level(s); the test needs >= 3)"
            if t.get("unknown_levels"):
                obs += f"; not in the quantization order: {t['unknown_levels']}"
        ev = [f"configs: {', '.join(rows['config'])} (plan main, ON run 1 vs OFF run 1)"]
        if t.get("unknown_levels"):
            ev.append(f"levels not in QUANT_LEVELS, left out: {t['unknown_levels']}")
        rule = ("z > 0 (direction only: the paper's own rates for this series are not significant)"
                if direction_only else "significance at 0.05, z > 0 (no band on z)")
        details.append(Verdict("RQ3", str(t["series"]), "trend", status, obs, expected, rule, ev))
    tested = [d for d in details if d.status != NOT_RUN]
    observed = "; ".join(f"{d.scope}: {d.observed}" for d in tested) or "no model with >= 3 quantization levels run"
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
        if off is None or onoff is None or not off["n"] or not onoff["n"]:
            status = NOT_RUN
        else:
            status = PASS if off["k"] == 0 and onoff["k"] > 0 else FAIL
        details.append(Verdict("RQ4", _scope(g), "direction", status, obs,
                               "OFF reruns 0 diverging; ON vs OFF > 0", "direction only (model not named by the paper)",
                               _pair_evidence(g, "off_rerun", root) + _pair_evidence(g, "on_vs_off", root)))
    ctx = [paper.value(k) for k in ("on_rerun_vllm_16bit", "on_rerun_vllm_16bit_other_session", "on_vs_off_vllm_16bit")]
    expected = ("OFF reruns identical, ON vs OFF > 0; paper vLLM 16-bit: ON reruns "
                f"{pct(ctx[0]['value'])} / {pct(ctx[1]['value'])}, ON vs OFF {pct(ctx[2]['value'])} (§IV-E, Tab. 2)"
                if all(ctx) else "OFF reruns identical, ON vs OFF > 0")
    if not details:
        return _claim("RQ4", [], "no vLLM runs", expected, "direction only",
                      ["no run with engine = vllm in these results (vLLM needs a GPU host and the vLLM image)"],
                      NOT_RUN)
    return _claim("RQ4", details, "; ".join(f"{d.scope}: {d.observed}" for d in details), expected,
                  "direction only", [f"{d.scope}: {d.status}" for d in details])


# --- RQ5 ------------------------------------------------------------------------------------------------------

TAB3_COLUMNS = ("config", "status", "data", "n", "cold_identical", "warm_identical",
                "flips_numeric_cache", "flips_numeric_recompute", "mcnemar_p")


def rq5(tab3: pd.DataFrame | None, paper: Paper) -> Claim:
    flips = [paper.value(k) for k in ("gsm8k_flips", "gsm8k_flips_favor_cache", "gsm8k_flips_favor_recompute",
                                      "gsm8k_mcnemar_p")]
    expected = (f"{flips[0]['value']} flips, {flips[1]['value']} favour cache vs {flips[2]['value']} recompute, "
                f"McNemar p = {flips[3]['value']}; cold 200/200, warm 200/200 per configuration (§IV-F, Tab. 3)"
                if all(flips) else "flips both ways, McNemar p > 0.05, paths deterministic")
    band = "p > 0.05, >= 1 flip each way, internal identity n/n"
    if tab3 is None or tab3.empty:
        return _claim("RQ5", [], "no GSM8K bridge runs", expected, band,
                      ["no run with workload = gsm8k and arm = bridge in these results"], NOT_RUN)
    missing = [c for c in TAB3_COLUMNS if c not in tab3.columns]
    if missing:
        return _claim("RQ5", [], "Tab. 3 could not be read", expected, band,
                      [f"Tab. 3 lacks column(s) {', '.join(missing)}"], NOT_RUN)
    rows = tab3[(tab3["config"] != "pooled") & (tab3["status"] == "complete")]
    details = []
    for _, r in rows.iterrows():
        n = int(r["n"])
        b, c = int(r["flips_numeric_cache"]), int(r["flips_numeric_recompute"])
        obs = (f"cold {int(r['cold_identical'])}/{n}, warm {int(r['warm_identical'])}/{n} identical; flips "
               f"{b} cache / {c} recompute, McNemar p = {fmt_p(r['mcnemar_p'])}")
        if r["data"] != "gsm8k":
            details.append(Verdict("RQ5", str(r["config"]), "direction", NOT_RUN, f"{r['data']} items: {obs}",
                                   expected, band, [f"data = {r['data']}: items generated by this artifact, not "
                                                    "GSM8K; no evidence for or against the paper's GSM8K result"]))
            continue
        reasons = []
        if not n:
            reasons.append("no counted items")
        if int(r["cold_identical"]) != n or int(r["warm_identical"]) != n:
            reasons.append("a path is not internally deterministic")
        if not r["mcnemar_p"] > ALPHA:
            reasons.append(f"McNemar p = {fmt_p(r['mcnemar_p'])} <= {ALPHA}")
        details.append(Verdict("RQ5", str(r["config"]), "direction", FAIL if reasons else PASS, obs,
                               "cold n/n, warm n/n identical; p > 0.05", band,
                               reasons or [f"Tab. 3 row {r['config']} (data = gsm8k)"]))
    real = rows[rows["data"] == "gsm8k"]
    if len(real):
        b, c = int(real["flips_numeric_cache"].sum()), int(real["flips_numeric_recompute"].sum())
        p = mcnemar_exact(b, c)
        reasons = []
        if not (b and c):
            reasons.append("flips do not go both ways")
        if not p > ALPHA:
            reasons.append(f"McNemar p = {fmt_p(p)} <= {ALPHA}")
        details.append(Verdict("RQ5", f"pooled over {len(real)} GSM8K configuration(s)", "pooled",
                               FAIL if reasons else PASS, f"{b + c} flips: {b} cache / {c} recompute, "
                               f"McNemar p = {fmt_p(p)}", expected, band,
                               reasons or [f"sum over Tab. 3 rows {', '.join(real['config'])}"]))
        status = None
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
    return [rq1(tables, paper, root), rq2(tables, paper, root), rq2b(tables, paper, root), rq3(tables, paper),
            rq4(tables, paper, root), rq5(tab3, paper)]


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
