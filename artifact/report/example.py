"""One diverging episode for the report: the first diverging request of one diverged episode, with both
continuations, the top-2 margins and, where the run's workload keeps them, the trajectory from there (an agent's
calls and the results it saw: `Workload.example_trajectory`, `Workload.divergence_change`). It sits in the report,
above the workloads, because it asks each run's workload for its part."""

from __future__ import annotations

from typing import Any

import os

from artifact import workloads
from artifact.analysis.tables import PAPER_PLAN, Pair, PlanGroup
from artifact.records.store import Run
from artifact.workloads.base import Workload


def top2_margin(top_logprobs: list, index: int | None) -> dict | None:
    """The two most likely tokens at a generated position and their log-probability margin."""
    if index is None or not isinstance(top_logprobs, list) or index >= len(top_logprobs):
        return None
    at = top_logprobs[index]
    cands = [
        c
        for c in (at if isinstance(at, list) else [])
        if isinstance(c, (list, tuple)) and len(c) == 2 and isinstance(c[1], (int, float))
    ]
    if len(cands) < 2:
        return None
    (t1, l1), (t2, l2) = sorted(cands, key=lambda c: -c[1])[:2]
    return {"top1_id": t1, "top1_logprob": l1, "top2_id": t2, "top2_logprob": l2, "margin": l1 - l2}


def _text_split(a: str, b: str) -> tuple[str, str, str]:
    common = os.path.commonprefix([a, b])
    return common, a[len(common) :], b[len(common) :]


def _token_window(tokens: list, at: int | None, width: int = 8) -> dict:
    if at is None:
        at = len(tokens)
    lo = max(0, at - width)
    return {
        "start": lo,
        "before": tokens[lo:at],
        "at": tokens[at] if at < len(tokens) else None,
        "after": tokens[at + 1 : at + 1 + width],
        "total": len(tokens),
    }


EXAMPLE_ORDER = ("on_vs_off", "on_rerun", "off_rerun")


def _workload(run: Run):
    """The workload a run's records are of (its own part of the example), else the interface's plain defaults."""
    return workloads.of_run(run) or _PLAIN


class _Plain(Workload):
    """The interface's defaults, for runs of a workload this version does not know: it reads records only."""

    name = "unknown"

    def prepare(self, cfg: Any) -> Any:
        raise NotImplementedError("a workload this version does not know is never run")

    def run_unit(self, cfg: Any, prepared: Any, index: int, arm: str, query: Any, log: Any) -> dict:
        raise NotImplementedError("a workload this version does not know is never run")


_PLAIN = _Plain()


def call_flip(pair: Pair, d) -> str | None:
    """What the episode's first divergence changed beyond the reply, as its workload tells
    (`Workload.divergence_change`: an agent's changed call, "call", and with it the result it saw, "observation")."""
    return _workload(pair.a).divergence_change(pair.a, pair.b, d.episode_id, d.first_request)


def divergence_example(groups: list[PlanGroup]) -> dict | None:
    """The first diverging request of one diverged episode, with both continuations, the top-2 margins and the
    trajectory from there (calls and their results, where the records hold them).

    Preference: an episode whose first divergence changed a tool call and with it the result the model saw next
    (`call_flip`), then one where it changed a call only, in a headline ON-vs-OFF comparison (then an ON rerun,
    then an OFF rerun), plan main first; else the first diverged episode whose divergence is a token (not only a
    different number of requests).
    """
    ordered = sorted(groups, key=lambda g: (g.plan != PAPER_PLAN, g.config, g.plan))
    candidates = [
        (g, pair) for kind in EXAMPLE_ORDER for g in ordered if (pair := g.headline(kind)) is not None and pair.cmp.k
    ]
    chosen = next(
        (
            (g, pair, d)
            for want in ("observation", "call")
            for g, pair in candidates
            for d in pair.cmp.diverged
            if call_flip(pair, d) == want
        ),
        None,
    )
    if chosen is None and candidates:
        g, pair = candidates[0]
        chosen = (g, pair, sorted(pair.cmp.diverged, key=lambda e: e.first_token is None)[0])
    if chosen is None:
        return None
    g, pair, d = chosen
    c = pair.cmp
    ra, rb = pair.a, pair.b
    qa = ra.requests_by_episode().get(d.episode_id, [])
    qb = rb.requests_by_episode().get(d.episode_id, [])
    i = d.first_request
    req_a = qa[i] if i is not None and i < len(qa) else None
    req_b = qb[i] if i is not None and i < len(qb) else None
    side = []
    for run, req, reqs in ((ra, req_a, qa), (rb, req_b, qb)):
        side.append(
            {
                "label": run.label,
                "arm": run.manifest["arm"].upper(),
                "present": req is not None,
                "text": (req or {}).get("output_text") or "",
                "tokens": _token_window((req or {}).get("output_tokens") or [], d.first_token),
                "margin": top2_margin((req or {}).get("top_logprobs") or [], d.first_token),
                "cache_n": (req or {}).get("cache_n"),
                "prompt_tokens": (req or {}).get("prompt_tokens"),
                "prompt_sha256": (req or {}).get("prompt_sha256"),
                "trajectory": _workload(run).example_trajectory(run, reqs, d.episode_id, i) if i is not None else [],
                "harness": _workload(run).wording.harness,  # what read the calls of its trajectory and ran them
            }
        )
    common, rest_a, rest_b = _text_split(side[0]["text"], side[1]["text"])
    side[0]["common"], side[0]["rest"] = common, rest_a
    side[1]["common"], side[1]["rest"] = common, rest_b
    return {
        "config": g.config,
        "plan": g.plan,
        "episode_id": d.episode_id,
        "first_request": d.first_request,
        "first_request_1based": None if i is None else i + 1,
        "first_token": d.first_token,
        "n_requests": list(d.n_requests),
        "same_prompt": bool(req_a and req_b and req_a.get("prompt_sha256") == req_b.get("prompt_sha256")),
        "sides": side,
        "comparison": f"{c.a} vs {c.b}",
        "kind": pair.kind,
        "call_flip": call_flip(pair, d),
        "harness": _workload(ra).wording.harness,  # what executed the calls the flip changed
    }
