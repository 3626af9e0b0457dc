"""The BFCL agent's part of the report's divergence example: the trajectory from the first diverging request (the
calls BFCL decoded from each reply and the results its executor returned, as the episode record's `steps` holds
them) and what the divergence changed there (a call, and with it the result the model saw next)."""

from __future__ import annotations

TRAJECTORY_STEPS = 4  # requests shown per side, from the first diverging one


def steps(run, episode_id: str) -> list:
    """The episode record's trajectory (`steps`: per request, the calls BFCL decoded and their results); the first
    record of the episode where episodes.jsonl holds two."""
    out = _records_by_episode(run).get(episode_id, {}).get("steps")
    return out if isinstance(out, list) else []


def _records_by_episode(run) -> dict:
    """episode id -> the run's first episode record of it (memoised on the run: the report asks for every diverged
    episode of every comparison, which scanned the run's records each time)."""
    index = run.__dict__.get("_bfcl_episode_records")
    if index is None:
        index = {}
        for e in run.episodes:
            if isinstance(e, dict):
                index.setdefault(e.get("episode_id"), e)
        run.__dict__["_bfcl_episode_records"] = index
    return index


def step_at(all_steps: list, i: int | None) -> dict:
    return all_steps[i] if i is not None and 0 <= i < len(all_steps) and isinstance(all_steps[i], dict) else {}


def divergence_change(run_a, run_b, episode_id: str, first_request: int | None) -> str | None:
    """What the episode's first divergence changed in the trajectory: "observation" where both replies decoded to
    calls that differ and BFCL's executor returned different results for them (the next request showed the model
    something else), "call" where the calls differ but happened to return the same results, else None."""
    sa = step_at(steps(run_a, episode_id), first_request)
    sb = step_at(steps(run_b, episode_id), first_request)
    ca, cb = sa.get("calls"), sb.get("calls")
    if not (isinstance(ca, list) and isinstance(cb, list) and ca != cb):
        return None
    return "observation" if sa.get("observations") != sb.get("observations") else "call"


def trajectory(run, reqs: list, episode_id: str, start: int) -> list[dict]:
    all_steps = steps(run, episode_id)
    out = []
    for i in range(start, min(len(reqs), start + TRAJECTORY_STEPS)):
        st = all_steps[i] if i < len(all_steps) and isinstance(all_steps[i], dict) else {}
        out.append(
            {
                "request": i + 1,
                "turn": reqs[i].get("turn"),
                "step": reqs[i].get("step"),
                "text": reqs[i].get("output_text") or "",
                "calls": st.get("calls"),
                "observations": st.get("observations") or [],
            }
        )
    return out
