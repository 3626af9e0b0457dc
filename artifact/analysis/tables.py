"""The paper's tables of the paired cache ON/OFF runs: Tab. 2, the Fig. 1 cause-isolation conditions and Fig. 2.

Everything here is computed from the records (manifest.json, requests.jsonl, episodes.jsonl) by the existing
comparison code (`divergence.compare_runs` through `divergence.plan_pairs`, `divergence.cache_exposure`,
`divergence.validity_problems`) and the statistics module; nothing is read from directory names.

Conventions
  * A divergence rate is k/n over the episodes both runs made, with a Wilson 95% interval and a moving-block
    bootstrap 95% interval over the episode sequence (`BOOTSTRAP`: block length 5, 10,000 replicates, seed 42;
    see `stats.block_bootstrap_interval` for the choice of block length).
  * "ON vs OFF" is run k of the ON arm against run k of the OFF arm (`divergence.plan_pairs`); run 1 vs run 1 is
    the headline, every k-vs-k pair is in the long comparison table. Reruns compare every pair i < j of an arm's
    runs; run 1 vs run 2 is the headline. Only runs with equal pairing fingerprints and episode lists are paired.
  * The first diverging request is reported 1-based (the paper's "1st-4th of roughly 10"); the first diverging
    token is the 0-based index within that request's generated tokens (as `divergence.py` reports it).
  * accuracy per arm pools the complete runs of that arm: episodes the workload judged valid / episodes.
  * Cache exposure is the share of prompt tokens the server says it served from cache (`cache_n`); an engine that
    does not report it (null `cache_n`, e.g. vLLM's completions endpoint) gives "not reported", never 0.

One module: the paper's tables share one grouping of the runs (`group_runs`, `PlanGroup`) and one row format, and
`build_tables` makes them together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import repeat
from operator import add
from pathlib import Path

import pandas as pd

from artifact import engines
from artifact.analysis.groups import cache_condition, group_lineage, pinned_model
from artifact.analysis.divergence import (
    Comparison,
    Exposure,
    Paired,
    cache_exposure,
    cache_problem,
    cache_unused,
    plan_pairs,
    record_problems,
)
from artifact.analysis.stats import block_bootstrap_interval, cochran_armitage, wilson_interval
from artifact.records.store import Run

BOOTSTRAP = {"block_length": 5, "n_boot": 10_000, "seed": 42, "confidence": 0.95}
CONFIDENCE = 0.95
PAIRED_ARMS = ("off", "on")  # the arms whose runs the paper compares with each other
PAPER_PLAN = "main"  # the paper's Tab. 2 condition: one server per arm, host prompt cache at its default
MIN_TREND_LEVELS = 3  # the trend test is run (and RQ3 judged) where at least this many quantization levels ran


# --- quantization levels --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantLevel:
    name: str
    rank: int  # 0 = finest; the order used on Fig. 2's axis and, re-numbered 0..m-1 over the levels run, as scores
    bpw: float  # effective bits per weight of a Llama-3-8B file in this format (llama.cpp's own size table)
    ppl_increase: float | None  # llama.cpp's documented perplexity increase over F16 on Llama-3-8B
    note: str = ""


# Ordered from finest to coarsest by effective precision. Source: llama.cpp's `llama-quantize` option table
# (tools/quantize/quantize.cpp, QUANT_OPTIONS, in the llama.cpp tree this artifact builds, b10434 and b10435 alike), which gives for each type
# the file size and perplexity increase on Llama-3-8B (8.03e9 weights); bpw = size [GiB] * 2^30 * 8 / 8.03e9.
# The order is by quantization error (the perplexity increase). It agrees with bits per weight everywhere except
# the legacy formats: Q4_1 (5.11 bpw) and Q4_0 (4.64) are larger or about as large as Q4_K_M (4.89) but much less
# precise (+0.45/+0.47 vs +0.18 ppl), because K-quants spend their bits on super-block scales; bits alone would
# put Q4_1 above Q4_K_M. The paper's levels (F16 < Q8_0 < Q4_K_M < Q3_K_M) are ordered the same either way.
QUANT_LEVELS: tuple[QuantLevel, ...] = (
    QuantLevel("F32", 0, 32.0, None, "unquantized"),
    QuantLevel("F16", 1, 16.0, None, "16-bit, unquantized (llama.cpp: +0.0020 ppl @ Mistral-7B)"),
    QuantLevel("BF16", 1, 16.0, None, "16-bit, unquantized; same rank as F16"),
    QuantLevel("Q8_0", 2, 8.52, 0.0026),
    QuantLevel("Q6_K", 3, 6.57, 0.0217),
    QuantLevel("Q5_K_M", 4, 5.70, 0.0569),
    QuantLevel("Q5_K_S", 5, 5.57, 0.1049),
    QuantLevel("Q5_1", 6, 6.04, 0.1062, "legacy format"),
    QuantLevel("Q5_0", 7, 5.57, 0.1316, "legacy format"),
    QuantLevel("Q4_K_M", 8, 4.89, 0.1754),
    QuantLevel("Q4_K_S", 9, 4.67, 0.2689),
    QuantLevel("Q4_1", 10, 5.11, 0.4511, "legacy format"),
    QuantLevel("Q4_0", 11, 4.64, 0.4685, "legacy format"),
    QuantLevel("Q3_K_L", 12, 4.31, 0.5562),
    QuantLevel("Q3_K_M", 13, 4.00, 0.6569),
    QuantLevel("Q3_K_S", 14, 3.65, 1.6321),
    QuantLevel("Q2_K", 15, 3.17, 3.5199),
)
QUANT_BY_NAME = {q.name: q for q in QUANT_LEVELS}
QUANT_ALIASES = {  # llama.cpp's own aliases, and the labels other engines use for 16-bit weights
    "Q4_K": "Q4_K_M",
    "Q3_K": "Q3_K_M",
    "Q5_K": "Q5_K_M",
    "FP16": "F16",
    "FLOAT16": "F16",
    "HALF": "F16",
    "16-BIT": "F16",
    "16BIT": "F16",
    "BFLOAT16": "BF16",
    "FP32": "F32",
    "FLOAT32": "F32",
}


def quant_level(label: str | None) -> QuantLevel | None:
    """The level of a quantization label (case-insensitive, aliases resolved); None if not in QUANT_LEVELS."""
    if not label:
        return None
    key = str(label).strip().upper()
    return QUANT_BY_NAME.get(QUANT_ALIASES.get(key, key))


def quant_levels_frame() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"level": q.name, "rank": q.rank, "bpw": q.bpw, "ppl_increase": q.ppl_increase, "note": q.note}
            for q in QUANT_LEVELS
        ]
    )


# --- per-run facts --------------------------------------------------------------------------------------------


def is_paired_run(run: Run) -> bool:
    """A run of the paired protocol (an OFF or an ON arm); other workloads' arms (the GSM8K bridge) are not."""
    return run.manifest.get("arm") in PAIRED_ARMS


def as_dict(x) -> dict:
    """A manifest sub-table, or {} where it is missing or not a table."""
    return x if isinstance(x, dict) else {}


def run_meta(run: Run) -> dict:
    """Engine, model and plan settings of a run, from the manifest (config_data as a fallback)."""
    m = run.manifest
    cfg = as_dict(m.get("config_data"))
    model = as_dict(m.get("model")) or as_dict(cfg.get("model"))
    cache = cache_condition(run)
    return {
        "config": m["config"],
        "plan": m["plan"],
        "engine": m.get("engine") or as_dict(cfg.get("engine")).get("kind") or "unknown",
        "engine_build": m.get("engine_build"),
        "model_family": model.get("family"),
        "model_name": model.get("name"),
        "quant": model.get("quant"),
        # the model the checkout's configurations pin the run's weights as (family, name), or None: which of the
        # paper's configurations a run is comes from this, never from the names above (`groups.pinned_model`)
        "pinned_model": pinned_model(run),
        "lifecycle": m.get("lifecycle"),
        "cache_ram_mib": cache["settings"].get("cache_ram_mib"),
        "cache_condition": cache["description"],
        "workload": m.get("workload"),
        "prompt_variant": m.get("prompt_variant"),
    }


# Plain dict lookup for per-request scalar fields: the checker's records may be a dict subclass whose `get` is
# Python-level (top_logprobs decoded lazily, artifact.check.run.LazyRecord); at 32,000 requests that adds up.
_get = dict.get
_EXPOSURES: dict[int, tuple[Run, Exposure | None]] = {}  # id(run) -> (run, exposure); cleared by build_tables


def exposure(run: Run) -> Exposure | None:
    """`divergence.cache_exposure`, or None where no request reported cache use (null `cache_n` on every request: an
    engine that does not report it). A run where only some requests report it gets its Exposure, whose
    `unreported` counts the others: a null never hides a non-zero count elsewhere.

    Memoised per Run object (the tables ask for it several times per run); the cache holds the run itself, so
    an id is never reused while cached.
    """
    hit = _EXPOSURES.get(id(run))
    if hit is not None and hit[0] is run:
        return hit[1]
    value = cache_exposure(run)
    if value.requests and not value.reported:
        value = None
    _EXPOSURES[id(run)] = (run, value)
    return value


def run_problems(run: Run) -> list[str]:
    """`divergence.validity_problems`, from the memoised exposure (the cached-token test reads only reported counts:
    a null is never a 0)."""
    cache = cache_problem(run, exposure(run) or Exposure(0, 0, 0, 0))
    return record_problems(run) + ([cache] if cache else [])


ISOLATED = engines.LOOPBACK_ONLY


def isolation_warning(run: Run) -> str | None:
    """Why a run was not network-isolated (None if it was): its manifest's isolation.network is not loopback-only,
    or it is but the server the run talked to was not on loopback by the records (`engines.network`: a remote
    URL of a server the user runs is never loopback-only, whatever the label says). A warning, not a verdict: the
    numbers are valid, the sandbox was just not on."""
    iso = run.manifest.get("isolation")
    if not isinstance(iso, dict):
        return f"{run.label}: no network-isolation record in its manifest (not known to be isolated)"
    net = iso.get("network")
    if net != ISOLATED:
        return f"{run.label}: not network-isolated during the run (isolation.network = {net!r})"
    derived, why = engines.network(run.manifest)
    if derived != ISOLATED:
        return f"{run.label}: {derived}: {why}, although its isolation.network says {ISOLATED!r}"
    return None


def relative(path: Path, root: Path | None) -> str:
    """`path` relative to the results directory, for evidence lists and tables."""
    if root is None:
        return str(path)
    try:
        return os.path.relpath(path, root)
    except ValueError:
        return str(path)


# --- divergence rates -----------------------------------------------------------------------------------------


def rate_stats(k: int, n: int, flags: list[int] | None = None) -> dict:
    """k, n, rate, Wilson and block-bootstrap 95% intervals (None where n = 0 or no flags)."""
    out = {
        "k": k,
        "n": n,
        "rate": k / n if n else None,
        "wilson_lo": None,
        "wilson_hi": None,
        "boot_lo": None,
        "boot_hi": None,
    }
    if n:
        out["wilson_lo"], out["wilson_hi"] = wilson_interval(k, n, CONFIDENCE)
        if flags:
            out["boot_lo"], out["boot_hi"] = block_bootstrap_interval(flags, **BOOTSTRAP)
    return out


def widest_interval(s: dict) -> tuple[float, float] | None:
    """The wider (by width) of the Wilson and the bootstrap interval of a rate_stats dict."""
    cands = [
        (s[a], s[b])
        for a, b in (("wilson_lo", "wilson_hi"), ("boot_lo", "boot_hi"))
        if s.get(a) is not None and s.get(b) is not None
    ]
    return max(cands, key=lambda c: c[1] - c[0]) if cands else None


def comparison_stats(c: Comparison) -> dict:
    s = rate_stats(c.k, c.n, c.flags)
    mr = c.median_first_request
    s["median_first_request"] = None if mr is None else mr + 1  # 1-based
    s["median_first_token"] = c.median_first_token
    s["prompt_mismatches"] = len(c.prompt_mismatches)
    s["not_compared"] = len(c.only_in_a) + len(c.only_in_b) + len(c.without_requests)
    s["n_evidence"] = c.n_evidence
    return s


# --- groups: the runs of one configuration and plan -----------------------------------------------------------


@dataclass
class Pair:
    """One comparison of two runs of a plan: kind (off_rerun | on_rerun | on_vs_off), run k, name, result, stats,
    and the two runs compared (in the order compared)."""

    kind: str
    k: int
    name: str
    cmp: Comparison
    stats: dict
    a: Run = field(repr=False)
    b: Run = field(repr=False)

    @classmethod
    def of(cls, p: Paired) -> "Pair":
        return cls(p.kind, p.k, p.name, p.cmp, comparison_stats(p.cmp), p.a, p.b)


@dataclass
class PlanGroup:
    config: str
    plan: str
    runs: list[Run]
    meta: dict
    comparisons: list[Pair] = field(default_factory=list)  # headline of each kind first
    stats: dict = field(default_factory=dict)  # kind -> rate stats of the headline comparison of that kind
    problems: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (kind, reason): see divergence.pairing_problem

    def headline(self, kind: str) -> Pair | None:
        return next((p for p in self.comparisons if p.kind == kind), None)

    def pairs(self, kind: str) -> list[Pair]:
        return [p for p in self.comparisons if p.kind == kind]

    def cache_unused(self, kinds: tuple[str, ...]) -> list[str]:
        """Why the ON runs of these kinds' headline comparisons are not cache-ON runs (`divergence.cache_unused`)."""
        runs: list[Run] = []
        for p in filter(None, map(self.headline, kinds)):
            runs += [r for r in (p.a, p.b) if not any(r is x for x in runs)]
        return [why for r in runs if (why := cache_unused(r, exposure(r)))]

    def run(self, arm: str, k: int) -> Run | None:
        for r in self.runs:
            if r.complete and r.manifest["arm"] == arm and r.manifest["run"] == k:
                return r
        return None


def group_runs(runs: list[Run]) -> list[PlanGroup]:
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        if is_paired_run(r):
            groups.setdefault((r.manifest["config"], r.manifest["plan"]), []).append(r)
    out = []
    for (config, plan), rs in groups.items():
        g = PlanGroup(config, plan, rs, run_meta(rs[0]))
        pairs, g.refused = plan_pairs(rs)
        g.comparisons = [Pair.of(p) for p in pairs]
        # headline of each kind: the lowest runs (reruns: run 1 vs 2; ON vs OFF: run 1 vs run 1)
        order = {"off_rerun": 0, "on_rerun": 1, "on_vs_off": 2}
        g.comparisons.sort(key=lambda p: (order[p.kind], p.k, p.b.manifest["run"]))
        for p in g.comparisons:
            g.stats.setdefault(p.kind, p.stats)
        g.problems = [p for r in rs for p in run_problems(r)] + [why for _, why in g.refused]
        out.append(g)
    return out


# --- the tables -----------------------------------------------------------------------------------------------


def _arm_accuracy(runs: list[Run], arm: str) -> tuple[int, int]:
    eps = [e for r in runs if r.complete and r.manifest["arm"] == arm for e in r.episodes]
    return sum(bool(e.get("valid")) for e in eps), len(eps)


def _arm_exposure(runs: list[Run], arm: str) -> tuple[int, int] | None:
    """(cached, prompt) tokens pooled over the complete runs of an arm; None if any run did not report cache use."""
    cached = prompt = 0
    for r in runs:
        if r.complete and r.manifest["arm"] == arm:
            e = exposure(r)
            if e is None:
                return None
            cached, prompt = cached + e.cached_tokens, prompt + e.prompt_tokens
    return cached, prompt


def _flat(prefix: str, s: dict | None) -> dict:
    keys = ("k", "n", "rate", "wilson_lo", "wilson_hi", "boot_lo", "boot_hi")
    return {f"{prefix}_{k}": (None if s is None else s[k]) for k in keys}


def tab2_row(g: PlanGroup) -> dict:
    row = {
        key: g.meta[key]
        for key in (
            "config",
            "plan",
            "engine",
            "model_family",
            "model_name",
            "quant",
            "lifecycle",
            "cache_ram_mib",
            "cache_condition",
            "prompt_variant",
        )
    }
    row["episodes"] = max((len(r.manifest["episodes"]) for r in g.runs), default=0)
    for kind in ("off_rerun", "on_rerun", "on_vs_off"):
        row.update(_flat(kind, g.stats.get(kind)))
    pairs = [p for p in g.comparisons if p.kind == "on_vs_off"]
    row["on_vs_off_all_pairs"] = "; ".join(f"run {p.k}: {p.cmp.k}/{p.cmp.n}" for p in pairs) or None
    head = g.stats.get("on_vs_off") or {}
    row["median_first_request"] = head.get("median_first_request")
    row["median_first_token"] = head.get("median_first_token")
    for arm in PAIRED_ARMS:
        valid, n = _arm_accuracy(g.runs, arm)
        row[f"valid_{arm}"], row[f"episodes_{arm}"] = valid, n
        row[f"accuracy_{arm}"] = valid / n if n else None
        exp = _arm_exposure(g.runs, arm)
        row[f"cached_share_{arm}"] = None if exp is None or not exp[1] else exp[0] / exp[1]
        row[f"cache_reported_{arm}"] = exp is not None
    row["runs"] = ", ".join(f"{r.manifest['arm']}{r.manifest['run']}" for r in g.runs)
    row["invalid"] = "; ".join(g.problems) or None
    return row


def comparison_rows(g: PlanGroup) -> list[dict]:
    return [
        {
            "config": g.config,
            "plan": g.plan,
            "comparison": p.kind,
            "pair": p.name,
            "run_k": p.k,
            "headline": g.headline(p.kind) is p,
            "a": p.cmp.a,
            "b": p.cmp.b,
            **p.stats,
        }
        for p in g.comparisons
    ]


def pairing_fingerprint(run: Run) -> str | None:
    fp = run.manifest.get("pairing_fingerprint")
    return fp if isinstance(fp, str) else None


def run_row(run: Run, root: Path | None = None) -> dict:
    m = run.manifest
    e = exposure(run)
    eps = run.episodes
    reqs = run.requests
    return {
        "config": m["config"],
        "plan": m["plan"],
        "arm": m["arm"],
        "run": m["run"],
        "session": m.get("session"),
        "lifecycle": m.get("lifecycle"),
        "status": m.get("status"),
        "episodes": len(m["episodes"]),
        "requests": len(reqs),
        "errors": len(reqs) - list(map(_get, reqs, repeat("error"))).count(None),
        "valid": sum(bool(x.get("valid")) for x in eps) if is_paired_run(run) else None,
        "prompt_tokens": None if e is None else e.prompt_tokens,
        "cached_tokens": None if e is None else e.cached_tokens,
        "cached_share": None if e is None else e.share,
        "requests_with_cache": None if e is None else e.requests_with_cache,
        "cache_unreported": len(reqs) if e is None else e.unreported,
        "wall_s": m.get("wall_s"),
        "server_compute_s": sum(
            map(add, *([v or 0 for v in map(_get, reqs, repeat(f))] for f in ("prompt_ms", "predicted_ms")))
        )
        / 1000,
        "pairing_fingerprint": pairing_fingerprint(run),
        "isolation": (as_dict(m.get("isolation")).get("network") or "not recorded"),
        "path": relative(run.path, root),
        "problems": "; ".join(run_problems(run)) or None,
    }


# Fig. 1: the cause-isolation conditions (§IV-C), each a comparison kind within one plan.
FIG1_CONDITIONS = (
    ("off_rerun", "main", "cache-OFF reruns"),
    ("on_rerun", "cram0", "cache-ON reruns, host prompt cache off (--cache-ram 0)"),
    ("on_rerun", "fresh", "cache-ON reruns, new server per run (state reset)"),
    ("on_rerun", "main", "cache-ON reruns, default (host prompt cache on, shared server)"),
    ("on_vs_off", "main", "cache ON vs OFF (run 1 vs run 1)"),
)


def fig1_rows(groups: list[PlanGroup]) -> list[dict]:
    """The Fig. 1 conditions that ran, per configuration, in FIG1_CONDITIONS order."""
    by = {(g.config, g.plan): g for g in groups}
    rows = []
    for config in dict.fromkeys(g.config for g in groups):
        for kind, plan, label in FIG1_CONDITIONS:
            g = by.get((config, plan))
            s = g.stats.get(kind) if g else None
            if s is not None:
                rows.append(
                    {
                        "config": config,
                        "condition": label,
                        "plan": plan,
                        "comparison": kind,
                        "ran": True,
                        **_flat("div", s),
                    }
                )
    return rows


def _series_key(meta: dict) -> str:
    """How a series is shown: its model's display name (or family, or configuration) and engine. Shown only: which
    configurations form a series is `groups.group_lineage`'s, from the weights' digests."""
    model = meta["model_name"] or meta["model_family"] or meta["config"]
    return f"{model} / {meta['engine']}"


def series_rows(groups: list[PlanGroup]) -> tuple[list[dict], list[str], dict[str, tuple | None]]:
    """ON-vs-OFF (run 1 vs run 1, plan main) per quantization level, one series per model and engine, and the
    configurations left out of every series (why, one line each). A series is the levels of one model
    (`groups.group_lineage`: the weights' digests against the artifact's pins) served by one engine, never a display
    name; a configuration whose weights' lineage the facts cannot decide joins none. Its label is the
    display name its configurations carry (the lineage added where two series would show the same label)."""
    rows, outside = [], []
    for g in groups:
        s = g.stats.get("on_vs_off")
        if g.plan != PAPER_PLAN or s is None:
            continue
        found, why = group_lineage(g.runs)
        if found is None:
            outside.append(f"{g.config}: {why}")
            continue
        level = quant_level(g.meta["quant"])
        rows.append(
            {
                "series": (found, g.meta["engine"]),
                "label": _series_key(g.meta),
                "engine": g.meta["engine"],
                "model_family": g.meta["model_family"],
                "model_name": g.meta["model_name"],
                "config": g.config,
                "quant": g.meta["quant"],
                "level": level.name if level else None,
                "rank": level.rank if level else None,
                "bpw": level.bpw if level else None,
                **_flat("div", s),
                "_pinned": g.meta.get("pinned_model"),
            }
        )
    labels: dict[tuple, str] = {}
    for r in sorted(rows, key=lambda r: (r["label"], r["config"])):
        labels.setdefault(r["series"], r["label"])
    shown = list(labels.values())
    for key, label in labels.items():
        if shown.count(label) > 1:
            labels[key] = f"{label} ({key[0]})"
    for r in rows:
        r["series"] = labels[r.pop("series")]
        del r["label"]
    # per series: the model the checkout's configurations pin its weights as, where all its levels agree, else None
    found_pins: dict[str, set] = {}
    for r in rows:
        found_pins.setdefault(r["series"], set()).add(r.pop("_pinned"))
    pinned = {k: next(iter(v)) if len(v) == 1 else None for k, v in found_pins.items()}
    rows.sort(key=lambda r: (r["series"], r["rank"] if r["rank"] is not None else 99, r["config"]))
    return rows, outside, pinned


def trend_rows(fig2: pd.DataFrame) -> list[dict]:
    """Cochran-Armitage per series with >= MIN_TREND_LEVELS known levels; scores 0..m-1 in QUANT_LEVELS order."""
    rows = []
    if fig2.empty:
        return rows
    for series, df in fig2.groupby("series", sort=True):
        known = df[df["rank"].notna()].sort_values("rank")
        unknown = sorted(str(q) if q else "not recorded" for q in df.loc[df["rank"].isna(), "quant"])
        ranks = sorted(set(known["rank"]))
        score_of = {r: i for i, r in enumerate(ranks)}
        row = {
            "series": series,
            "levels": " < ".join(known["level"]),
            "n_levels": len(ranks),
            "k": " ".join(str(int(k)) for k in known["div_k"]),
            "n": " ".join(str(int(n)) for n in known["div_n"]),
            "z": None,
            "p": None,
            "unknown_levels": ", ".join(unknown) or None,
        }
        if len(ranks) >= MIN_TREND_LEVELS and (known["div_n"] > 0).all():
            z, p = cochran_armitage(
                known["div_k"].astype(int).tolist(),
                known["div_n"].astype(int).tolist(),
                [score_of[r] for r in known["rank"]],
            )
            row["z"], row["p"] = z, p
        rows.append(row)
    return rows


@dataclass
class Tables:
    groups: list[PlanGroup]
    tab2: pd.DataFrame
    comparisons: pd.DataFrame
    runs: pd.DataFrame
    fig1: pd.DataFrame
    fig2: pd.DataFrame
    fig2_trend: pd.DataFrame
    problems: list[str]  # every run that cannot be used as evidence, and every pairing refused, with the reason
    warnings: dict[str, list[str]] = field(default_factory=dict)  # run label -> warnings (network isolation)
    # configurations of plan main in no quantization series: "config: why" (`series_rows`: lineage not known)
    outside_series: list[str] = field(default_factory=list)
    # per fig2 series: (family, name) the checkout's configurations pin its weights as, or None (`groups.pinned_model`)
    series_pinned: dict[str, tuple | None] = field(default_factory=dict)
    # runs against a server the artifact did not start (their engine loads no weights of its own): what happened on
    # that server besides the run's own requests is not observable (`user_server_runs`)
    user_server: list[str] = field(default_factory=list)

    @property
    def unisolated_runs(self) -> list[str]:
        return [label for label, ws in self.warnings.items() if ws]

    def group(self, config: str, plan: str) -> PlanGroup | None:
        return next((g for g in self.groups if g.config == config and g.plan == plan), None)


FIG2_COLUMNS = [
    "series",
    "engine",
    "model_family",
    "model_name",
    "config",
    "quant",
    "level",
    "rank",
    "bpw",
    *_flat("div", None),
]


def build_tables(runs: list[Run], root: Path | None = None) -> Tables:
    _EXPOSURES.clear()
    groups = group_runs(runs)
    refused = [why for g in groups for _, why in g.refused]
    series, outside, pinned = series_rows(groups)
    fig2 = pd.DataFrame(series, columns=FIG2_COLUMNS)
    return Tables(
        groups=groups,
        tab2=pd.DataFrame([tab2_row(g) for g in groups]),
        comparisons=pd.DataFrame([r for g in groups for r in comparison_rows(g)]),
        runs=pd.DataFrame([run_row(r, root) for r in runs]),
        fig1=pd.DataFrame(fig1_rows(groups)),
        fig2=fig2,
        fig2_trend=pd.DataFrame(trend_rows(fig2)),
        problems=[p for r in runs for p in run_problems(r)] + refused,
        warnings={r.label: [w] for r in runs if (w := isolation_warning(r)) is not None},
        outside_series=outside,
        series_pinned=pinned,
        user_server=user_server_runs(runs),
    )


# What no record of a run against a server the artifact did not start can show, in words (check's note, the report)
USER_SERVER_UNOBSERVED = (
    "whether other clients used the server during the runs (another client's requests on the "
    "same server change even cache-OFF outputs), and the server's command line, binary and "
    "weights' sha256"
)


def user_server_runs(runs: list[Run]) -> list[str]:
    """The runs whose engine (by the manifest's engine kind) starts no server of its own and loads no weights
    (`Capabilities.loads_weights` False: a server the user runs), by label."""
    out = []
    for r in runs:
        engine = engines.of_manifest(r.manifest)
        if engine is not None and not engine.capabilities.loads_weights:
            out.append(r.label)
    return out
