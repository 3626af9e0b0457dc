"""What the cache buys, measured in the same runs whose divergence the paper counts.

Per configuration, plan, arm and run: prompt tokens, the tokens the server served from its cache (`cache_n`) and
the tokens it evaluated (`prompt_n`), prompt-processing time (`prompt_ms`), time to first token and wall time.
Time to first token is the server's own: llama-server samples the first token at the end of prompt processing, so
it is `prompt_ms` (HTTP and client time excluded). The ON/OFF ratios pair ON run k with OFF run k episode by
episode; their 95% intervals are paired percentile bootstraps over episodes (`ratio_interval`). Wall time is one
number per run, so its ratio is given per run pair (mean, min and max over the pairs), without an interval.
"""

from __future__ import annotations

from itertools import chain, repeat

import numpy as np
import pandas as pd

from artifact.analysis.groups import by_plan, ok_requests, on_off_pairs
from artifact.analysis.stats import seeded_integers
from artifact.records.store import Run

N_RESAMPLES = 2999  # percentile bootstrap; paper-scale check time (bench) bounds it
SEED = 42


def run_costs(run: Run) -> dict:
    """The cache's work and the time spent in one run."""
    reqs = ok_requests(run)
    get = dict.get  # dict.get: never decodes lazy fields

    def total(key: str) -> float:
        # sum(float(value or 0) for each request), the same floats: the builtin sum in request order, its zeros left
        # out (adding 0.0 changes no partial sum, which starts at 0.0); int 0 without requests, as the sum of none.
        # map and filter: no Python bytecode per request
        return sum(map(float, filter(None, map(get, reqs, repeat(key)))), 0.0 if reqs else 0)

    cached, prompt_tokens, prompt_ms = total("cache_n"), total("prompt_tokens"), total("prompt_ms")
    m = run.manifest
    return {
        "config": m["config"],
        "plan": m["plan"],
        "arm": m["arm"],
        "run": m["run"],
        "requests": len(reqs),
        "prompt_tokens": int(prompt_tokens),
        "cached_tokens": int(cached),
        "evaluated_tokens": int(total("prompt_n")),
        "cached_share": cached / prompt_tokens if prompt_tokens else float("nan"),
        "prompt_ms": prompt_ms,
        "ttft_ms_mean": prompt_ms / len(reqs) if reqs else float("nan"),
        "predicted_ms": total("predicted_ms"),
        "wall_s": wall_s(run),
    }


def wall_s(run: Run) -> float:
    w = run.manifest.get("wall_s")
    return float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else float("nan")


RUN_COLUMNS = [
    "config",
    "plan",
    "arm",
    "run",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "evaluated_tokens",
    "cached_share",
    "prompt_ms",
    "ttft_ms_mean",
    "predicted_ms",
    "wall_s",
]


def costs_frame(runs: list[Run]) -> pd.DataFrame:
    rows = [run_costs(r) for r in runs if r.complete and r.manifest.get("arm") in ("off", "on")]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def ratio_intervals(
    on: np.ndarray, off: np.ndarray, confidence: float = 0.95, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> list[tuple[float, float, float]]:
    """Per column j: (mean(on[:, j]) / mean(off[:, j]), low, high), a paired percentile bootstrap over the rows.

    Rows are the units (here episodes), resampled with replacement with each unit's ON and OFF values kept together;
    one set of resamples serves every column (scipy.stats.bootstrap's paired, seeded percentile interval of a
    vector-valued statistic, computed here: `_paired_percentile_bootstrap`). Fewer than two units, or identical
    units, give NaN intervals.
    """
    on, off = np.asarray(on, dtype=float), np.asarray(off, dtype=float)
    if on.shape != off.shape or on.ndim != 2:
        raise ValueError("ratio_intervals needs two (units, quantities) arrays of one shape")
    nan = float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        points = [
            float(on[:, j].mean() / off[:, j].mean()) if len(on) and off[:, j].sum() > 0 else nan
            for j in range(on.shape[1])
        ]
    if len(on) < 2 or (np.all(on == on[0]) and np.all(off == off[0])):
        return [(p, nan, nan) for p in points]

    # a column whose OFF values are all 0 has no ratio (its point is NaN and so is its interval, below); its
    # resampled ratios are inf/NaN
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _paired_percentile_bootstrap(on, off, confidence, n_resamples, seed)
    return [(p, float(a), float(b)) if not np.isnan(p) else (p, nan, nan) for p, a, b in zip(points, lo, hi)]


def _paired_percentile_bootstrap(
    on: np.ndarray, off: np.ndarray, confidence: float, n_resamples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per column j, the percentile interval of mean(on[I, j]) / mean(off[I, j]) over resampled row sets I.

    scipy.stats.bootstrap(tuple(on.T) + tuple(off.T), statistic, paired=True, vectorized=True,
    method="percentile", confidence_level=confidence, n_resamples=n_resamples,
    random_state=np.random.default_rng(seed)), whose statistic is np.stack([mean_j(on) / mean_j(off)]) over the
    last axis, operation for operation (scipy 1.15's _resampling.py; the same floats, a test holds the two equal):
    one draw of (n_resamples, units) row indices (its `rng_integers`: Generator.integers(0, n, size,
    dtype="int64"); kept for the next plan of as many units, `stats.seeded_integers`); each column gathered by
    them into C-contiguous rows of `units` values, each row averaged along its last axis (numpy's pairwise sum,
    then / units: a row's mean does not depend on the rows gathered with it, so a few are gathered at a time);
    the ratios stacked; np.percentile at 100 * alpha and 100 * (1 - alpha), alpha = (1 - confidence) / 2. What
    scipy adds (input checks, its standard error, a (n_resamples, units) array per column) is left out.
    """
    n, k = on.shape
    flat = seeded_integers(seed, n, (n_resamples, n)).ravel()  # kept: one draw serves every plan of n episodes
    # a few resamples at a time into one small buffer (a row's mean is its own pairwise sum, whatever the rows
    # around it): no (n_resamples, n) array per column, whose fresh pages cost more than the gathering
    rows = max(1, _CHUNK // n)
    buf = np.empty(rows * n)

    def mean(column: np.ndarray) -> np.ndarray:
        column, out = np.ascontiguousarray(column), np.empty(n_resamples)
        for start in range(0, n_resamples, rows):
            stop = min(start + rows, n_resamples)
            chunk = buf[: (stop - start) * n]
            column.take(flat[start * n : stop * n], out=chunk, mode="wrap")  # indices < n: "wrap" only skips a copy
            out[start:stop] = chunk.reshape(stop - start, n).mean(axis=-1)
        return out

    theta = np.stack([mean(on[:, j]) / mean(off[:, j]) for j in range(k)])
    alpha = (1 - float(confidence)) / 2
    return (np.percentile(theta, alpha * 100, axis=-1), np.percentile(theta, (1 - alpha) * 100, axis=-1))


_CHUNK = 1 << 16  # resampled values gathered at a time (512 KiB)


def ratio_interval(on, off, **kw) -> tuple[float, float, float]:
    """(mean(on) / mean(off), low, high) for one quantity (see ratio_intervals)."""
    on, off = np.asarray(on, dtype=float), np.asarray(off, dtype=float)
    if on.shape != off.shape or on.ndim != 1:
        raise ValueError("ratio_interval needs two equal-length 1-d sequences")
    return ratio_intervals(on[:, None], off[:, None], **kw)[0]


# The per-episode quantities whose ON/OFF ratio gets an interval: name -> the request fields summed.
RATIO_FIELDS = {
    "prompt_ms": ("prompt_ms",),
    "evaluated_tokens": ("prompt_n",),
    "server_ms": ("prompt_ms", "predicted_ms"),
}


def _floats(values: list) -> list[float]:
    """float(v or 0.0) of each value; numbers (the schema's) straight to float (a -0.0 then stays -0.0, which
    changes no sum that starts at 0)."""
    if set(map(type, values)) <= {int, float}:
        return list(map(float, values))
    return [float(v or 0.0) for v in values]


def _episode_sums(run: Run) -> dict[str, list[float]]:
    """Episode id -> [sum of each RATIO_FIELDS quantity over its served requests]."""
    get = dict.get  # dict.get: never decodes lazy fields
    by_episode = run.requests_by_episode()
    # every served request's fields, episode after episode, once: the sum of an episode's quantity is the builtin
    # sum over its slice (its fields in request order, request by request), the floats summing float(value or 0)
    # over its requests and fields gives
    ok = list(by_episode.values())
    if list(map(get, run.requests, repeat("error"))).count(None) != len(run.requests):  # some request failed
        ok = [[r for r in reqs if get(r, "error") is None] for reqs in ok]
    flat = list(chain.from_iterable(ok))
    values = {f: _floats(list(map(get, flat, repeat(f)))) for f in {f for fs in RATIO_FIELDS.values() for f in fs}}
    columns = []
    for fields in RATIO_FIELDS.values():
        if len(fields) == 1:
            columns.append((values[fields[0]], 1))
        else:  # request by request, field after field
            both = [0.0] * (len(flat) * len(fields))
            for j, f in enumerate(fields):
                both[j :: len(fields)] = values[f]
            columns.append((both, len(fields)))
    out, start = {}, 0
    for eid, reqs in zip(by_episode, ok):
        end = start + len(reqs)
        out[eid] = [sum(col[start * w : end * w]) for col, w in columns]
        start = end
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
        row.update(
            wall_ratio=float(np.mean(walls)), wall_ratio_min=float(np.min(walls)), wall_ratio_max=float(np.max(walls))
        )
        rows.append(row)
    cols = (
        ["config", "plan", "run_pairs", "episodes"]
        + [f"{n}_{s}" for n in RATIO_FIELDS for s in ("ratio", "lo", "hi")]
        + ["wall_ratio", "wall_ratio_min", "wall_ratio_max"]
    )
    return pd.DataFrame(rows, columns=cols)


def arm_summary(costs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, plan and arm: the mean over its runs of each run's totals."""
    if costs.empty:
        return costs.drop(columns=["run"])
    num = [c for c in RUN_COLUMNS if c not in ("config", "plan", "arm", "run")]
    out = costs.groupby(["config", "plan", "arm"], sort=True)[num].mean().reset_index()
    out.insert(3, "runs", costs.groupby(["config", "plan", "arm"], sort=True).size().to_numpy())
    return out
