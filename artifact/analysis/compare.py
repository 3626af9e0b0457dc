"""Episode-by-episode comparison of two runs, and the cache exposure of one run (measured, never assumed).

An episode diverges when any request's generated token ids differ, or the two runs made a different number of
requests. For each diverged episode we report the first diverging request index and, within it, the first
diverging token index (the length of the shorter output when one is a prefix of the other).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from artifact.records.store import Run


@dataclass(frozen=True)
class EpisodeDiff:
    episode_id: str
    diverged: bool
    first_request: int | None = None
    first_token: int | None = None
    n_requests: tuple[int, int] = (0, 0)


@dataclass
class Comparison:
    a: str
    b: str
    episodes: list[EpisodeDiff]
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
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


def compare_episode(episode_id: str, reqs_a: list[dict], reqs_b: list[dict]) -> tuple[EpisodeDiff, bool]:
    """The episode's diff, and whether identical outputs came with different prompts."""
    counts = (len(reqs_a), len(reqs_b))
    for i, (ra, rb) in enumerate(zip(reqs_a, reqs_b)):
        tok = first_difference(ra["output_tokens"], rb["output_tokens"])
        if tok is not None:
            return EpisodeDiff(episode_id, True, i, tok, counts), False
    prompt_mismatch = any(ra["prompt_sha256"] != rb["prompt_sha256"] for ra, rb in zip(reqs_a, reqs_b))
    if counts[0] != counts[1]:
        return EpisodeDiff(episode_id, True, min(counts), None, counts), prompt_mismatch
    return EpisodeDiff(episode_id, False, n_requests=counts), prompt_mismatch


def compare_runs(a: Run, b: Run) -> Comparison:
    """Compare the episodes both runs made, in run a's episode order."""
    ea, eb = a.requests_by_episode(), b.requests_by_episode()
    ids_a, ids_b = a.manifest["episodes"], b.manifest["episodes"]
    common = [e for e in ids_a if e in set(ids_b)]
    cmp = Comparison(a.label, b.label, [],
                     only_in_a=[e for e in ids_a if e not in set(ids_b)],
                     only_in_b=[e for e in ids_b if e not in set(ids_a)])
    for eid in common:
        diff, prompt_mismatch = compare_episode(eid, ea.get(eid, []), eb.get(eid, []))
        cmp.episodes.append(diff)
        if prompt_mismatch:
            cmp.prompt_mismatches.append(eid)
    return cmp


@dataclass(frozen=True)
class Paired:
    """One of the paper's comparisons within a configuration and plan."""

    kind: str  # "off_rerun" (OFF run 1 vs 2), "on_rerun" (ON run 1 vs 2) or "on_vs_off" (ON run k vs OFF run k)
    k: int  # run 1 for reruns; run k for ON vs OFF
    name: str  # e.g. "ON run 2 vs OFF run 2"
    cmp: Comparison


def paired_comparisons(runs: list[Run]) -> list[Paired]:
    """The paper's comparisons among the complete runs of one configuration and plan."""
    by = {(r.manifest["arm"], r.manifest["run"]): r for r in runs if r.complete}
    out = []
    for arm in ("off", "on"):
        if (arm, 1) in by and (arm, 2) in by:
            out.append(Paired(f"{arm}_rerun", 1, f"{arm.upper()} run 1 vs run 2",
                              compare_runs(by[(arm, 1)], by[(arm, 2)])))
    for k in sorted({k for (_, k) in by}):
        if ("on", k) in by and ("off", k) in by:
            out.append(Paired("on_vs_off", k, f"ON run {k} vs OFF run {k}", compare_runs(by[("on", k)], by[("off", k)])))
    return out


@dataclass(frozen=True)
class Exposure:
    prompt_tokens: int
    cached_tokens: int
    requests: int
    requests_with_cache: int

    @property
    def share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def cache_exposure(run: Run) -> Exposure:
    """Share of prompt tokens the server says it served from cache (`timings.cache_n`)."""
    ok = [r for r in run.requests if r.get("error") is None]
    return Exposure(
        prompt_tokens=sum(r["prompt_tokens"] for r in ok),
        cached_tokens=sum(r["cache_n"] for r in ok),
        requests=len(ok),
        requests_with_cache=sum(1 for r in ok if r["cache_n"] > 0),
    )


def validity_problems(run: Run) -> list[str]:
    """Reasons a run cannot be used as evidence: incomplete, or an OFF run that was served cached tokens."""
    problems = []
    if not run.complete:
        problems.append(f"{run.label} is incomplete ({run.path})")
    if run.manifest["arm"] == "off":
        hits = cache_exposure(run).requests_with_cache
        if hits:
            problems.append(f"{run.label}: cache-OFF run served cached tokens in {hits} requests (invalid)")
    return problems
