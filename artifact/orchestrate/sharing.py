"""Several jobs per GPU (`./run.sh all --native --jobs-per-gpu N`): each GPU as N slots, the jobs on one GPU sharing
it through CUDA MPS where the host has `nvidia-cuda-mps-control` (a control daemon already serving is used as it is,
else one is started for the run and stopped after it), in the driver's time slices otherwise (`--gpu-sharing`
chooses). The dry run, the progress table and every manifest (`host.gpu_sharing`, from ARTIFACT_GPU_SHARING) say
which: `Sharing`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from artifact import provenance
from artifact.errors import ArtifactError
from artifact.orchestrate.common import say
from artifact.orchestrate.fanout import Slot

MPS_CONTROL = provenance.MPS_CONTROL
ONE, MPS, SLICES, CPU = "one job per GPU", "CUDA MPS", "time slices", "CPU slots"
mps_pipe_dir = provenance.mps_pipe_dir


def mps_running(pipe: Path | None = None) -> bool:
    """A control daemon serves `pipe`: its control socket accepts a connection (a socket file left behind by a
    daemon that has exited does not count)."""
    return provenance.mps_daemon_answers(pipe)


@dataclass
class Sharing:
    """How the jobs share a GPU: mode, jobs per GPU, and for MPS its control daemon (who started it, its pipe)."""

    mode: str
    jobs_per_gpu: int
    reason: str = ""
    pipe: Path | None = None
    log_dir: Path | None = None
    started_here: bool = False

    def words(self) -> str:
        if self.mode == CPU:
            return f"{CPU} (no GPU; {self.jobs_per_gpu} job(s) at once)"
        if self.mode == ONE:
            return f"{ONE} at a time"
        return f"up to {self.jobs_per_gpu} jobs per GPU at once, through {self.mode}" + (
            f" ({self.reason})" if self.reason else ""
        )

    def record(self, slot: Slot) -> dict:
        """What every manifest of a job on `slot` carries as host.gpu_sharing."""
        rec = {
            "mode": self.mode,
            ("jobs_at_once" if self.mode == CPU else "jobs_per_gpu"): self.jobs_per_gpu,
            "slot": slot.label,
            "gpus": list(slot.device_ids),
        }
        if self.mode == MPS:
            rec.update(
                mps_pipe_directory=str(self.pipe),
                mps_daemon="started by ./run.sh all --native" if self.started_here else "already running",
            )
        return rec

    def job_env(self, slot: Slot) -> dict:
        env = {"ARTIFACT_GPU_SHARING": json.dumps(self.record(slot), sort_keys=True)}
        if self.mode == MPS:
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe)
        return env


def plan_sharing(args) -> Sharing:
    """How the GPU will be shared, without starting anything (the dry run prints it)."""
    n = args.jobs_per_gpu
    if args.cpu:
        return Sharing(CPU, args.parallel)
    if n == 1:
        return Sharing(ONE, 1)
    pipe = mps_pipe_dir()
    control = shutil.which(MPS_CONTROL)
    if args.gpu_sharing == "time-slices":
        return Sharing(SLICES, n, "--gpu-sharing time-slices")
    if mps_running(pipe):
        return Sharing(MPS, n, f"the control daemon already serving {pipe}", pipe)
    if control:
        return Sharing(MPS, n, f"a control daemon started for the run ({control}, pipe {pipe})", pipe)
    if args.gpu_sharing == "mps":
        raise ArtifactError(
            f"--gpu-sharing mps: no {MPS_CONTROL} on PATH and no MPS control daemon at {pipe} "
            "(CUDA_MPS_PIPE_DIRECTORY): install the NVIDIA driver's MPS tools, or use "
            "--gpu-sharing time-slices"
        )
    return Sharing(SLICES, n, f"no {MPS_CONTROL} on PATH: the driver's time slices")


def start_sharing(plan: Sharing, log_dir: Path) -> Sharing:
    """Start the MPS control daemon the plan needs (unless one serves already); a failure falls back to time slices,
    saying so."""
    if plan.mode != MPS or mps_running(plan.pipe):
        return plan
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(plan.pipe), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
    try:
        plan.pipe.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            [shutil.which(MPS_CONTROL) or MPS_CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=60
        )
        deadline = time.monotonic() + 15
        while r.returncode == 0 and not mps_running(plan.pipe) and time.monotonic() < deadline:
            time.sleep(0.2)
        ok, why = r.returncode == 0 and mps_running(plan.pipe), (r.stderr or r.stdout).strip()[:160]
    except (OSError, subprocess.SubprocessError) as exc:
        ok, why = False, str(exc)[:160]
    if not ok:
        say(
            f"GPU sharing: {MPS_CONTROL} -d did not start a control daemon at {plan.pipe} ({why or 'no control '}"
            f"socket); the jobs share the GPU in time slices"
        )
        return Sharing(SLICES, plan.jobs_per_gpu, f"{MPS_CONTROL} -d failed: {why}")
    say(f"GPU sharing: MPS control daemon started (pipe {plan.pipe}, log {log_dir})")
    return Sharing(
        MPS,
        plan.jobs_per_gpu,
        f"a control daemon started for the run (pipe {plan.pipe})",
        plan.pipe,
        log_dir,
        started_here=True,
    )


def stop_sharing(sharing: Sharing) -> None:
    """Stop the MPS control daemon this run started (never one that served before it)."""
    if not sharing.started_here:
        return
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(sharing.pipe), "CUDA_MPS_LOG_DIRECTORY": str(sharing.log_dir)}
    try:
        subprocess.run(
            [shutil.which(MPS_CONTROL) or MPS_CONTROL],
            input="quit\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        say(f"GPU sharing: MPS control daemon stopped (pipe {sharing.pipe})")
    except (OSError, subprocess.SubprocessError) as exc:
        say(
            f"GPU sharing: could not stop the MPS control daemon at {sharing.pipe} ({exc}); stop it with "
            f"`echo quit | CUDA_MPS_PIPE_DIRECTORY={sharing.pipe} {MPS_CONTROL}`"
        )


def shared_slots(gpu_slots_: list[Slot], n: int) -> list[Slot]:
    """Each GPU as `n` slots (gpu0.0, gpu0.1, ...), each for jobs that fit 1/n of its memory; n = 1: as it is. The
    order interleaves the GPUs, so that jobs spread over GPUs before they double up."""
    if n == 1:
        return gpu_slots_
    return [
        Slot(f"{s.label}.{k}", s.device_ids, None if s.memory_gib is None else s.memory_gib / n)
        for k in range(n)
        for s in gpu_slots_
    ]
