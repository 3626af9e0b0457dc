"""The pairwise comparisons and the margin and quantization analyses compute at once what they once computed request
by request (made once per run or pair of runs, array arithmetic over the runs' top-2 tables): each is held here to
the request-by-request definition it replaced (kept below as the reference, operation for operation), on random
pairs of runs built to hit every branch (diverging tokens, a shorter output, unequal request counts, errors,
different prompts, requests served no cached token, runs that share no comparison yet), float for float. The same
analyses on records decoded by the strict decoder (plain dicts: not in the run's top-2 table, so read record by
record) must give the same values too.
"""

from __future__ import annotations

import json
import operator
import random
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from artifact.analysis import margins
from artifact.analysis import quantization as qm
from artifact.analysis.divergence import cache_exposure, compare_runs, first_difference
from artifact.analysis.groups import same_prompt_requests
from artifact.check import facts
from artifact.records.store import REQUESTS, Run, load_run
from synthetic_runs import write_bfcl_run


# --- the request-by-request definitions (the code the analyses ran before they computed at once) -----------------


def reference_same_prompt_requests(a, b):
    eb = b.requests_by_episode()
    for eid, reqs_a in a.requests_by_episode().items():
        for qa, qb in zip(reqs_a, eb.get(eid, [])):
            if dict.get(qa, "error") or dict.get(qb, "error") or qa["prompt_sha256"] != qb["prompt_sha256"]:
                break
            yield qa, qb
            if qa["output_tokens"] != qb["output_tokens"]:
                break


def reference_compare_episode(episode_id, reqs_a, reqs_b):
    counts = (len(reqs_a), len(reqs_b))
    evidence = any(dict.get(r, "error") is None for r in reqs_a) and any(dict.get(r, "error") is None for r in reqs_b)
    for i, (ra, rb) in enumerate(zip(reqs_a, reqs_b)):
        tok = first_difference(ra["output_tokens"], rb["output_tokens"])
        if tok is not None:
            return (episode_id, True, i, tok, counts, evidence), False
    prompt_mismatch = any(ra["prompt_sha256"] != rb["prompt_sha256"] for ra, rb in zip(reqs_a, reqs_b))
    if counts[0] != counts[1]:
        return (episode_id, True, min(counts), None, counts, evidence), prompt_mismatch
    return (episode_id, False, None, None, counts, evidence), prompt_mismatch


def reference_flip_positions(on, off):
    ms, fs = [], []
    for q_off, q_on in reference_same_prompt_requests(off, on):
        if dict.get(q_on, "cache_n") == 0:
            continue
        a, b = q_off["output_tokens"], q_on["output_tokens"]
        diff = first_difference(a, b)
        if diff is not None and diff >= min(len(a), len(b)):
            diff = None
        m = margins.request_margins(q_off, off)
        n = min(len(a), len(b), m.size)
        flipped = diff is not None and diff < n
        upto = diff + 1 if flipped else n
        f = np.zeros(upto, dtype=int)
        if flipped:
            f[-1] = 1
        ms.append(m[:upto])
        fs.append(f)
    m = np.concatenate(ms) if ms else np.empty(0)
    f = np.concatenate(fs) if fs else np.empty(0, dtype=int)
    keep = ~np.isnan(m)
    return m[keep], f[keep]


def reference_positions(on, off):
    offs, ons, eids, indexes, lengths, flipped = [], [], [], [], [], []
    for q_off, q_on in reference_same_prompt_requests(off, on):
        if dict.get(q_on, "cache_n") == 0:
            continue
        a_off, a_on = margins.top2(off, q_off), margins.top2(on, q_on)
        if a_off is None or a_on is None:
            continue
        t_off, t_on = q_off["output_tokens"], q_on["output_tokens"]
        n = min(len(t_off), len(t_on), len(a_off), len(a_on))
        flip = first_difference(t_off[:n], t_on[:n])
        upto = n if flip is None else flip + 1
        offs.append(a_off[:upto])
        ons.append(a_on[:upto])
        eids.append(q_on["episode_id"])
        indexes.append(q_on["request_index"])
        lengths.append(upto)
        flipped.append(flip is not None)
    if not offs:
        return qm._empty()
    a, b = np.concatenate(offs), np.concatenate(ons)
    lengths = np.asarray(lengths)
    margin = np.abs(a[:, 1] - a[:, 3])
    off_first = a[:, 1] >= a[:, 3]
    best, second = np.where(off_first, a[:, 0], a[:, 2]), np.where(off_first, a[:, 2], a[:, 0])

    def on_logprob(token):
        return np.where(token == b[:, 0], b[:, 1], np.where(token == b[:, 2], b[:, 3], np.nan))

    delta = margin - (on_logprob(best) - on_logprob(second))
    ends = np.cumsum(lengths)
    flip = np.zeros(len(a), dtype=np.int64)
    flip[ends[np.asarray(flipped)] - 1] = 1
    m = on.manifest
    return pd.DataFrame(
        {
            "config": np.full(len(a), m["config"], dtype=object),
            "plan": np.full(len(a), m["plan"], dtype=object),
            "run": np.full(len(a), m["run"], dtype=np.int64),
            "episode_id": np.repeat(np.array(eids, dtype=object), lengths),
            "request_index": np.repeat(np.asarray(indexes, dtype=np.int64), lengths),
            "position": np.arange(len(a)) - np.repeat(ends - lengths, lengths),
            "margin": margin,
            "delta": delta,
            "flip": flip,
        },
        columns=qm.POSITION_COLUMNS,
    )


def reference_episode_medians(run):
    out = {}
    for eid, reqs in run.requests_by_episode().items():
        m = np.concatenate(
            [margins.request_margins(q, run) for q in reqs if dict.get(q, "error") is None] or [np.array([])]
        )
        m = m[~np.isnan(m)]
        if m.size:
            out[eid] = float(np.median(m))
    return out


def reference_timed_units(rows_of):
    units = defaultdict(list)
    for run, rows in rows_of.values():
        by = defaultdict(list)
        for row in rows:
            if row[3] is not None or row[4] is not None:
                by[row[0]].append(row[1:])
        for eid, seq in by.items():
            seq.sort(key=operator.itemgetter(0))
            units[tuple(seq)].append((run, eid))
    return list(units.values())


def reference_cache_exposure(run):
    prompt = cached = with_cache = unreported = 0
    for r in run.requests:
        cn = dict.get(r, "cache_n")
        if type(cn) is not int:
            unreported += 1
            continue
        cached += cn
        with_cache += cn > 0
        pt = dict.get(r, "prompt_tokens")
        if type(pt) is int:
            prompt += pt
    return prompt, cached, len(run.requests), with_cache, unreported


# --- random pairs of runs -----------------------------------------------------------------------------------------


def _top(rng, toks):
    """A top-2 list whose best entry is the emitted token (margins random, ties included)."""
    out = []
    for t in toks:
        lp1 = -rng.choice([0.7, 0.8, 1.2, 2.0])  # probabilities that sum to < 1
        lp2 = lp1 - rng.choice([0.0, 0.004, 0.02, 0.2, 1.5])
        out.append([[t, lp1], [t + 1 + rng.randrange(3), lp2]])
    return out


def random_pair(root, seed: int, plan: str = "main", run: int = 1):
    """An OFF and an ON run of 8 episodes whose requests agree, diverge, stop early, fail or change their prompt at
    random; the ON run's cache_n is 0, 60 or null at random."""
    rng = random.Random(seed)
    off, on, lp_off, lp_on, prompts_on, err_off, err_on, cache_ns = {}, {}, {}, {}, {}, {}, {}, {}
    for e in range(8):
        eid = f"e{e}"
        reqs = [[rng.randrange(1, 9) for _ in range(rng.randrange(0, 7))] for _ in range(rng.randrange(1, 5))]
        other = [list(t) for t in reqs]
        what = rng.choice(["same", "token", "shorter", "longer", "fewer", "more", "error", "prompt", "token"])
        i = rng.randrange(len(other))
        if what == "token" and other[i]:
            other[i][rng.randrange(len(other[i]))] += 10
        elif what == "shorter" and other[i]:
            other[i] = other[i][:-1]
        elif what == "longer":
            other[i] = other[i] + [rng.randrange(1, 9)]
        elif what == "fewer" and len(other) > 1:
            other = other[:-1]
        elif what == "more":
            other = other + [[rng.randrange(1, 9)]]
        elif what == "error":
            (err_off if rng.random() < 0.5 else err_on)[(eid, i)] = "HTTP 500"
        elif what == "prompt":
            prompts_on[(eid, i)] = f"another prompt {seed}"
        off[eid], on[eid] = reqs, other
        for j, t in enumerate(reqs):
            lp_off[(eid, j)] = _top(rng, t)
        for j, t in enumerate(other):  # the ON arm's: the OFF arm's top-2 slightly perturbed where it agrees
            base, top = lp_off.get((eid, j), []), []
            for q, tok in enumerate(t):
                if q < len(base) and base[q][0][0] == tok and rng.random() < 0.8:
                    (i1, l1), (i2, l2) = base[q]
                    top.append([[i1, l1], [i2, min(l1, l2 + rng.choice([0.0, 0.0, 0.001, -0.01]))]])
                else:
                    top += _top(rng, [tok])
            lp_on[(eid, j)] = top
            cache_ns[(eid, j)] = rng.choice([0, 60, 60, None])
    b = write_bfcl_run(root, "off", run, off, logprobs=lp_off, errors=err_off, plan=plan)
    a = write_bfcl_run(
        root, "on", run, on, logprobs=lp_on, prompts=prompts_on, errors=err_on, cache_ns=cache_ns, plan=plan
    )
    return a, b


def fresh(run: Run) -> Run:
    """The run loaded anew: nothing memoised on it."""
    return load_run(run.path)


def strict(run: Run) -> Run:
    """The run with every request decoded by the strict decoder (plain dicts: none in its top-2 table)."""
    twin = load_run(run.path)
    twin._requests = [json.loads(line) for line in (run.path / REQUESTS).read_text().splitlines()]
    return twin


SEEDS = range(24)


@pytest.mark.parametrize("seed", SEEDS)
def test_same_prompt_pairs_are_the_request_by_request_walk(tmp_path, seed):
    on, off = random_pair(tmp_path, seed)
    for a, b in ((off, on), (on, off)):
        for compared_first in (False, True):
            x, y = fresh(a), fresh(b)
            if compared_first:  # the walk reads where tokens differ from the comparison made already
                compare_runs(y, x)
            got = [(id(p), id(q)) for p, q in same_prompt_requests(x, y)]
            want = [(id(p), id(q)) for p, q in reference_same_prompt_requests(x, y)]
            assert got == want


@pytest.mark.parametrize("seed", SEEDS)
def test_compare_runs_is_the_request_by_request_comparison(tmp_path, seed):
    on, off = random_pair(tmp_path, seed)
    for a, b in ((on, off), (off, on)):
        c = compare_runs(fresh(a), fresh(b))
        ea, eb = a.requests_by_episode(), b.requests_by_episode()
        want = [reference_compare_episode(e, ea[e], eb[e]) for e in a.manifest["episodes"] if ea.get(e) and eb.get(e)]
        assert [
            (
                (d.episode_id, d.diverged, d.first_request, d.first_token, d.n_requests, d.evidence),
                d.episode_id in c.prompt_mismatches,
            )
            for d in c.episodes
        ] == want


@pytest.mark.parametrize("seed", SEEDS)
def test_flip_positions_and_positions_are_the_request_by_request_ones(tmp_path, seed):
    on, off = random_pair(tmp_path, seed)
    for load in (fresh, strict):
        x, y = load(on), load(off)
        m, f = margins.flip_positions(x, y)
        rm, rf = reference_flip_positions(fresh(on), fresh(off))
        assert m.dtype == rm.dtype and f.dtype == rf.dtype
        assert m.tobytes() == rm.tobytes() and f.tobytes() == rf.tobytes()
        pd.testing.assert_frame_equal(qm.positions(x, y), reference_positions(fresh(on), fresh(off)))


def test_position_frames_are_the_pairs_positions_concatenated(tmp_path):
    pairs = [
        random_pair(tmp_path, seed, plan, run) for seed, plan, run in ((1, "main", 1), (2, "main", 2), (3, "cram0", 1))
    ]
    frames = qm.position_frames([r for pair in pairs for r in pair])
    for plan, group in (("main", pairs[:2]), ("cram0", pairs[2:])):
        parts = [p for on, off in group if not (p := reference_positions(fresh(on), fresh(off))).empty]
        if parts:
            pd.testing.assert_frame_equal(frames[("cfg", plan)], pd.concat(parts, ignore_index=True))


@pytest.mark.parametrize("seed", SEEDS)
def test_episode_medians_and_margin_distribution_are_the_request_by_request_ones(tmp_path, seed):
    on, off = random_pair(tmp_path, seed)
    for run in (on, off):
        assert margins.episode_medians(fresh(run)) == reference_episode_medians(fresh(run))
        assert margins.episode_medians(strict(run)) == reference_episode_medians(fresh(run))
    pd.testing.assert_frame_equal(
        margins.margin_distribution([fresh(on), fresh(off)]), margins.margin_distribution([strict(on), strict(off)])
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_cache_exposure_is_the_request_by_request_sum(tmp_path, seed):
    on, off = random_pair(tmp_path, seed)
    for run in (on, off):
        e = cache_exposure(run)
        assert (
            e.prompt_tokens,
            e.cached_tokens,
            e.requests,
            e.requests_with_cache,
            e.unreported,
        ) == reference_cache_exposure(run)


@pytest.mark.parametrize("seed", range(40))
def test_timed_units_are_the_row_by_row_grouping(seed):
    """Rows of episodes written in runs of rows, interleaved, out of index order, some without a timing, some
    copied from another run or episode."""
    rng = random.Random(seed)
    rows_of = {}
    for k in range(4):
        rows = []
        for e in range(6):
            n = rng.randrange(1, 5)
            for i in rng.sample(range(n), n):
                timing = (
                    (None, None) if rng.random() < 0.15 else (rng.choice([1.0, 2.5, None]), rng.choice([3.0, 4.0, 3]))
                )
                rows.append((f"e{e}", i, f"sha{e}-{i}", *timing))
        if rng.random() < 0.5:
            rng.shuffle(rows)
        if k and rng.random() < 0.5:  # a copy of the previous run, or of one of its episodes under another name
            prev = rows_of[k - 1][1]
            rows = list(prev) if rng.random() < 0.5 else rows + [("e9", *r[1:]) for r in prev if r[0] == "e0"]
        rows_of[k] = (f"run{k}", rows)
    assert facts._timed_units(rows_of) == reference_timed_units(rows_of)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 10, 11, 599, 600, 601, 1200, 1201])
def test_quantization_statistics_are_pandas_own(n):
    """The Series.mean, .median and .quantile(0.9) the quantization tables held, computed on the column arrays:
    the same float, bit for bit (with ties, zeros and NaNs among the values)."""
    rng = np.random.default_rng(n)
    x = rng.choice([0.0, 0.25, 1e-3, 2.0], size=n) * rng.random(n)
    x[rng.random(n) < 0.1] = np.nan
    s = pd.Series(x)
    assert np.float64(qm._median(x)).tobytes() == np.float64(s.median()).tobytes()
    d = np.abs(x[~np.isnan(x)])
    if d.size:
        assert np.float64(qm._quantile(d, 0.9)).tobytes() == np.float64(pd.Series(d).quantile(0.9)).tobytes()
    flips = (rng.random(n) < 0.3).astype(np.int64)
    assert qm._mean(flips) == pd.Series(flips).mean() and qm._mean(d == 0) == (pd.Series(d) == 0).mean()
