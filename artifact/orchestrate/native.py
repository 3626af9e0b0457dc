"""`./run.sh all --native`: the same matrix on this host's GPUs, without containers.

- the engines' own builds, before any job: what each engine builds on the host (`Builds.native`; llama.cpp's
  CUDA llama-server, artifact/engines/llama_cpp/build.py, into `$ARTIFACT_NATIVE_VENV`, default `.venv-cuda`). Every
  run's manifest says what served it (`engine_build`), and every manifest must read the label of the build made
  here, else the job counts as FAILED.
- weights: fetched and verified (artifact.fetch) unless --no-fetch; derived models made once, before any job.
- jobs: one process per configuration x plan, `./run.sh all --job CONFIG --plan PLAN --results DIR`: no set-up, an
  empty environment plus run.sh's allowlist, no network (scripts/isolate.sh), `CUDA_VISIBLE_DEVICES` = its GPU. Each
  GPU is `--jobs-per-gpu` slots (default 1), each slot taking jobs that fit its share of the GPU's memory; the slots
  run their jobs at once, longest first (fanout.FanoutBase). Several jobs on one GPU share it through CUDA MPS where
  the host has `nvidia-cuda-mps-control` (a control daemon already serving is used as it is; else one is started
  for the run and stopped after it), in the driver's time slices otherwise (`--gpu-sharing` chooses); the dry run,
  the progress table and every manifest (`host.gpu_sharing`, from ARTIFACT_GPU_SHARING) say which
  (artifact.orchestrate.sharing). Logs go to `<results>/<config>/<plan>/logs/native-*.log`, parsed for progress as
  the containers' are.
- offline (`--offline DIR` to run.sh, ARTIFACT_OFFLINE): run.sh verified the stage and set up from it; no weights
  are fetched (derived models need none; others must be in weights/ already).
- jobs of an engine that cannot run natively here are listed as skipped with its reason (`Builds.native_unavailable`:
  e.g. no vLLM of the configuration's version installed, or not a CUDA build).
- `--cpu`: `--parallel` CPU slots and the CPU default's engine build (what CI runs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from artifact.config import REPO
from artifact.errors import ArtifactError
from artifact.engines.builds import native_venv as base_native_venv
from artifact.orchestrate import engine_kinds, host
from artifact.orchestrate.common import conclude, cpu_slots, gpu_slots, print_gpu_time, print_plan, say, split_runnable
from artifact.orchestrate.fanout import (
    FanoutBase,
    Outcome,
    FAILED,
    Progress,
    Slot,
    job_logs,
    runs_per_session,
    simulate,
)
from artifact.orchestrate.matrix import Job
from artifact.fetch import fetch as fetch_weights
from artifact.models.derive import SOURCE_PREFIX, locate
from artifact.catalog import load_plan
from artifact.models.hub import weights_root
from artifact.orchestrate.staging import MANIFEST, StageError, load_manifest, place_weights, summary
from artifact.orchestrate.sharing import Sharing, plan_sharing, shared_slots, start_sharing, stop_sharing


def native_venv() -> Path:
    """Where `./run.sh all --native` keeps its engines' builds (run.sh passes the same)."""
    return base_native_venv()


def prepare_models(jobs: list[Job], fetch: bool) -> None:
    """Weights fetched and verified (unless `fetch` is off), derived models made, once, before any job starts (jobs
    running at once must not derive the same file at once)."""
    if fetch and jobs:
        fetch_weights([j.cfg for j in jobs])
    for source in dict.fromkeys(j.cfg.model.source for j in jobs if j.cfg.model.source.startswith(SOURCE_PREFIX)):
        say(f"model {source}: {locate(source)}")


def expected_builds(labels: dict | None) -> dict:
    """engine kind -> the build label every manifest of its jobs must read (what `Builds.native` built
    here; engine_kinds.ensure_native_builds)."""
    return dict(labels or {})


def job_argv(job: Job, results: Path, episodes: int | None) -> list[str]:
    """One job the way --native runs it (run.sh: no set-up, empty environment plus its allowlist, no network)."""
    return [
        str(REPO / "run.sh"),
        "all",
        "--job",
        job.config_path,
        "--plan",
        job.plan,
        "--results",
        str(results),
        *(["--episodes", str(episodes)] if episodes else []),
    ]


def job_command(
    job: Job, slot: Slot, *, results: Path, episodes: int | None, sharing: Sharing | None = None
) -> tuple[list[str], dict]:
    env = {**os.environ, "ARTIFACT_VENV": sys.prefix}
    if slot.device_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(slot.device_ids)
    if sharing is not None:
        env.update(sharing.job_env(slot))
    return job_argv(job, results, episodes), env


@dataclass
class NativeFanout(FanoutBase):
    """One process per job (`command(job, slot) -> (argv, env)`), in a session of its own so that a stop reaches
    everything it started. forward_signals=False where the signal reaches the jobs anyway (a Slurm task: scancel
    and the time limit signal every process of the job) and a second one would cut into the protocol's clean-up."""

    results: Path
    expect_build: dict  # engine kind -> the label every manifest must read (or None)
    command: Callable
    progress_every: float = 60.0
    kind: str = "native"
    forward_signals: bool = True
    grace_s: float = 25.0
    procs: dict = field(default_factory=dict)
    sharing: Sharing | None = None  # said in every progress table

    def __post_init__(self):
        self._init_fanout()

    def run_job(self, job: Job, slot: Slot) -> Outcome:
        t0 = time.monotonic()
        total, per_session = runs_per_session(load_plan(job.plan))
        progress = Progress(job, total)
        log_path = job_logs(self.results, job, self.kind, slot)
        argv, env = self.command(job, slot)
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return Outcome(job, FAILED, slot.label, 0.0, f"cannot start {argv[0]}: {exc.strerror or exc}")
        with self.lock:
            self.active[job.key] = (slot.label, progress)
            self.procs[job.key] = proc
            late = self.stop.is_set()  # stopped while this process was being started: stop_running missed it
        if late and self.forward_signals:
            _signal_group(proc, signal.SIGTERM)
        devices = env.get("CUDA_VISIBLE_DEVICES")
        say(
            f"[{slot.label}] {job.key}: started ({job.engine}, pid {proc.pid}"
            + (f", CUDA_VISIBLE_DEVICES={devices}" if devices is not None else "")
            + f", log {log_path})"
        )
        try:
            self.follow(job, slot, iter(lambda: proc.stdout.read1(1 << 16), b""), log_path, progress, per_session)
            code = proc.wait()
        finally:
            with self.lock:
                self.active.pop(job.key, None)
                self.procs.pop(job.key, None)
        return self.judge(job, slot, code, time.monotonic() - t0, log_path, total, self.expect_build.get(job.engine))

    def print_progress(self, finished: int, total: int) -> None:
        if self.sharing is not None:
            say(f"GPU sharing: {self.sharing.words()}")
        super().print_progress(finished, total)

    def stop_running(self) -> None:
        with self.lock:
            running = list(self.procs.values())
        if self.forward_signals:
            for p in running:  # SIGTERM: the protocol stops its server, the run stays 'incomplete'
                _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for p in running:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def native_slots(args) -> list[Slot]:
    return cpu_slots(args.parallel) if args.cpu else shared_slots(gpu_slots(args.gpus), args.jobs_per_gpu)


def planned_slots(args) -> tuple[list[Slot], str]:
    """The slots a dry run plans on, without failing where there is no GPU: nvidia-smi's GPUs where it answers,
    else --gpus (memory unknown), else one GPU."""
    if args.cpu:
        return cpu_slots(args.parallel), "CPU slot"
    what = "GPU" if args.jobs_per_gpu == 1 else "GPU slot"
    try:
        gpus = host.select_gpus(host.host_gpus(), args.gpus)
        slots = [Slot(f"gpu{g.index}", (str(g.index),), g.memory_gib) for g in gpus]
    except ArtifactError as exc:
        if args.gpus and "no GPU" in str(exc) and "nvidia-smi lists" in str(exc):
            raise
        ids = [i.strip() for i in (args.gpus or "0").split(",") if i.strip()]
        if not all(i.isdigit() for i in ids):
            raise ArtifactError(f"--gpus {args.gpus!r}: expected GPU indices such as 0,2") from None
        print(f"(no GPU listed here: {exc}; planning on GPU{'s' * (len(ids) > 1)} {','.join(ids)}, memory unknown)")
        slots = [Slot(f"gpu{i}", (i,)) for i in dict.fromkeys(ids)]
    return shared_slots(slots, args.jobs_per_gpu), what


def place_staged_weights() -> None:
    """The weights files the stage (--offline DIR) carries, put where the weights directory keeps them; nothing
    without a stage."""
    if not (d := os.environ.get("ARTIFACT_OFFLINE")):
        return
    root = weights_root()
    try:
        placed = place_weights(Path(d), load_manifest(Path(d) / MANIFEST), root)
    except (OSError, StageError) as exc:
        raise ArtifactError(
            f"--offline {d}: cannot put its weights files under {root} ({exc}); set "
            "ARTIFACT_WEIGHTS to a writable directory"
        ) from None
    if placed:
        say(f"offline: {len(placed)} weights file(s) from the stage put under {root}: {', '.join(placed)}")


def offline_words() -> str | None:
    """The stage run.sh set up from (--offline DIR), in words, or None."""
    d = os.environ.get("ARTIFACT_OFFLINE")
    if not d:
        return None
    try:
        return f"set up from the stage {d} ({summary(load_manifest(Path(d) / MANIFEST))}); no weights fetched"
    except Exception as exc:  # the set-up verified it; a reader's failure must not stop the run
        return f"set up from the stage {d} ({exc}); no weights fetched"


def dry_run(jobs: list[Job], args) -> int:
    labels, lines = engine_kinds.plan_native_builds(args)
    gpu = not args.cpu
    sharing = plan_sharing(args)
    for line in lines:
        print(line)
    offline = offline_words()
    if offline:
        print(f"offline: {offline}")
    print(f"GPU sharing: {sharing.words()}")
    builds = expected_builds(labels)
    runnable = print_plan(
        jobs,
        args,
        "./run.sh all --native --dry-run",
        ("runs with", lambda j: f"build {builds[j.engine]}" if builds.get(j.engine) else "the installed engine"),
        lambda j: engine_kinds.unavailable(j, "native", gpu=gpu),
    )
    slots, what = planned_slots(args)
    print_gpu_time(runnable, slots, what)
    print(
        "schedule (estimated hours; longest first, each slot takes the next job that fits its memory"
        + (
            "; the estimates are of a job alone on its GPU: jobs sharing one take longer each"
            if sharing.jobs_per_gpu > 1 and gpu
            else ""
        )
        + "):"
    )
    for slot in slots:
        mine = [f"{j.key} {s:.2f}-{e:.2f}" for sl, j, s, e in simulate(runnable, slots) if sl.label == slot.label]
        mem = f" ({slot.memory_gib:.0f} GiB)" if slot.memory_gib is not None else ""
        print(f"  {slot.label}{mem}: " + (", ".join(mine) or "-"))
    results = Path(args.results).resolve()
    example = runnable[0] if runnable else (jobs[0] if jobs else None)
    if example:
        env = "CUDA_VISIBLE_DEVICES=<its GPU> " if gpu else ""
        print(
            f"each job: {env}"
            + " ".join(
                job_argv(example, results, args.episodes)[0:1]
                + ["all", "--job", "CONFIG", "--plan", "PLAN", "--results", str(results)]
            )
            + "   (no network: "
            "scripts/isolate.sh)"
        )
    return 0


def cmd_native(jobs: list[Job], args) -> int:
    if args.dry_run:
        return dry_run(jobs, args)
    t0 = time.monotonic()
    slots = native_slots(args)
    sharing = plan_sharing(args)
    offline = offline_words()
    if offline:
        say(f"offline: {offline}")
    labels = engine_kinds.ensure_native_builds(args)
    runnable, outcomes = split_runnable(jobs, slots, lambda j: engine_kinds.unavailable(j, "native", gpu=not args.cpu))
    results = Path(args.results).resolve()
    results.mkdir(parents=True, exist_ok=True)
    place_staged_weights()
    prepare_models(runnable, fetch=not (args.no_fetch or offline))
    sharing = start_sharing(sharing, results / "logs" / "mps") if runnable else sharing
    try:
        fan = NativeFanout(
            results,
            expected_builds(labels),
            partial(job_command, results=results, episodes=args.episodes, sharing=sharing),
            progress_every=args.progress_every,
            sharing=sharing,
        )
        say(
            f"running {len(runnable)} jobs on {len(slots)} slot(s): {', '.join(s.label for s in slots)}; GPU sharing: "
            f"{sharing.words()}"
        )
        outcomes += fan.run(runnable, slots)
    finally:
        stop_sharing(sharing)
    say(f"GPU sharing: {sharing.words()}")
    return conclude(outcomes, jobs, results, t0)
