"""How the served model behaves as an agent, per BFCL run: tool calls, requests per episode, BFCL's verdicts.

The paper's claims are about agent trajectories (a flipped token changes a tool call, its result, the rest of the
episode); these numbers say whether a run's model was one. An episode *executed a tool call* when BFCL's decoder
read at least one call from a reply and BFCL's executor ran it: from the episode record's `steps` (BFCL's own
inference log, recorded since the agent model), else, for older records, from a request at step >= 1 (BFCL only
asks again within a turn after executing the previous reply's calls; this misses calls of a turn's last step).

Executed is not worked: each executed call's result (the step's `observations`, one per call) says whether it
returned an error, either BFCL's executor's own (`Error during execution: ...`: the call could not run, e.g. an
unknown function or wrong arguments) or the tool's (a JSON object with an `error` key, e.g. a file that does not
exist). An episode has a *successful call* when at least one of its calls returned neither. Older records without
results count none of the three (None: not recorded).
"""

from __future__ import annotations

from collections import Counter

import json

import pandas as pd

_get = dict.get
EXECUTOR_ERROR = "Error during execution: "  # bfcl_eval's execute_multi_turn_func_call: the call raised


def call_error(result) -> str | None:
    """What kind of error an executed call's result is: "raised" (BFCL's executor caught an exception: the call did
    not run), "tool" (the tool answered a JSON object with an `error` key), or None (no error)."""
    text = str(result)
    if text.startswith(EXECUTOR_ERROR):
        return "raised"
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if isinstance(value, dict) and "error" in value:
            return "tool"
    return None


def _episode_calls(episode: dict, requests: list) -> tuple[Counter | None, bool]:
    """(counts of the episode's calls: executed, raised, tool error, ok; or None where its trajectory is not
    recorded), whether any call was executed."""
    steps = _get(episode, "steps")
    if isinstance(steps, list):
        n: Counter = Counter()
        for s in steps:
            if not isinstance(s, dict) or not isinstance(s.get("calls"), list):
                continue
            results = s.get("observations") if isinstance(s.get("observations"), list) else []
            n["executed"] += len(s["calls"])
            for i in range(len(s["calls"])):
                if i < len(results):  # a call without a result (none recorded) is neither an error nor ok
                    n[call_error(results[i]) or "ok"] += 1
        return n, n["executed"] > 0
    return None, any(type(_get(r, "step")) is int and _get(r, "step") >= 1 for r in requests)


def agent_row(run) -> dict:
    m = run.manifest
    by = run.requests_by_episode()
    episodes = [e for e in run.episodes if isinstance(e, dict)]
    calls: Counter = Counter()
    with_call, with_ok, recorded = 0, 0, True
    for e in episodes:
        n, any_call = _episode_calls(e, by.get(_get(e, "episode_id"), []))
        with_call += any_call
        if n is None:
            recorded = False
        else:
            calls += n
            with_ok += n["ok"] > 0
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
        "calls_executed": calls["executed"] if recorded else None,
        "calls_returned_error": calls["raised"] + calls["tool"] if recorded else None,
        "calls_raised": calls["raised"] if recorded else None,
        "episodes_with_successful_call": with_ok if recorded else None,
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
    "calls_returned_error",
    "calls_raised",
    "episodes_with_successful_call",
    "requests",
    "requests_per_episode",
    "requests_past_step_0",
    "bfcl_valid",
    "verdicts",
    "source",
]


def agent_table(runs: list) -> pd.DataFrame:
    return pd.DataFrame([agent_row(r) for r in runs], columns=AGENT_COLUMNS)
