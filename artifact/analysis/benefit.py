"""What the cache buys, measured in the same runs whose divergence the paper counts.

Per configuration, plan, arm and run: prompt tokens, the tokens the server served from its cache (`cache_n`) and
the tokens it evaluated (`prompt_n`), prompt-processing time (`prompt_ms`), time to first token and wall time.
Time to first token is the server's own: llama-server samples the first token at the end of prompt processing, so
it is `prompt_ms` (HTTP and client time excluded). The ON/OFF ratios pair ON run k with OFF run k episode by
episode; their 95% intervals are paired percentile bootstraps over episodes (`ratio_interval`). Wall time is one
number per run, so its ratio is given per run pair (mean, min and max over the pairs), without an interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from artifact.analysis.groups import by_plan, ok_requests, on_off_pairs
from artifact.records.store import Run

N_RESAMPLES = 2999  # percentile bootstrap; paper-scale check time (bench) bounds it
SEED = 42


def run_costs(run: Run) -> dict:
    """The cache's work and the time spent in one run."""
    reqs = ok_requests(run)

    def total(key: str) -> float:
        return sum(float(dict.get(r, key) or 0) for r in reqs)  # dict.get: never decodes lazy fields

    cached, prompt_tokens, prompt_ms = total("cache_n"), total("prompt_tokens"), total("prompt_ms")
    m = run.manifest
    return {
        "config": m["config"], "plan": m["plan"], "arm": m["arm"], "run": m["run"], "requests": len(reqs),
        "prompt_tokens": int(prompt_tokens), "cached_tokens": int(cached), "evaluated_tokens": int(total("prompt_n")),
        "cached_share": cached / prompt_tokens if prompt_tokens else float("nan"),
        "prompt_ms": prompt_ms, "ttft_ms_mean": prompt_ms / len(reqs) if reqs else float("nan"),
        "predicted_ms": total("predicted_ms"), "wall_s": wall_s(run),
    }


def wall_s(run: Run) -> float:
    w = run.manifest.get("wall_s")
    return float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else float("nan")


RUN_COLUMNS = ["config", "plan", "arm", "run", "requests", "prompt_tokens", "cached_tokens", "evaluated_tokens",
               "cached_share", "prompt_ms", "ttft_ms_mean", "predicted_ms", "wall_s"]


def costs_frame(runs: list[Run]) -> pd.DataFrame:
    rows = [run_costs(r) for r in runs if r.complete and r.manifest.get("arm") in ("off", "on")]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def ratio_intervals(on: np.ndarray, off: np.ndarray, confidence: float = 0.95, n_resamples: int = N_RESAMPLES,
                    seed: int = SEED) -> list[tuple[float, float, float]]:
    """Per column j: (mean(on[:, j]) / mean(off[:, j]), low, high), a paired percentile bootstrap over the rows.

    Rows are the units (here episodes), resampled with replacement with each unit's ON and OFF values kept together;
    one set of resamples serves every column (scipy.stats.bootstrap, paired=True, method='percentile', seeded,
    vector-valued statistic). Fewer than two units, or identical units, give NaN intervals.
    """
    from scipy import stats  # noqa: PLC0415  (scipy: a slow import, not needed to draw the figures)
    on, off = np.asarray(on, dtype=float), np.asarray(off, dtype=float)
    if on.shape != off.shape or on.ndim != 2:
        raise ValueError("ratio_intervals needs two (units, quantities) arrays of one shape")
    nan = float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        points = [float(on[:, j].mean() / off[:, j].mean()) if len(on) and off[:, j].sum() > 0 else nan
                  for j in range(on.shape[1])]
    if len(on) < 2 or (np.all(on == on[0]) and np.all(off == off[0])):
        return [(p, nan, nan) for p in points]

    def ratios(*cols, axis=-1):
        k = len(cols) // 2
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.stack([cols[j].mean(axis=axis) / cols[k + j].mean(axis=axis) for j in range(k)])

    data = tuple(on.T) + tuple(off.T)
    # a column whose OFF values are all 0 has no ratio (its point is NaN and so is its interval, below); its
    # resampled ratios are inf/NaN, which scipy's spread of the bootstrap distribution would warn about on stderr
    with np.errstate(divide="ignore", invalid="ignore"):
        res = stats.bootstrap(data, ratios, paired=True, vectorized=True, method="percentile",
                              confidence_level=confidence, n_resamples=n_resamples,
                              random_state=np.random.default_rng(seed))
    lo, hi = np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)
    return [(p, float(a), float(b)) if not np.isnan(p) else (p, nan, nan) for p, a, b in zip(points, lo, hi)]


def ratio_interval(on, off, **kw) -> tuple[float, float, float]:
    """(mean(on) / mean(off), low, high) for one quantity (see ratio_intervals)."""
    on, off = np.asarray(on, dtype=float), np.asarray(off, dtype=float)
    if on.shape != off.shape or on.ndim != 1:
        raise ValueError("ratio_interval needs two equal-length 1-d sequences")
    return ratio_intervals(on[:, None], off[:, None], **kw)[0]


# The per-episode quantities whose ON/OFF ratio gets an interval: name -> the request fields summed.
RATIO_FIELDS = {"prompt_ms": ("prompt_ms",), "evaluated_tokens": ("prompt_n",),
                "server_ms": ("prompt_ms", "predicted_ms")}


def _episode_sums(run: Run) -> dict[str, list[float]]:
    """Episode id -> [sum of each RATIO_FIELDS quantity over its served requests]."""
    out = {}
    for eid, reqs in run.requests_by_episode().items():
        ok = [r for r in reqs if dict.get(r, "error") is None]  # dict.get: never decodes lazy fields
        out[eid] = [sum(float(dict.get(r, f) or 0.0) for r in ok for f in fields) for fields in RATIO_FIELDS.values()]
    return out


def ratios_frame(runs: list[Run]) -> pd.DataFrame:
    """Per configuration and plan: ON/OFF ratios (episodes of every run pair k pooled) with intervals."""
    rows = []
    for (config, plan), group in by_plan(runs).items():
        pairs = on_off_pairs(group)
        if not pairs:
            continue
        on_v, off_v = [], []
        for _, on, off in pairs:
            s_on, s_off = _episode_sums(on), _episode_sums(off)
            common = [e for e in s_off if e in s_on]
            on_v += [s_on[e] for e in common]
            off_v += [s_off[e] for e in common]
        shape = (len(on_v), len(RATIO_FIELDS))
        cis = ratio_intervals(np.array(on_v, dtype=float).reshape(shape), np.array(off_v, dtype=float).reshape(shape))
        row = {"config": config, "plan": plan, "run_pairs": len(pairs), "episodes": len(on_v)}
        for name, ci in zip(RATIO_FIELDS, cis):
            row[f"{name}_ratio"], row[f"{name}_lo"], row[f"{name}_hi"] = ci
        walls = [wall_s(on) / wall_s(off) for _, on, off in pairs]
        row.update(wall_ratio=float(np.mean(walls)), wall_ratio_min=float(np.min(walls)),
                   wall_ratio_max=float(np.max(walls)))
        rows.append(row)
    cols = ["config", "plan", "run_pairs", "episodes"] + [f"{n}_{s}" for n in RATIO_FIELDS for s in
                                                         ("ratio", "lo", "hi")] + \
        ["wall_ratio", "wall_ratio_min", "wall_ratio_max"]
    return pd.DataFrame(rows, columns=cols)


def arm_summary(costs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, plan and arm: the mean over its runs of each run's totals."""
    if costs.empty:
        return costs.drop(columns=["run"])
    num = [c for c in RUN_COLUMNS if c not in ("config", "plan", "arm", "run")]
    out = costs.groupby(["config", "plan", "arm"], sort=True)[num].mean().reset_index()
    out.insert(3, "runs", costs.groupby(["config", "plan", "arm"], sort=True).size().to_numpy())
    return out
