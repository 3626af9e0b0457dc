"""The protocol's one run loop, for every workload: a plan's arms and runs against one configuration, serial, greedy,
seed 42, batch 1.

The workload (`artifact.workloads`) says what its units are and how one runs; the engine (`artifact.engines`) how a
request is served; this module owns the rest: it checks the workload's needs against the engine's capabilities
before anything starts, groups runs into sessions (`protocol.sessions`: resume, one server per session), sends every
request through the shared request path (`protocol.requests`) and writes the records.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from artifact import engines, workloads
from artifact.config import Config, Plan
from artifact.engines.base import EngineSession, RequestError
from artifact.errors import ArtifactError
from artifact.protocol import background_tenants
from artifact.protocol.requests import new_record, send
from artifact.protocol.sessions import RunSpec, fingerprints, manifest_base, open_run, run_sessions, say
from artifact.records.events import EventLog
from artifact.records.store import RunWriter
from artifact.workloads.base import Prepared, Workload


def with_episodes(cfg: Config, episodes: int | None) -> Config:
    if episodes is None:
        return cfg
    if episodes < 1:
        raise ArtifactError("--episodes must be >= 1")
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, episodes=episodes))


class UnitQuery:
    """The `Query` a workload's unit gets: every request is recorded as it happens, numbered within the unit."""

    def __init__(self, server: EngineSession, cfg: Config, writer: RunWriter, unit_id: str, arm: str):
        self.server, self.cfg, self.writer, self.unit_id, self.arm = server, cfg, writer, unit_id, arm
        self.count = 0

    def __call__(
        self,
        prompt: str,
        *,
        turn: int = 0,
        step: int = 0,
        cache_prompt: bool | None = None,
        tags: dict | None = None,
        annotate=None,
    ) -> dict:
        record = {**new_record(self.unit_id, turn, step, self.count, prompt), **(tags or {})}
        self.count += 1
        write = self.writer.request
        if annotate is not None:

            def write(rec: dict, _write=self.writer.request) -> None:
                annotate(rec)
                _write(rec)

        try:
            return send(self.server, self.cfg, prompt, cache_prompt, record, write)
        except RequestError as exc:
            exc.record = record  # recorded: the workload decides what it means for the unit
            raise


class RunExecutor:
    """Executes one run of a workload on a started server and writes its records."""

    def __init__(
        self,
        cfg: Config,
        server: EngineSession,
        workload: Workload,
        prepared: Prepared,
        base: dict,
        events: EventLog,
        load: background_tenants.Pools | None = None,
    ):
        self.cfg, self.server, self.workload, self.prepared, self.base = cfg, server, workload, prepared, base
        self.events, self.load = events, load

    def execute(self, spec: RunSpec, run_dir: Path) -> Path:
        writer = open_run(self.base, spec, self.server, run_dir)
        t0 = time.monotonic()
        records = []
        n = len(self.prepared.units)
        # background tenants (a plan's `tenants`): running from here to the run's end; none for other plans
        with (
            open(run_dir / "workload.log", "w") as log,
            background_tenants.Load(self.load, self.server, run_dir) as load,
        ):
            for index, unit_id in enumerate(self.prepared.ids):
                load.unit(index, unit_id)
                query = UnitQuery(load.server, self.cfg, writer, unit_id, spec.arm)
                record = self.workload.run_unit(self.cfg, self.prepared, index, spec, query, log)
                writer.episode(record)
                records.append(record)
                self.events.emit("unit_done", arm=spec.arm, run=spec.run, index=index, n=n, unit=unit_id)
                say(f"  [{spec.arm} run {spec.run}] {index + 1}/{n} {unit_id}: {self.workload.progress(record)}")
        wall = round(time.monotonic() - t0, 3)
        writer.finish(wall_s=wall, **self.workload.finish(records), **load.manifest())
        self.events.emit("run_done", arm=spec.arm, run=spec.run, wall_s=wall)
        return run_dir


def execute_plan(cfg: Config, plan: Plan, results: Path) -> list[Path]:
    """Run (or resume) every session of `plan`; returns the run directories in plan order."""
    workload = workloads.get(cfg.workload.name)
    workload.check(cfg, plan)
    engines.check_needs(cfg, plan, workload.needs, f"workload {workload.name}")
    prepared = workload.prepare(cfg)
    load = background_tenants.prepare(cfg, plan, workload, prepared)  # None unless the plan has background tenants
    fps = fingerprints(cfg, plan, prepared.ids, prepared.identity, load=background_tenants.pairing(load))
    base = {
        **manifest_base(cfg, plan, prepared.ids, fps),
        **prepared.manifest,
        **({"tenants": load.identity} if load else {}),
    }
    return run_sessions(
        cfg,
        plan,
        results,
        fps,
        prepared.label,
        len(prepared.ids),
        lambda server, events: RunExecutor(cfg, server, workload, prepared, base, events, load),
    )
