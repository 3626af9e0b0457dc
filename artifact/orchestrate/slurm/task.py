"""One array task on its node (`--slurm-task I --submission DIR`, from array.sbatch): job I run the native way
(native.py, on the GPU Slurm gave it), or the artifact's image through Apptainer/Singularity or Docker; its record
tasks/<I>.json says running, then the outcome."""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from artifact import workloads
from artifact.engines.builds import BuildOptions
from artifact.config import REPO
from artifact.errors import ArtifactError
from artifact.orchestrate import engine_kinds, host, images, native
from artifact.orchestrate.common import say
from artifact.orchestrate.fanout import DONE, FAILED, INTERRUPTED, Fanout, Outcome, Slot, hms
from artifact.orchestrate.matrix import Job
from artifact.orchestrate.slurm.spec import SPEC, entry_job, read_spec, write_json


@dataclass
class Task:
    sub: Path
    spec: dict
    entry: dict

    @property
    def record_path(self) -> Path:
        return self.sub / "tasks" / f"{self.entry['index']}.json"


def load_task(args) -> Task:
    if not args.submission:
        raise ArtifactError("--slurm-task needs --submission DIR (the batch script passes both)")
    sub = Path(args.submission)
    spec = read_spec(sub)
    match = [e for e in spec["jobs"] if e["index"] == args.slurm_task]
    if not match:
        raise ArtifactError(f"task {args.slurm_task} is not in {sub / SPEC}")
    return Task(sub, spec, match[0])


def task_slot(spec: dict) -> Slot:
    """The task's one slot: this node, and the GPU(s) Slurm gave it (CUDA_VISIBLE_DEVICES, left as Slurm set it for a
    process on the host; a Docker container is handed those GPUs by index)."""
    node = socket.gethostname().split(".")[0]
    devices = os.environ.get("CUDA_VISIBLE_DEVICES") if not spec["cpu"] else None
    label = f"{node}:gpu{devices}" if devices else node
    return Slot(label, tuple(devices.split(",")) if devices and spec["mode"] == "docker" else ())


def apptainer_command(job: Job, slot: Slot, *, spec: dict) -> tuple[list[str], dict]:
    """The image's protocol run under Apptainer/Singularity: no host environment, the results read-write, the weights
    read-only, GPUs with --nv, no network (the image's own scripts/isolate.sh)."""
    exe = shutil.which("apptainer") or shutil.which("singularity") or "apptainer"
    binds = [f"{spec['results']}:/results", f"{spec['weights']}:/weights:ro"]
    models = REPO / "models"  # derived models, made at submission (the image itself is read-only)
    if models.is_dir():
        binds.append(f"{models}:/artifact/models")
    mounts = workloads.get(job.cfg.workload.name).container_mounts(job.cfg, Path(spec["hf_hub_cache"]))
    binds += [f"{src}:{dst}:ro" for src, dst in mounts.items()]
    env = [f"ARTIFACT_IMAGE={spec['image']}", f"ARTIFACT_IMAGE_ID={spec['image_id']}"]
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        env.append(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}")
    argv = [
        exe,
        "exec",
        "--cleanenv",
        "--containall",
        "--pwd",
        "/artifact",
        *(["--nv"] if not spec["cpu"] else []),
        *[a for b in binds for a in ("--bind", b)],
        *[a for e in env for a in ("--env", e)],
        spec["image"],
        "/artifact/scripts/isolate.sh",
        "/artifact/.venv/bin/python",
        "-m",
        "artifact",
        "run",
        job.config_path,
        "--plan",
        job.plan,
        "--results",
        "/results",
        *(["--episodes", str(spec["episodes"])] if spec["episodes"] else []),
    ]
    return argv, dict(os.environ)


def task_fanout(task: Task, job: Job):
    """The back-end a task runs its job with (see the module's docstring)."""
    spec, results = task.spec, Path(task.spec["results"])
    if spec["mode"] == "docker":
        return docker_fanout(spec, job, results)
    if spec["mode"] == "apptainer":
        command, kind = partial(apptainer_command, spec=spec), "apptainer"
    else:
        command, kind = partial(native.job_command, results=results, episodes=spec["episodes"]), "slurm"
    # Slurm signals every process of the job itself (scancel, the time limit): no second signal from here
    return native.NativeFanout(
        results,
        native.expected_builds(spec["expect_build"]),
        command,
        progress_every=spec["progress_every"],
        kind=kind,
        forward_signals=False,
    )


def docker_fanout(spec: dict, job: Job, results: Path):
    client = host.docker_client()
    image_args = BuildOptions(cpu=spec["cpu"], base_image=spec["base_image"], cuda_archs=spec["cuda_archs"])
    ispec = engine_kinds.image_spec(job.engine, image_args)
    image = images.ensure_image(
        client, ispec, results / "logs", ca_bundle=Path(spec["ca_bundle"]) if spec.get("ca_bundle") else None
    )
    return Fanout(
        client,
        {job.engine: image},
        {job.engine: ispec.expect_build_info},
        results,
        Path(spec["weights"]),
        Path(spec["hf_hub_cache"]),
        episodes=spec["episodes"],
        progress_every=spec["progress_every"],
        shm_size={job.engine: ispec.shm_size},
    )


def run_task(args) -> int:
    """One array task: its job, its record (running, then the outcome); exit 0 done, 3 failed, 130 stopped."""
    task = load_task(args)
    e = task.entry
    record = {
        "index": e["index"],
        "key": e["key"],
        "state": "running",
        "node": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "started_epoch": time.time(),
    }
    write_json(task.record_path, record)
    say(
        f"task {e['index']}: {e['key']} on {record['node']} ({task.spec['mode']}"
        + (f", CUDA_VISIBLE_DEVICES={record['cuda_visible_devices']}" if record["cuda_visible_devices"] else "")
        + ")"
    )
    t0 = time.monotonic()
    try:
        job = entry_job(e)
        outcome = task_fanout(task, job).run([job], [task_slot(task.spec)])[0]
    except KeyboardInterrupt:
        outcome = Outcome(entry_job(e), INTERRUPTED, note="stopped by a signal")
    except ArtifactError as exc:
        outcome = Outcome(entry_job(e), FAILED, note=str(exc))
    record.update(
        state=outcome.status,
        note=outcome.note,
        seconds=round(time.monotonic() - t0, 1),
        ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    if outcome.status == INTERRUPTED:
        record["note"] = "stopped by a signal (scancel, the time limit or preemption); resubmitting resumes"
    write_json(task.record_path, record)
    print(
        f"task {e['index']}: {e['key']} {outcome.status} after {hms(record['seconds'])}"
        + (f" ({record['note']})" if record["note"] else "")
    )
    return 0 if outcome.status == DONE else 130 if outcome.status == INTERRUPTED else 3
