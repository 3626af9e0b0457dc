"""Progress as a structured event stream, written and read here only.

The protocol appends one JSON line per event to `<results>/<config>/<plan>/progress.jsonl` (flushed at once), so
that whoever runs it — a terminal, `./run.sh all` following a container or a native process, a Slurm task — can follow
a plan without parsing human-readable lines. Events:

  session_reused   {session, runs}             a complete session was kept (its runs: [[arm, run], ...])
  session_started  {session, runs, units}       a server session starts its runs over `units` units each
  unit_done        {arm, run, index, n, unit}   a run finished unit `index + 1` of `n`
  run_done         {arm, run, wall_s}           a run is complete

Every event carries `event` and `t` (seconds since the epoch). The file is the plan's progress over all invocations
(a resumed plan appends); `PlanProgress` folds it into where the plan stands.
"""

from __future__ import annotations

from typing import Any
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

FILE = "progress.jsonl"


class EventLog:
    """Appends events to a plan directory's progress.jsonl."""

    def __init__(self, plan_dir: Path):
        plan_dir.mkdir(parents=True, exist_ok=True)
        self.path = plan_dir / FILE

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "t": round(time.time(), 3), **fields}) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)


def read(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete events of a progress file from byte `offset`, and the offset after them (a line still being
    written is left for the next read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(ev, dict) and isinstance(ev.get("event"), str):
            events.append(ev)
    return events, offset + end


@dataclass
class PlanProgress:
    """Where a plan stands, folded from its events."""

    current: str = "starting"
    unit: int = 0  # units done in the current run
    units: int = 0  # units per run
    done_runs: set[Any] = field(default_factory=set)
    units_here: int = 0  # units this follower saw finish (the rate for an estimate)

    def feed(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if kind == "unit_done":
            self.current, self.unit, self.units = f"{ev['arm']} run {ev['run']}", ev["index"] + 1, ev["n"]
            self.units_here += 1
        elif kind == "run_done":
            self.done_runs.add((ev["arm"], ev["run"]))
        elif kind == "session_reused":
            self.done_runs.update(tuple(r) for r in ev.get("runs", ()))
        elif kind == "session_started":
            self.units = ev.get("units", self.units)
