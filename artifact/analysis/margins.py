"""Top-2 log-probability margins: the paper's explanation of RQ3, measured on the records.

The paper argues that coarser quantization compresses the gap between the two best candidates, so smaller numeric
perturbations (a cached instead of a recomputed prefix) flip the greedy argmax. Every request record holds, per
generated position, the top-2 log-probabilities (softmax of the raw logits), so the margin at a position is
`logprob(best) - logprob(second)` >= 0. Three measurements follow:

* the margin distribution over every generated position of the OFF runs, per configuration and plan
  (`margin_distribution`);
* the margin at each first diverging token of ON vs OFF, in both arms (`first_divergence_margins`);
* flip probability against margin (`flip_positions`, `flip_by_margin`): a position is *at risk* when the two arms
  saw the same prompt (same `prompt_sha256`) and generated the same tokens before it; it *flips* when their tokens
  differ there. Past a flip the arms see different text, so later positions of that episode are not at risk;
* whether margins shrink across a quantization series (`margin_trend`), with Page's L test for ordered
  alternatives (Page 1963, JASA 58:216): blocks are the episodes (every level ran the same tasks, and blocking on
  the episode removes task difficulty), treatments are the quantization levels ordered from coarsest to finest,
  and the response is the episode's median margin in OFF run 1. Positions within an episode are strongly
  dependent (one text), so the episode, not the position, is the unit; the alternative is ordered (coarser =
  smaller margins), which Page's test uses and Friedman's omnibus test would not.

One module: its measurements (the distribution, the first divergences, flips by margin and the trend) all read the
same per-position top-2 margins, parsed here once (`run_margins`, `at_risk`); split, each part would import the
others.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from artifact.analysis.groups import (
    SamePrompt,
    by_plan,
    comparison,
    manifest_table,
    ok_requests,
    on_off_pairs,
    same_prompt,
)
from artifact.analysis.stats import cochran_armitage, wilson_interval
from artifact.analysis.tables import MIN_TREND_LEVELS, quant_level
from artifact.records.store import Run

THRESHOLDS = (0.01, 0.05, 0.1, 0.5, 1.0)  # nats; the share of positions below each is reported
# Bins of the flip-vs-margin curve (nats), left-closed: [0, 0.01), [0.01, 0.03), ..., [3, inf).
MARGIN_BINS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, float("inf"))


def margin(top: list) -> float:
    """logprob(best) - logprob(second) of one position's top-2 list [[id, logprob], [id, logprob]]; NaN if absent."""
    try:
        lps = sorted((float(e[1]) for e in top), reverse=True)
    except (TypeError, ValueError, IndexError):
        return float("nan")
    return lps[0] - lps[1] if len(lps) >= 2 else float("nan")


def _parse_top2(top) -> np.ndarray | None:
    """One position list [[[id, lp], [id, lp]], ...] as an (n, 4) array; None unless every position has two."""
    try:
        arr = np.asarray(top, dtype=float)
    except (TypeError, ValueError):
        return None
    if arr.size == 0:
        return np.empty((0, 4))
    return arr.reshape(len(top), 4) if arr.shape == (len(top), 2, 2) else None


def top2(run: Run | None, record: dict) -> np.ndarray | None:
    """One request's top-2 entries as an (n, 4) array [id1, logprob1, id2, logprob2] (None if not top-2): from the
    run's one-pass parse of its records (`Run.top2`: ~1.4 million positions at paper scale), else from the
    record's own list."""
    if run is not None:
        table, rows = run.top2_table()
        at = rows.get(id(record))
        if at is not None:
            return table[at[0] : at[0] + at[1]]
    return _parse_top2(record.get("top_logprobs") or [])


def request_margins(record: dict, run: Run | None = None) -> np.ndarray:
    """The margin at every generated position of one request (NaN where the engine gave fewer than two)."""
    if run is not None:  # the run's margins, computed once (`_margin_table`)
        table, rows = _margin_table(run)
        at = rows.get(id(record))
        if at is not None:
            return table[at[0] : at[0] + at[1]]
    arr = top2(run, record)
    if arr is not None:
        return np.abs(arr[:, 1] - arr[:, 3])
    return np.array([margin(t) for t in record.get("top_logprobs") or []], dtype=float)


def _margin_table(run: Run) -> tuple[np.ndarray, dict]:
    """The margin at every position of `Run.top2_table` (memoised on the run), and its rows per record."""
    cached = run.__dict__.get("_margins")
    if cached is None:
        table, rows = run.top2_table()
        cached = run.__dict__["_margins"] = (np.abs(table[:, 1] - table[:, 3]), rows)
    return cached


def table_rows(rows: dict, records: list) -> np.ndarray | None:
    """(first row, rows) of each record in a run's top-2 table (`Run.top2_table`'s `rows`), as a (k, 2) array; None
    if one of them is not there (its own top_logprobs are read, record by record)."""
    try:
        at = list(map(rows.__getitem__, map(id, records)))
    except KeyError:
        return None
    return np.array(at, dtype=np.int64).reshape(len(at), 2)


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The row numbers start, ..., start + count - 1 of each (start, count), one range after the other: what
    concatenating the slices table[start:start + count] takes from a table, as one index."""
    counts = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if ends.size else 0
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - counts), counts) + np.arange(total, dtype=np.int64)


def run_margins(run: Run, records: list) -> np.ndarray:
    """`request_margins` of each record, concatenated in order: at once from the run's table where every record is
    in it, else record by record."""
    table, rows = _margin_table(run)
    at = table_rows(rows, records)
    if at is None:
        return np.concatenate([request_margins(q, run) for q in records] or [np.array([])])
    return table[ranges(at[:, 0], at[:, 1])] if len(at) else np.array([])


def segment_medians(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The median of each run of `sizes[i]` consecutive values (none NaN; NaN for an empty one): np.median's value
    (the middle one, or the mean (a + b) / 2 of the two middle ones), each segment sorted in place in a copy."""
    v = values.copy()
    ends = np.cumsum(sizes)
    starts = ends - sizes
    for s, e in zip(starts.tolist(), ends.tolist()):
        if e - s > 1:
            v[s:e].sort()
    half = sizes // 2
    med = np.full(len(sizes), np.nan)
    odd, even = (sizes % 2 == 1), (sizes > 0) & (sizes % 2 == 0)
    med[odd] = v[starts[odd] + half[odd]]
    med[even] = (v[starts[even] + half[even] - 1] + v[starts[even] + half[even]]) / 2
    return med


def _meta(run: Run) -> dict:
    model = manifest_table(run, "model")
    return {
        "config": run.manifest["config"],
        "plan": run.manifest["plan"],
        "engine": run.manifest.get("engine"),
        "model_name": model.get("name"),
        "quant": model.get("quant"),
    }


# --- distribution ---------------------------------------------------------------------------------------------


def margin_distribution(runs: list[Run]) -> pd.DataFrame:
    """Per configuration and plan: the margins over all generated positions of its OFF runs."""
    rows = []
    for group in by_plan(runs).values():
        off = [r for (arm, _), r in sorted(group.items()) if arm == "off"]
        if not off:
            continue
        m = np.concatenate([run_margins(r, ok_requests(r)) for r in off])
        m = m[~np.isnan(m)]
        row = {**_meta(off[0]), "off_runs": len(off), "positions": int(m.size)}
        if m.size:
            row.update(median=float(np.median(m)), q10=float(np.quantile(m, 0.1)), mean=float(m.mean()))
            row.update({f"share_below_{t:g}": float((m < t).mean()) for t in THRESHOLDS})
        rows.append(row)
    cols = [
        "config",
        "plan",
        "engine",
        "model_name",
        "quant",
        "off_runs",
        "positions",
        "median",
        "q10",
        "mean",
        *(f"share_below_{t:g}" for t in THRESHOLDS),
    ]
    return pd.DataFrame(rows, columns=cols)


# --- first diverging tokens and flips -------------------------------------------------------------------------


def first_divergence_margins(runs: list[Run]) -> pd.DataFrame:
    """Per diverged episode of every ON run k vs OFF run k: both arms' margins and tokens at the first difference."""
    rows = []
    for (config, plan), group in by_plan(runs).items():
        for k, on, off in on_off_pairs(group):
            cmp = comparison(on, off)
            quant = _meta(on)["quant"]
            e_on, e_off = on.requests_by_episode(), off.requests_by_episode()
            for d in cmp.diverged:
                if d.first_token is None:
                    continue
                q_on, q_off = e_on[d.episode_id][d.first_request], e_off[d.episode_id][d.first_request]
                t = d.first_token
                m_on, m_off = request_margins(q_on, on), request_margins(q_off, off)
                rows.append(
                    {
                        "config": config,
                        "plan": plan,
                        "quant": quant,
                        "run": k,
                        "episode_id": d.episode_id,
                        "request": d.first_request,
                        "token": t,
                        "token_on": q_on["output_tokens"][t] if t < len(q_on["output_tokens"]) else None,
                        "token_off": q_off["output_tokens"][t] if t < len(q_off["output_tokens"]) else None,
                        "margin_on": float(m_on[t]) if t < m_on.size else float("nan"),
                        "margin_off": float(m_off[t]) if t < m_off.size else float("nan"),
                    }
                )
    return pd.DataFrame(
        rows,
        columns=[
            "config",
            "plan",
            "quant",
            "run",
            "episode_id",
            "request",
            "token",
            "token_on",
            "token_off",
            "margin_on",
            "margin_off",
        ],
    )


class AtRisk:
    """The request pairs of an ON and an OFF run at risk of a flip (`at_risk`): the OFF and the ON requests, where
    their tokens first differ (`firsts`, None where they do not; `first`, NO_DIFFERENCE there), how many tokens each
    generated, and the OFF requests' rows in the OFF run's top-2 table (None where one is not there)."""

    __slots__ = ("offs", "ons", "firsts", "first", "len_off", "len_on", "at_off")

    def __init__(self, off: Run, sp: SamePrompt):
        keep = [i for i, q in enumerate(sp.b) if dict.get(q, "cache_n") != 0]  # 0: recomputed exactly as OFF did
        self.offs, self.ons, self.firsts = [sp.a[i] for i in keep], [sp.b[i] for i in keep], [sp.first[i] for i in keep]
        self.first = np.array([NO_DIFFERENCE if d is None else d for d in self.firsts], dtype=np.int64)
        self.len_off = np.array([sp.len_a[i] for i in keep], dtype=np.int64)
        self.len_on = np.array([sp.len_b[i] for i in keep], dtype=np.int64)
        self.at_off = table_rows(off.top2_table()[1], self.offs)


NO_DIFFERENCE = np.iinfo(np.int64).max  # where the tokens do not differ


def at_risk(on: Run, off: Run) -> AtRisk:
    """The requests of an ON/OFF pair at risk of a flip: same prompt in both arms (`same_prompt`: the same earlier
    tokens), and the ON request served cached tokens (`cache_n` > 0, or not reported). Made once per pair and kept
    on the OFF run (`flip_positions` and the quantization analysis read the same pairs)."""
    cache = off.__dict__.setdefault("_at_risk", {})
    hit = cache.get(id(on))
    if hit is None:
        hit = cache[id(on)] = (on, AtRisk(off, same_prompt(off, on)))  # on is held so that its id is not reused
    return hit[1]


def flip_positions(on: Run, off: Run) -> tuple[np.ndarray, np.ndarray]:
    """(OFF margin, flipped 0/1) at every position at risk of a flip between an ON and an OFF run.

    At risk: the ON request was served cached prompt tokens (`cache_n` > 0, or not reported), its prompt is
    identical in both arms and so is every earlier generated token. The position
    where the tokens first differ is a flip; positions after it, and later requests of the episode (whose prompts
    then differ), are not at risk. A position where one arm stopped and the other went on is not a token flip and
    is left out, as are positions without two log-probabilities in the OFF record.
    """
    r = at_risk(on, off)
    if r.at_off is None:
        return _flip_positions(off, r.offs, r.ons, r.firsts)
    table, _ = _margin_table(off)
    # n: the positions both arms generated and the OFF record has margins for; the flip, where the tokens first
    # differ before n (a difference at or past the shorter output's end is one arm stopping, not a flip)
    n = np.minimum(np.minimum(r.len_off, r.len_on), r.at_off[:, 1])
    flipped = r.first < n
    upto = np.where(flipped, r.first + 1, n)
    m = table[ranges(r.at_off[:, 0], upto)]
    f = np.zeros(m.size, dtype=int)
    f[np.cumsum(upto)[flipped] - 1] = 1
    keep = ~np.isnan(m)
    return m[keep], f[keep]


def _flip_positions(off: Run, offs: list, ons: list, firsts: list) -> tuple[np.ndarray, np.ndarray]:
    """`flip_positions` request by request (where an OFF record is not in its run's top-2 table)."""
    margins, flips = [], []
    for q_off, q_on, diff in zip(offs, ons, firsts):
        a, b = q_off["output_tokens"], q_on["output_tokens"]
        if diff is not None and diff >= min(len(a), len(b)):
            diff = None  # one arm stopped where the other went on: not a token flip
        m = request_margins(q_off, off)
        n = min(len(a), len(b), m.size)
        flipped = diff is not None and diff < n
        upto = diff + 1 if flipped else n
        f = np.zeros(upto, dtype=int)
        if flipped:
            f[-1] = 1
        margins.append(m[:upto])
        flips.append(f)
    m = np.concatenate(margins) if margins else np.empty(0)
    f = np.concatenate(flips) if flips else np.empty(0, dtype=int)
    keep = ~np.isnan(m)
    return m[keep], f[keep]


def _bin_label(lo: float, hi: float) -> str:
    return f"[{lo:g}, {hi:g})" if np.isfinite(hi) else f">= {lo:g}"


def flip_by_margin(runs: list[Run]) -> pd.DataFrame:
    """Flip probability per margin bin, per configuration and plan (all its ON/OFF run pairs pooled)."""
    rows = []
    for (config, plan), group in by_plan(runs).items():
        parts = [flip_positions(on, off) for _, on, off in on_off_pairs(group)]
        if not parts:
            continue
        m = np.concatenate([p[0] for p in parts])
        f = np.concatenate([p[1] for p in parts])
        quant = _meta(next(iter(group.values())))["quant"]
        idx = np.digitize(m, MARGIN_BINS[1:-1])  # 0 .. len(bins) - 2
        for b, (lo, hi) in enumerate(zip(MARGIN_BINS[:-1], MARGIN_BINS[1:])):
            sel = idx == b
            n, k = int(sel.sum()), int(f[sel].sum())
            ci = wilson_interval(k, n) if n else (float("nan"), float("nan"))
            rows.append(
                {
                    "config": config,
                    "plan": plan,
                    "quant": quant,
                    "bin": b,
                    "margin_bin": _bin_label(lo, hi),
                    "margin_lo": lo,
                    "margin_hi": hi,
                    "positions": n,
                    "flips": k,
                    "flip_rate": k / n if n else float("nan"),
                    "wilson_lo": ci[0],
                    "wilson_hi": ci[1],
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "config",
            "plan",
            "quant",
            "bin",
            "margin_bin",
            "margin_lo",
            "margin_hi",
            "positions",
            "flips",
            "flip_rate",
            "wilson_lo",
            "wilson_hi",
        ],
    )


def flip_trend(curve: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and plan: does flip probability fall with the margin? Cochran-Armitage over the bins.

    z < 0: flips are more likely at smaller margins. Positions of one episode share a text, so the p-value treats
    dependent positions as independent and is optimistic; read it as a description, with the rates and intervals.
    """
    rows = []
    for (config, plan), g in curve.groupby(["config", "plan"], sort=True):
        g = g[g["positions"] > 0]
        row = {
            "config": config,
            "plan": plan,
            "positions": int(g["positions"].sum()),
            "flips": int(g["flips"].sum()),
            "z": float("nan"),
            "p_value": float("nan"),
        }
        if len(g) >= 2:
            row["z"], row["p_value"] = cochran_armitage(g["flips"], g["positions"], g["bin"].astype(float))
        rows.append(row)
    return pd.DataFrame(rows, columns=["config", "plan", "positions", "flips", "z", "p_value"])


# --- quantization series --------------------------------------------------------------------------------------


def page_test(data: np.ndarray) -> tuple[float, float, str]:
    """Page's L test that responses increase along the columns (blocks = rows); (L, one-sided p, method).

    scipy.stats.page_trend_test: exact null distribution for small designs, the normal approximation otherwise.
    """
    from scipy import stats  # scipy: a slow import, not needed to draw the figures

    res = stats.page_trend_test(np.asarray(data, dtype=float))
    return float(res.statistic), float(res.pvalue), str(res.method)


def episode_medians(run: Run) -> dict[str, float]:
    """Each episode's median margin over its generated positions (episodes without any are left out)."""
    by_episode = run.requests_by_episode()
    get = dict.get
    ok = {eid: [q for q in reqs if get(q, "error") is None] for eid, reqs in by_episode.items()}
    records = [q for reqs in ok.values() for q in reqs]
    table, rows = _margin_table(run)
    at = table_rows(rows, records)
    if at is None:  # record by record
        out = {}
        for eid, reqs in ok.items():
            m = np.concatenate([request_margins(q, run) for q in reqs] or [np.array([])])
            m = m[~np.isnan(m)]
            if m.size:
                out[eid] = float(np.median(m))
        return out
    # the episodes' margins one after the other; each episode's count of those that are not NaN
    group = np.repeat(np.repeat(np.arange(len(ok)), [len(reqs) for reqs in ok.values()]), at[:, 1])
    m = table[ranges(at[:, 0], at[:, 1])]
    keep = ~np.isnan(m)
    size = np.bincount(group[keep], minlength=len(ok))
    med = segment_medians(m[keep], size)
    return {eid: float(med[i]) for i, eid in enumerate(ok) if size[i]}


def margin_trend(runs: list[Run], plan: str = "main") -> pd.DataFrame:
    """Page's test per series (engine, model) over the quantization levels that ran `plan`'s OFF run 1."""
    series: dict[tuple, dict] = {}
    for r in runs:
        m = r.manifest
        if not r.complete or m.get("plan") != plan or m.get("arm") != "off" or m.get("run") != 1:
            continue
        meta = _meta(r)
        level = quant_level(meta["quant"])
        if level is None:
            continue
        series.setdefault((meta["engine"], meta["model_name"]), {})[level.rank] = (meta["quant"], r)
    rows = []
    for (engine, model_name), by_rank in sorted(series.items(), key=lambda kv: tuple(map(str, kv[0]))):
        ranks = sorted(by_rank, reverse=True)  # coarsest first
        labels = tuple(by_rank[k][0] for k in ranks)
        row = {
            "engine": engine,
            "model_name": model_name,
            "levels": " < ".join(labels),
            "n_levels": len(ranks),
            "episodes": 0,
            "L": float("nan"),
            "p_value": float("nan"),
            "method": "",
            "note": "",
        }
        if len(ranks) < MIN_TREND_LEVELS:
            row["note"] = f"needs >= {MIN_TREND_LEVELS} quantization levels"
            rows.append(row)
            continue
        medians = [episode_medians(by_rank[k][1]) for k in ranks]
        common = [e for e in medians[0] if all(e in d for d in medians[1:])]
        row["episodes"] = len(common)
        if len(common) < 2:
            row["note"] = "needs >= 2 episodes common to every level"
        else:
            row["L"], row["p_value"], row["method"] = page_test(np.array([[d[e] for d in medians] for e in common]))
            row["note"] = "H1: episode median margins increase from the coarsest to the finest level"
        rows.append(row)
    return pd.DataFrame(
        rows, columns=["engine", "model_name", "levels", "n_levels", "episodes", "L", "p_value", "method", "note"]
    )
