"""How the served model behaves as an agent, per BFCL run: tool calls, requests per episode, BFCL's verdicts.

The paper's claims are about agent trajectories (a flipped token changes a tool call, its result, the rest of the
episode); these numbers say whether a run's model was one. An episode *executed a tool call* when BFCL's decoder
read at least one call from a reply and BFCL's executor ran it: from the episode record's `steps` (BFCL's own
inference log, recorded since the agent model), else, for older records, from a request at step >= 1 (BFCL only
asks again within a turn after executing the previous reply's calls; this misses calls of a turn's last step).
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

_get = dict.get


def _episode_calls(episode: dict, requests: list) -> tuple[int | None, bool]:
    """(calls executed or None where unknown, whether any call was executed)."""
    steps = _get(episode, "steps")
    if isinstance(steps, list):
        n = sum(len(s["calls"]) for s in steps if isinstance(s, dict) and isinstance(s.get("calls"), list))
        return n, n > 0
    return None, any(type(_get(r, "step")) is int and _get(r, "step") >= 1 for r in requests)


def agent_row(run) -> dict:
    m = run.manifest
    by = run.requests_by_episode()
    episodes = [e for e in run.episodes if isinstance(e, dict)]
    calls, with_call, recorded = 0, 0, True
    for e in episodes:
        n, any_call = _episode_calls(e, by.get(_get(e, "episode_id"), []))
        with_call += any_call
        if n is None:
            recorded = False
        else:
            calls += n
    verdicts = Counter(str(_get(e, "verdict")) for e in episodes)
    n_eps, n_req = len(episodes), len(run.requests)
    return {
        "config": m["config"],
        "plan": m["plan"],
        "arm": m["arm"],
        "run": m["run"],
        "episodes": n_eps,
        "episodes_with_tool_call": with_call,
        "tool_call_share": with_call / n_eps if n_eps else None,
        "calls_executed": calls if recorded else None,
        "requests": n_req,
        "requests_per_episode": n_req / n_eps if n_eps else None,
        "requests_past_step_0": sum(1 for r in run.requests if type(_get(r, "step")) is int and _get(r, "step") >= 1),
        "bfcl_valid": verdicts.get("valid", 0),
        "verdicts": "; ".join(f"{k}: {v}" for k, v in sorted(verdicts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "source": "steps" if recorded else "requests (older records: lower bound)",
    }


AGENT_COLUMNS = [
    "config",
    "plan",
    "arm",
    "run",
    "episodes",
    "episodes_with_tool_call",
    "tool_call_share",
    "calls_executed",
    "requests",
    "requests_per_episode",
    "requests_past_step_0",
    "bfcl_valid",
    "verdicts",
    "source",
]


def agent_table(runs: list) -> pd.DataFrame:
    return pd.DataFrame([agent_row(r) for r in runs], columns=AGENT_COLUMNS)
