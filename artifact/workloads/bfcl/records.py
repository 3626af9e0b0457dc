"""A BFCL episode's record against its requests: the agent trajectory is what the requests were (`./run.sh check`).

An episode record (episodes.jsonl) holds BFCL's verdict, `valid`, and the trajectory `steps`: per request, in
request order, its turn and step, the calls BFCL's decoder read from the reply (null where it read none) and the
results of those calls. BFCL's episode loop (driver.run_episode) makes these facts hold:

  * `valid` is true exactly when the verdict is "valid";
  * one step per request (a non-empty `steps`; an episode that ended in an error may have none), step i with the
    turn and step of request i, the first request turn 0 step 0;
  * a reply BFCL read no call from ends its turn: the next request, if any, is step 0 of the next turn;
  * a reply with calls is followed by another request of its turn (step + 1), unless it was at BFCL's step limit
    (`max_steps_per_turn`: BFCL then force-quits the episode, so no request follows) or the episode ended in an
    error.
"""

from __future__ import annotations

from artifact.records.store import EPISODES, Run

DEFAULT_STEP_LIMIT = 20  # Settings.max_steps_per_turn


def _table(x) -> dict:
    return x if isinstance(x, dict) else {}


def step_limit(run: Run) -> int:
    m = run.manifest
    for table in (_table(m.get("workload_settings")), _table(_table(m.get("pairing_inputs")).get("workload"))):
        for t in (table, _table(table.get("settings"))):  # the workload's own settings sit under `settings`
            if type(t.get("max_steps_per_turn")) is int:
                return t["max_steps_per_turn"]
    return DEFAULT_STEP_LIMIT


def _at(r: dict) -> tuple:
    return dict.get(r, "turn"), dict.get(r, "step")


def episode_problem(e: dict, reqs: list[dict], limit: int) -> str | None:
    """Why one episode record contradicts its requests (in request order), or None."""
    verdict, valid = e.get("verdict"), e.get("valid")
    if isinstance(verdict, str) and isinstance(valid, bool) and valid != (verdict == "valid"):
        return f"field 'valid' is {str(valid).lower()}, the verdict is {verdict!r} (valid means BFCL's verdict 'valid')"
    steps = e.get("steps")
    if not isinstance(steps, list) or not steps:
        return None
    eid = e.get("episode_id")
    if len(steps) != len(reqs):
        return f"field 'steps' holds {len(steps)} steps, requests.jsonl {len(reqs)} requests of episode {eid}"
    if reqs and _at(reqs[0]) != (0, 0):
        return f"episode {eid}'s first request is turn {_at(reqs[0])[0]} step {_at(reqs[0])[1]}, not turn 0 step 0"
    for i, (s, r) in enumerate(zip(steps, reqs)):
        if not isinstance(s, dict):
            return f"field 'steps' position {i} must be an object, not {type(s).__name__}"
        turn, step = _at(r)
        if (s.get("turn"), s.get("step")) != (turn, step):
            return (
                f"field 'steps' position {i} is turn {s.get('turn')} step {s.get('step')}, request {i} of episode "
                f"{eid} in requests.jsonl is turn {turn} step {step}"
            )
        nxt = _at(reqs[i + 1]) if i + 1 < len(reqs) else None
        calls = s.get("calls")
        where = f"field 'steps' position {i} (turn {turn} step {step})"
        if isinstance(calls, list) and calls:
            if isinstance(step, int) and step >= limit:
                if nxt is not None:
                    return (
                        f"{where} made calls at the step limit ({limit}), where BFCL ends the episode, but "
                        f"requests.jsonl holds a next request (turn {nxt[0]} step {nxt[1]})"
                    )
            elif nxt is None:
                if e.get("error") is None:
                    return (
                        f"{where} made calls below the step limit ({limit}), so BFCL sends another request of "
                        f"turn {turn}, but requests.jsonl holds none after it"
                    )
            elif nxt != (turn, step + 1):
                return (
                    f"{where} made calls, so the next request is turn {turn} step {step + 1}; requests.jsonl has "
                    f"turn {nxt[0]} step {nxt[1]}"
                )
        elif nxt is not None and isinstance(turn, int) and nxt != (turn + 1, 0):
            return (
                f"{where} made no call, which ends the turn, so the next request is turn {turn + 1} step 0; "
                f"requests.jsonl has turn {nxt[0]} step {nxt[1]}"
            )
    return None


def record_problem(run: Run) -> str | None:
    limit = step_limit(run)
    by = None  # the requests by episode, built once an episode holds a trajectory to check
    for line, e in enumerate(run.episodes, 1):
        if by is None and e.get("steps"):
            by = run.requests_by_episode()
        why = episode_problem(e, (by or {}).get(e.get("episode_id"), []), limit)
        if why:
            return f"{run.path / EPISODES}:{line}: {why}"
    return None
