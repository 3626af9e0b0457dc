"""Sessions, the unit of execution and of resume, shared by every workload's protocol.

A plan's runs are grouped into server sessions. With lifecycle "shared" every run of an arm shares one llama-server
process (cache state carries over from run to run: the paper's default condition); with "fresh" each run is its own
session. If any run of a session is not complete, the whole session runs again (half a session would start from a
different cache state) and the old run directories are moved to `discarded/`, never deleted. Complete sessions
whose fingerprint matches are reused; complete runs with another fingerprint are never overwritten.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from artifact import provenance
from artifact.config import Config, Plan
from artifact.engines.llama_server import GREEDY, LlamaServer
from artifact.engines.models import verified_weights
from artifact.errors import ArtifactError
from artifact.records.store import DISCARDED, MANIFEST, RunWriter, load_run, now_iso

PROTOCOL = {"decoding": "greedy", **GREEDY, "n_probs": 2, "batch": 1, "serial": True, "id_slot": 0}


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


def session_state(pdir: Path, session: list[RunSpec], fp: str) -> str:
    """'complete' (all runs complete with this fingerprint), 'absent', or 'partial'."""
    states = []
    for spec in session:
        mf = pdir / spec.dirname / MANIFEST
        if not mf.exists():
            states.append("absent")
            continue
        run = load_run(mf.parent)
        if run.complete and run.manifest.get("fingerprint") != fp:
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


def manifest_base(cfg: Config, plan: Plan, episode_ids: list[str], fp: str) -> dict:
    """The manifest fields every run of a plan shares (BFCL and the GSM8K bridge alike). Also removes secrets from
    this process's environment: the protocol eval()s model output (BFCL)."""
    isolation = provenance.isolation(provenance.scrub_secrets())
    if isolation["network"] != "loopback-only":
        say("warning: this protocol run can reach the network (run it through ./run.sh for isolation)")
    return {
        "config": cfg.name, "config_path": cfg.path, "config_data": cfg.as_dict(),
        "engine": cfg.engine.kind, "engine_build_flags": provenance.llama_build(),
        "model": {"family": cfg.model.family, "name": cfg.model.name, "quant": cfg.model.quant,
                  "sha256": cfg.model.sha256, "source": cfg.model.source},
        "lifecycle": plan.lifecycle, "plan": plan.name, "plan_data": plan.as_dict(),
        "workload": cfg.workload.name, "workload_settings": dataclasses.asdict(cfg.workload),
        "prompt_variant": cfg.workload.prompt_variant, "episodes": episode_ids,
        "protocol": PROTOCOL, "fingerprint": fp,
        "host": provenance.host(), "packages": provenance.packages(), "isolation": isolation,
    }


def open_run(base: dict, spec: RunSpec, server: LlamaServer, run_dir: Path) -> RunWriter:
    """Start a run's records: the shared manifest plus this run's arm, session and server."""
    return RunWriter(run_dir, {
        **base,
        "arm": spec.arm, "run": spec.run, "session": spec.session,
        "engine_build": server.build_info, "server_cmd": server.cmd,
        "server_log": str(server.log_path.relative_to(run_dir.parent)),
    })


def run_sessions(cfg: Config, plan: Plan, results: Path, fp: str, units: str,
                 make_executor: Callable[[LlamaServer], Executor]) -> list[Path]:
    """Run (or resume) every session of `plan`, one llama-server per session; returns run dirs in plan order."""
    pdir = plan_dir(results, cfg, plan)
    run_dirs = []
    for session in sessions(plan):
        name = session[0].session
        state = session_state(pdir, session, fp)
        if state == "complete":
            say(f"[{cfg.name}/{plan.name}] session {name}: complete, reusing")
            run_dirs += [pdir / s.dirname for s in session]
            continue
        if state == "partial":
            discard(pdir, session)
        model_path = verified_weights(cfg.model)  # sha256 checked before every server start
        log_path = pdir / "logs" / f"server-{name}-{now_iso().replace(':', '')}.log"
        say(f"[{cfg.name}/{plan.name}] session {name}: starting llama-server (--cache-ram {plan.cache_ram_mib}), "
            f"{units} x {len(session)} runs")
        with LlamaServer(cfg, model_path, plan.cache_ram_mib, log_path) as server:
            executor = make_executor(server)
            for spec in session:
                run_dirs.append(executor.execute(spec, pdir / spec.dirname))
    return run_dirs
