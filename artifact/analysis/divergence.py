"""Episode-by-episode divergence of two runs (the paper's measure), and the cache exposure of one run (measured,
never assumed).

An episode diverges when any request's generated token ids differ, or the two runs made a different number of
requests. Only runs that may be compared are paired (`pairing_problem`: equal pairing fingerprints and episode lists). For each diverged episode we report the first diverging request index and, within it, the first
diverging token index (the length of the shorter output when one is a prefix of the other).
"""

from __future__ import annotations

import itertools
import operator
import statistics
from dataclasses import dataclass, field

from artifact import engines
from artifact.errors import ArtifactError
from artifact.records.store import Run, outputs


@dataclass(frozen=True)
class EpisodeDiff:
    episode_id: str
    diverged: bool
    first_request: int | None = None
    first_token: int | None = None
    n_requests: tuple[int, int] = (0, 0)
    evidence: bool = True  # both runs made at least one request of it without an error


@dataclass
class Comparison:
    a: str
    b: str
    episodes: list[EpisodeDiff]
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    without_requests: list[str] = field(default_factory=list)  # listed by both, but a run holds no request of it
    # Identical outputs but different prompts: a harness nondeterminism (e.g. a simulator reading the clock).
    prompt_mismatches: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.episodes)

    @property
    def diverged(self) -> list[EpisodeDiff]:
        return [e for e in self.episodes if e.diverged]

    @property
    def k(self) -> int:
        return len(self.diverged)

    @property
    def n_evidence(self) -> int:
        """Compared episodes in which both runs made at least one request without an error."""
        return sum(e.evidence for e in self.episodes)

    @property
    def flags(self) -> list[int]:
        """0/1 per compared episode, in episode order (for block-bootstrap intervals)."""
        return [int(e.diverged) for e in self.episodes]

    @property
    def median_first_request(self) -> float | None:
        vals = [e.first_request for e in self.diverged if e.first_request is not None]
        return statistics.median(vals) if vals else None

    @property
    def median_first_token(self) -> float | None:
        vals = [e.first_token for e in self.diverged if e.first_token is not None]
        return statistics.median(vals) if vals else None


def first_difference(x: list, y: list) -> int | None:
    """Index of the first position where two sequences differ (None if equal)."""
    if x == y:  # the common case, at C speed
        return None
    for i, (u, v) in enumerate(zip(x, y)):
        if u != v:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def episode_outputs(run: Run) -> dict[str, tuple[list, list, list, list]]:
    """episode id -> `outputs` of its requests in request_index order (`Run.episode_outputs`: made once per run, as
    check loads it); do not change the lists."""
    return run.episode_outputs()


def first_unequal(x: list, y: list) -> int | None:
    """The first index i where x[i] != y[i] (over the shorter list), None if there is none; at C speed."""
    return next(itertools.compress(itertools.count(), map(operator.ne, x, y)), None)


def compare_episode(episode_id: str, reqs_a: list[dict], reqs_b: list[dict]) -> tuple[EpisodeDiff, bool]:
    """The episode's diff, and whether identical outputs came with different prompts."""
    return _episode_diff(episode_id, outputs(reqs_a), outputs(reqs_b))


def _episode_diff(episode_id: str, a: tuple, b: tuple) -> tuple[EpisodeDiff, bool]:
    """`compare_episode` of the two runs' `outputs`: the requests' outputs compared as two lists at once (at C
    speed); a diverged episode's walked to the first difference."""
    (ta, sa, xa, _), (tb, sb, xb, _) = a, b
    counts = (len(ta), len(tb))
    evidence = None in xa and None in xb  # a request without an error in each
    n = min(counts)
    if counts[0] != counts[1]:
        ta, tb, sa, sb = ta[:n], tb[:n], sa[:n], sb[:n]
    if ta != tb:
        i = first_unequal(ta, tb)
        return EpisodeDiff(episode_id, True, i, first_difference(ta[i], tb[i]), counts, evidence), False
    prompt_mismatch = sa != sb
    if counts[0] != counts[1]:
        return EpisodeDiff(episode_id, True, n, None, counts, evidence), prompt_mismatch
    return EpisodeDiff(episode_id, False, n_requests=counts, evidence=evidence), prompt_mismatch


def compare_runs(a: Run, b: Run) -> Comparison:
    """Compare the episodes both runs made, in run a's episode order.

    An episode is compared only if both runs list it and hold at least one request of it; the others are listed
    in `only_in_a`, `only_in_b` and `without_requests`.
    """
    ea, eb = a.requests_by_episode(), b.requests_by_episode()
    oa, ob = episode_outputs(a), episode_outputs(b)
    ids_a, ids_b = a.manifest["episodes"], b.manifest["episodes"]
    set_a, set_b = set(ids_a), set(ids_b)
    cmp = Comparison(
        a.label,
        b.label,
        [],
        only_in_a=[e for e in ids_a if e not in set_b],
        only_in_b=[e for e in ids_b if e not in set_a],
    )
    for eid in dict.fromkeys(e for e in ids_a if e in set_b):
        if not ea.get(eid) or not eb.get(eid):
            cmp.without_requests.append(eid)
            continue
        diff, prompt_mismatch = _episode_diff(eid, oa[eid], ob[eid])
        cmp.episodes.append(diff)
        if prompt_mismatch:
            cmp.prompt_mismatches.append(eid)
    return cmp


def made_comparison(a: Run, b: Run) -> Comparison | None:
    """The comparison of a and b `compared` made already, either way round (None if it made none): where their
    episodes' tokens first differ reads the same both ways."""
    for x, y in ((a, b), (b, a)):
        hit = x.__dict__.get("_comparisons", {}).get(id(y))
        if hit is not None:
            return hit[1]
    return None


def compared(a: Run, b: Run) -> Comparison:
    """compare_runs(a, b), computed once per pair of runs and kept on run a (the paper's tables, the report and the
    analyses beyond the paper ask for the same pairs; a Comparison is never changed once made)."""
    cache = a.__dict__.setdefault("_comparisons", {})
    hit = cache.get(id(b))
    if hit is None:
        hit = cache[id(b)] = (b, compare_runs(a, b))  # b is held so that its id is not reused
    return hit[1]


# --- which runs may be compared -------------------------------------------------------------------------------

PAIRED_ARMS = ("off", "on")  # the arms whose runs are compared with each other (the bridge compares within a run)
FINGERPRINT = "pairing_fingerprint"
PAIRING_INPUTS = "pairing_inputs"


def _first_difference_key(a: dict, b: dict) -> str:
    """The first key (sorted, dotted into sub-tables) whose value differs between two pairing_inputs tables."""
    a = a if isinstance(a, dict) else {}
    b = b if isinstance(b, dict) else {}
    for key in sorted(set(a) | set(b), key=str):
        va, vb = a.get(key), b.get(key)
        if va != vb:
            if isinstance(va, dict) and isinstance(vb, dict):
                return f"{key}.{_first_difference_key(va, vb)}"
            return str(key)
    return "(none: pairing_inputs are equal, the fingerprints are not)"


def pairing_problem(a: Run, b: Run) -> str | None:
    """Why two runs may not be compared (None if they may): both must carry the same pairing_fingerprint (the
    protocol's digest of everything that must be equal between compared runs except the arm's own cache switch)
    and list the same episodes. A run without a fingerprint is invalid on its own (`validity_problems`)."""
    fa, fb = a.manifest.get(FINGERPRINT), b.manifest.get(FINGERPRINT)
    if fa is None or fb is None:
        return None
    if fa != fb:
        key = _first_difference_key(a.manifest.get(PAIRING_INPUTS), b.manifest.get(PAIRING_INPUTS))
        return (
            f"{a.label} and {b.label} are not comparable: their pairing fingerprints differ "
            f"(first differing pairing input: {key}); comparison refused"
        )
    ea, eb = a.manifest["episodes"], b.manifest["episodes"]
    if ea != eb:
        only_a = [e for e in ea if e not in set(eb)]
        only_b = [e for e in eb if e not in set(ea)]
        what = (
            (f"{len(only_a)} only in the first (e.g. {only_a[0]})" if only_a else "")
            + ("; " if only_a and only_b else "")
            + (f"{len(only_b)} only in the second (e.g. {only_b[0]})" if only_b else "")
        )
        return (
            f"{a.label} and {b.label} are not comparable: they list different episodes "
            f"({what or 'same episodes in a different order'}); comparison refused"
        )
    return None


def comparable(run: Run) -> bool:
    """A run that may enter a comparison: complete, whole, and carrying a pairing fingerprint."""
    return run.complete and not run.integrity_problems() and isinstance(run.manifest.get(FINGERPRINT), str)


@dataclass(frozen=True)
class Paired:
    """One of the paper's comparisons within a configuration and plan."""

    kind: str  # "off_rerun" / "on_rerun" (run i vs run j of one arm) or "on_vs_off" (ON run k vs OFF run k)
    k: int  # the first run's number: run i for reruns, run k for ON vs OFF
    name: str  # e.g. "ON run 2 vs OFF run 2", "OFF run 1 vs run 3"
    cmp: Comparison
    a: Run = field(repr=False)
    b: Run = field(repr=False)


def plan_pairs(runs: list[Run]) -> tuple[list[Paired], list[tuple[str, str]]]:
    """The paper's comparisons among the comparable runs of one configuration and plan, and the pairings refused.

    Reruns: every pair i < j of the arm's runs (run 1 vs run 2 first, the paper's headline); ON vs OFF: run k of
    each arm. A pair whose runs differ in pairing fingerprint or episode list is refused: (kind, reason).
    """
    by = {(r.manifest["arm"], r.manifest["run"]): r for r in runs if comparable(r)}
    out, refused = [], []

    def add(kind: str, k: int, name: str, a: Run, b: Run) -> None:
        why = pairing_problem(a, b)
        if why is not None:
            refused.append((kind, why))
        else:
            out.append(Paired(kind, k, name, compared(a, b), a, b))

    for arm in PAIRED_ARMS:
        ks = sorted(k for (x, k) in by if x == arm)
        for i, ki in enumerate(ks):
            for kj in ks[i + 1 :]:
                add(f"{arm}_rerun", ki, f"{arm.upper()} run {ki} vs run {kj}", by[(arm, ki)], by[(arm, kj)])
    for k in sorted({k for (_, k) in by}):
        if ("on", k) in by and ("off", k) in by:
            add("on_vs_off", k, f"ON run {k} vs OFF run {k}", by[("on", k)], by[("off", k)])
    return out, refused


def paired_comparisons(runs: list[Run]) -> list[Paired]:
    """The comparisons `plan_pairs` makes (the refused ones are left out)."""
    return plan_pairs(runs)[0]


@dataclass(frozen=True)
class Exposure:
    prompt_tokens: int  # over the requests that report cache use and their prompt size
    cached_tokens: int  # every reported cache_n, failed requests included
    requests: int
    requests_with_cache: int  # requests (failed ones included) with cache_n > 0
    unreported: int = 0  # requests whose cache_n is null (not reported): never read as 0

    @property
    def share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def reported(self) -> bool:
        """Whether any request reported its cache use."""
        return self.unreported < self.requests


def cache_exposure(run: Run) -> Exposure:
    """Share of prompt tokens the server says it served from cache (`timings.cache_n`).

    Every request counts, a failed one included (its cache_n, when reported, was served). A null cache_n is
    "not reported": it is counted in `unreported` and never hides a non-zero count on another request.
    """
    get, repeat = dict.get, itertools.repeat
    reqs = run.requests
    cns = list(map(get, reqs, repeat("cache_n")))
    if list(map(type, cns)).count(int) == len(cns):  # every request reports it (the engines' common case): at once
        pts = list(map(get, reqs, repeat("prompt_tokens")))
        prompt = sum(pts) if list(map(type, pts)).count(int) == len(pts) else sum(pt for pt in pts if type(pt) is int)
        return Exposure(prompt, sum(cns), len(reqs), sum(map(operator.gt, cns, repeat(0))), 0)
    prompt = cached = with_cache = unreported = 0
    for r in reqs:
        cn = get(r, "cache_n")
        if type(cn) is not int:
            unreported += 1
            continue
        cached += cn
        with_cache += cn > 0
        pt = get(r, "prompt_tokens")
        if type(pt) is int:
            prompt += pt
    return Exposure(prompt, cached, len(run.requests), with_cache, unreported)


def record_problems(run: Run) -> list[str]:
    """Reasons a run's records cannot be used: incomplete, marked complete but not whole, or made without a pairing
    fingerprint (an older artifact version: its pairings cannot be verified)."""
    problems = []
    if not run.complete:
        problems.append(f"{run.label} is incomplete ({run.path})")
    problems += run.integrity_problems()
    if run.manifest["arm"] in PAIRED_ARMS and not isinstance(run.manifest.get(FINGERPRINT), str):
        problems.append(
            f"{run.label} has no {FINGERPRINT} in its manifest (made by an older artifact version): "
            f"its comparisons cannot be verified; re-run it ({run.path})"
        )
    return problems


def cache_problem(run: Run, exposure: Exposure | None = None) -> str | None:
    """An OFF run that was served cached tokens (on any request that reports it, failed ones included);
    `exposure` is the run's `cache_exposure` where the caller has it already."""
    if run.manifest["arm"] != "off":
        return None
    hits = (exposure or cache_exposure(run)).requests_with_cache
    return f"{run.label}: cache-OFF run served cached tokens in {hits} requests (invalid)" if hits else None


def cache_unused(run: Run, exposure: Exposure | None) -> str | None:
    """Why an ON run is no evidence of what the cache does (None if it is): none of its requests was served a
    cached token, or none reported its cache use (`exposure` None). Compared with OFF, such a run compares two
    uncached runs; the claims about the cache's effect (RQ2, RQ4) are INCONCLUSIVE on it, never PASS."""
    if run.manifest["arm"] != "on":
        return None
    warm = start_problem(run)
    if warm:
        return warm
    if exposure is None:
        return f"{run.label} reports no cache use (cache_n null on every request): not shown to be a cache-ON run"
    if not exposure.cached_tokens:
        return (
            f"{run.label} was served no cached token (cache_n = 0 on all {exposure.requests} requests): not a "
            "cache-ON run"
        )
    return None


def start_problem(run: Run) -> str | None:
    """Why an ON run's records show it did not start from the cache state the protocol starts it in (a cache warmed
    before ON run 1), as the run's engine reads its records (`Engine.audit.start_problem`); None if they do not."""
    try:
        engine = engines.get(run.manifest.get("engine"))
    except ArtifactError:
        return None
    return engine.audit.start_problem(run.manifest, run.requests)


def validity_problems(run: Run) -> list[str]:
    """Reasons a run cannot be used as evidence: `record_problems`, or an OFF run served cached tokens."""
    cache = cache_problem(run)
    return record_problems(run) + ([cache] if cache else [])
