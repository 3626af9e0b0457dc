"""`./run.sh all --slurm`: the matrix as one Slurm job array (a task per configuration x plan) plus a dependent check
job, through the site's own `sbatch`.

Submission (on a login node: it needs the network for the set-up, the tasks do not):
  1. the site options are checked (one-line errors), and `sbatch --test-only` judges the array's batch script before
     anything is submitted (an unknown partition, account or option is one line, nothing half-submitted);
  2. the set-up happens here, once: the environment and llama-server (the CUDA build for native GPU tasks, the CPU
     default's with --cpu), the weights fetched and verified, derived models made; tasks run offline;
  3. `<results>/slurm/<stamp>/` holds jobs.json (task index -> configuration, plan), array.sbatch, check.sbatch,
     logs/ (Slurm's output per task) and tasks/<index>.json (each task's own record: running, then its outcome);
  4. the array holds only the jobs whose runs are not all complete, so resubmitting resumes (and the protocol reuses
     a plan's complete sessions); the check job depends on it with `--dependency=afterany`.
A task (`./run.sh all --slurm-task I --submission DIR`, from array.sbatch) runs job I the native way (native.py: the
same isolated process as `all --native`, on the GPU Slurm gave it), or the artifact's image through Apptainer/
Singularity (`--container apptainer --image FILE.sif`) or Docker (`--container docker`). The check job
(`--slurm-finish`) prints the final table from the records and runs check. `--status` shows each task's state from
the results directory, with squeue's and (where accounting is on) sacct's view.

The results directory must be on a file system every node mounts: the batch script first checks that it sees the
submission's jobs.json and says so in one line when it does not; submitting under a node-local path warns.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

from artifact import workloads
from artifact.models import hub as weights
from artifact.config import REPO, load_config
from artifact.errors import ArtifactError
from artifact.orchestrate import engines
from artifact.orchestrate.common import conclude, say
from artifact.orchestrate.fanout import DONE, FAILED, INTERRUPTED, SKIPPED, Outcome, Progress, Slot, check_manifests, \
    hms, runs_per_session
from artifact.orchestrate.matrix import Job

JOB_NAME = "prefix-cache-all"
CHECK_NAME = "prefix-cache-check"
SUBMISSIONS = "slurm"  # <results>/slurm/<stamp>/
SPEC = "jobs.json"
SITE_OPTIONS = ("partition", "account", "qos", "time", "gres")
NAME_RE = re.compile(r"^[A-Za-z0-9_.,+-]+$")
TIME_RE = re.compile(r"^(\d+(-\d+)?(:\d+){0,2}|UNLIMITED|INFINITE)$")
GRES_RE = re.compile(r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+){0,2}(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+){0,2})*$")
LINE_RE = re.compile(r"^--?[A-Za-z][A-Za-z0-9-]*([ =]\S.*)?$")
OWN_OPTIONS = ("--array", "--dependency", "--output", "--error", "--job-name", "-a", "-d", "-o", "-e", "-J")
NODE_LOCAL_FS = {"tmpfs", "ramfs", "devtmpfs", "overlay", "squashfs"}


def sbatch_options(args) -> list[str]:
    """The site's options for both jobs, checked: one line per bad value."""
    out = []
    for name in SITE_OPTIONS:
        value = getattr(args, name)
        if name == "gres" and value is None and not args.cpu:
            value = "gpu:1"  # one GPU per task unless the site says otherwise
        if value is None or (name == "gres" and value == "none"):
            continue
        rule = {"time": TIME_RE, "gres": GRES_RE}.get(name, NAME_RE)
        if not rule.match(value):
            example = {"time": "e.g. 90, 4:00:00 or 1-00:00:00", "gres": "e.g. gpu:1 or gpu:a100:1"}.get(
                name, "letters, digits, '_', '.', '-'")
            raise ArtifactError(f"--{name} {value!r}: not a Slurm {name} ({example})")
        out.append(f"--{name}={value}")
    for line in args.sbatch_line:
        opt = re.sub(r"^#SBATCH\s+", "", line.strip())
        if "\n" in line or not LINE_RE.match(opt):
            raise ArtifactError(f"--sbatch-line {line!r}: expected one sbatch option such as --cpus-per-task=8")
        if re.split(r"[ =]", opt, maxsplit=1)[0] in OWN_OPTIONS:
            raise ArtifactError(f"--sbatch-line {line!r}: {opt.split('=')[0]} is set by the artifact itself")
        out.append(opt)
    return out


def filesystem(path: Path) -> str:
    """The file system type of the mount holding `path` (/proc/mounts), or "unknown"."""
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                mnt = parts[1].replace("\\040", " ")
                if (str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def shared_note(results: Path) -> str | None:
    """A warning when the results directory looks node-local (tasks on other nodes would not see it)."""
    probe = results
    while not probe.exists():
        probe = probe.parent
    kind = filesystem(probe.resolve())
    if kind in NODE_LOCAL_FS or str(results).startswith(("/tmp/", "/var/tmp/", "/dev/shm/", "/run/")):
        return (f"{results} is on {kind} under a node-local path: tasks on other nodes cannot see it (fine on a "
                "single node); put --results on a file system every node mounts (NFS, Lustre, GPFS, BeeGFS, ...)")
    return None


def plan_problem(results: Path, key: str) -> str | None:
    """None when every run of the configuration x plan `key` is complete under `results`, else why not."""
    pdir = results / key
    return check_manifests(pdir, None) if pdir.is_dir() else "not started"


def complete(results: Path, job: Job) -> bool:
    return plan_problem(results, job.key) is None


def array_spec(indices: list[int]) -> str:
    """0,1,2,5,6 -> 0-2,5-6"""
    out, start = [], None
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def job_entry(i: int, j: Job) -> dict:
    return {"index": i, "key": j.key, "config": j.config_path, "plan": j.plan, "gpu_mem_gib": j.gpu_mem_gib,
            "hours": j.hours, "engine": j.engine}


def entry_job(e: dict) -> Job:
    return Job(load_config(str(REPO / e["config"])), e["config"], e["plan"], float(e["gpu_mem_gib"]),
               float(e["hours"]))


def body(sub: Path, spec: dict, entry: str) -> str:
    q = shlex.quote
    env = {"ARTIFACT_VENV": spec["venv"], "ARTIFACT_WEIGHTS": spec["weights"], "HF_HUB_CACHE": spec["hf_hub_cache"],
           "HF_HUB_OFFLINE": "1"}
    return "\n".join([
        "set -euo pipefail",
        f"sub={q(str(sub))}",
        f"cd {q(str(REPO))} 2>/dev/null || {{ echo \"error: the artifact ({REPO}) is not visible on $(hostname): "
        "it must be on a file system every node mounts\" >&2; exit 2; }",
        f"[ -f \"$sub/{SPEC}\" ] || {{ echo \"error: the results directory is not visible on $(hostname) "
        f"($sub/{SPEC} missing): --results must be on a file system every node mounts\" >&2; exit 2; }}",
        "export " + " ".join(f"{k}={q(v)}" for k, v in env.items()),
        "unset ARTIFACT_ALLOW_NETWORK  # the protocol runs without network (scripts/isolate.sh) whatever sbatch passed",
        entry, ""])


def array_script(sub: Path, spec: dict, opts: list[str]) -> str:
    jobs = {e["index"]: e for e in spec["jobs"]}
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={JOB_NAME}",
             f"#SBATCH --array={array_spec(spec['array'])}",
             f"#SBATCH --output={sub}/logs/task-%a-%A.out",
             *(f"#SBATCH {o}" for o in opts),
             f"# ./run.sh all --slurm: one task per configuration x plan ({spec['mode']}"
             f"{', CPU' if spec['cpu'] else ', one GPU each'}); resubmitting resumes. Tasks:"]
    lines += [f"#   {i:>3}  {jobs[i]['key']}  (~{jobs[i]['hours']:g} h, ~{jobs[i]['gpu_mem_gib']:g} GiB GPU memory)"
              for i in spec["array"]]
    entry = 'exec ./run.sh all --slurm-task "$SLURM_ARRAY_TASK_ID" --submission "$sub"'
    return "\n".join(lines) + "\n" + body(sub, spec, entry)


def check_script(sub: Path, spec: dict, opts: list[str], array_id: str) -> str:
    site = [o for o in opts if not o.startswith("--gres=")]  # check needs no GPU
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={CHECK_NAME}",
             f"#SBATCH --dependency=afterany:{array_id}",
             f"#SBATCH --output={sub}/logs/check-%j.out",
             *(f"#SBATCH {o}" for o in site),
             "# after every task has ended (done, failed or cancelled): the final table, then check and the report"]
    return "\n".join(lines) + "\n" + body(sub, spec, 'exec ./run.sh all --slurm-finish --submission "$sub"')


def sbatch(args_: list[str], what: str) -> str:
    try:
        r = subprocess.run(["sbatch", *args_], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArtifactError(f"sbatch failed to run ({exc})") from None
    if r.returncode != 0:
        err = [ln.strip() for ln in (r.stderr + r.stdout).splitlines()
               if ln.strip() and not ln.startswith("Try \"sbatch --help\"")]
        msg = next((ln for ln in err if "error" in ln.lower()), err[0] if err else f"exit {r.returncode}")
        raise ArtifactError(f"sbatch refused the {what} ({msg}): check --partition, --account, --qos, --gres, "
                            "--time and --sbatch-line")
    return (r.stdout + r.stderr).strip()


def require_sbatch() -> str:
    path = shutil.which("sbatch")
    if not path:
        raise ArtifactError("sbatch not found on PATH: --slurm submits from a host with the Slurm client (a login "
                            "node of the cluster); --dry-run prints the batch scripts without it")
    return path


def submissions(results: Path) -> list[Path]:
    root = results / SUBMISSIONS
    return sorted(p for p in root.iterdir() if (p / SPEC).is_file()) if root.is_dir() else []


def read_spec(sub: Path) -> dict:
    try:
        return json.loads((sub / SPEC).read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{sub / SPEC}: cannot read the submission ({exc})") from None


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def queue_states(job_id: str | None) -> dict:
    """Array task index (or "job" for a plain job) -> (state, node or reason) as squeue lists them now."""
    if not job_id or not shutil.which("squeue"):
        return {}
    try:
        r = subprocess.run(["squeue", "-h", "-r", "-j", str(job_id), "-o", "%K|%T|%N|%R"], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        k, state, node, reason = (line.split("|") + ["", "", "", ""])[:4]
        out[int(k) if k.strip().isdigit() else "job"] = (state.lower(), node or reason.strip("()"))
    return out


def accounting(ids: list[str]) -> tuple[dict, str | None]:
    """sacct's view: JobID (e.g. 12_3) -> (state, exit code, elapsed); or why there is none."""
    ids = [i for i in ids if i]
    if not ids or not shutil.which("sacct"):
        return {}, "sacct not on PATH"
    try:
        r = subprocess.run(["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobID,State,ExitCode,Elapsed"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {}, f"sacct failed ({exc})"
    if r.returncode != 0:
        return {}, "sacct: " + ((r.stderr or r.stdout).strip().splitlines() or ["failed"])[0]
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 4:
            out[parts[0]] = (parts[1].split()[0].lower(), parts[2], parts[3])
    return out, None


# --- submission --------------------------------------------------------------------------------------------------

def cmd_slurm(jobs: list[Job], args) -> int:
    results = Path(args.results).resolve()
    if args.status:
        return status(results)
    opts = sbatch_options(args)
    mode = args.container
    if mode == "apptainer" and not args.image and not args.dry_run:
        raise ArtifactError("--container apptainer needs --image FILE.sif (apptainer build FILE.sif "
                            "docker-daemon://prefix-cache-artifact/llamacpp:TAG; ARTIFACT.md section 7c)")
    if mode == "apptainer" and args.image and not Path(args.image).is_file() and not args.dry_run:
        raise ArtifactError(f"--image {args.image}: no such file")
    where = "container" if mode != "native" else "native"
    skipped = {j.key: why for j in jobs if (why := engines.unavailable(j, where, gpu=False))}
    done = {j.key for j in jobs if complete(results, j)}
    todo = [i for i, j in enumerate(jobs) if j.key not in skipped and j.key not in done]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    n = 1
    while (results / SUBMISSIONS / stamp).exists():  # two submissions within a second
        n += 1
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{n}"
    sub = results / SUBMISSIONS / stamp
    spec = {"version": 1, "stamp": stamp, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "created_epoch": time.time(), "submit_host": socket.gethostname(), "repo": str(REPO),
            "results": str(results),
            "venv": task_venv(args, mode), "mode": mode, "cpu": bool(args.cpu), "image": args.image, "image_id": None,
            "episodes": args.episodes, "progress_every": args.progress_every, "expect_build": None,
            "base_image": args.base_image, "cuda_archs": args.cuda_archs,
            "ca_bundle": str(Path(args.ca_bundle).resolve()) if args.ca_bundle else None,
            "weights": str(weights.weights_root().resolve()), "hf_hub_cache": hf_hub_cache(),
            "matrix": args.matrix, "jobs": [job_entry(i, j) for i, j in enumerate(jobs)], "array": todo,
            "skipped": skipped, "complete_before": sorted(done), "sbatch_options": opts,
            "array_job_id": None, "check_job_id": None}
    if args.dry_run:
        return dry_run(jobs, spec, sub, opts)
    require_sbatch()
    for key, why in skipped.items():
        say(f"{key}: skipped ({why})")
    if not todo:
        print(f"all {len(jobs) - len(skipped)} runnable jobs are complete under {results}: nothing to submit "
              f"(./run.sh check {results})")
        return 0
    previous = submissions(results)
    if previous:
        last = read_spec(previous[-1])
        if queue_states(last.get("array_job_id")):
            raise ArtifactError(f"the array job {last['array_job_id']} of the last submission ({previous[-1].name}) "
                                "still has tasks queued or running: wait for it (./run.sh all --slurm --status) or "
                                f"scancel {last['array_job_id']}, then submit again")
    (sub / "logs").mkdir(parents=True, exist_ok=True)
    (sub / "tasks").mkdir()
    try:  # the site's options judged by sbatch itself before anything is set up or submitted
        (sub / "array.sbatch").write_text(array_script(sub, spec, opts))
        sbatch(["--test-only", str(sub / "array.sbatch")], "job array")
        note = shared_note(results)
        if note:
            say(f"note: {note}")
        spec.update(prepare([jobs[i] for i in todo], args, mode))
    except BaseException:
        shutil.rmtree(sub, ignore_errors=True)
        raise
    write_json(sub / SPEC, spec)
    (sub / "array.sbatch").write_text(array_script(sub, spec, opts))
    array_id = sbatch(["--parsable", str(sub / "array.sbatch")], "job array").split(";")[0].strip()
    (sub / "check.sbatch").write_text(check_script(sub, spec, opts, array_id))
    try:
        check_id = sbatch(["--parsable", str(sub / "check.sbatch")], "check job").split(";")[0].strip()
    except ArtifactError:
        subprocess.run(["scancel", array_id], capture_output=True, timeout=60)
        raise
    spec.update(array_job_id=array_id, check_job_id=check_id)
    write_json(sub / SPEC, spec)
    print(f"submitted array job {array_id}: {len(todo)} task(s) ({array_spec(todo)}; {len(done)} job(s) complete "
          f"before, {len(skipped)} skipped) and check job {check_id} (--dependency=afterany:{array_id})")
    print(f"submission: {sub}\nstatus: ./run.sh all --slurm --status --results {results}")
    return 0


def task_venv(args, mode: str) -> str:
    """The environment the tasks run in: native GPU tasks the CUDA build's (run.sh runs the submission from it),
    else this one."""
    from artifact.orchestrate.native import native_venv

    return str(native_venv()) if mode == "native" and not args.cpu else sys.prefix


def hf_hub_cache() -> str:
    from huggingface_hub import constants

    return str(Path(constants.HF_HUB_CACHE).resolve())


def prepare(runnable: list[Job], args, mode: str) -> dict:
    """The set-up the tasks rely on, done here once: llama-server (native), weights, derived models; for Apptainer
    the image's digest."""
    from artifact.orchestrate import native

    out = {}
    if mode == "native":
        out["expect_build"] = native.ensure_llama_server(args)
    if not args.no_fetch:
        from artifact.fetch import fetch

        fetch([j.cfg for j in runnable])
    if mode != "docker":
        native.prepare_models(runnable, fetch=False)
    if mode == "apptainer":
        from artifact.models.hub import sha256_file

        out["image"] = str(Path(args.image).resolve())
        out["image_id"] = "sha256:" + sha256_file(Path(out["image"]))
    return out


def dry_run(jobs: list[Job], spec: dict, sub: Path, opts: list[str]) -> int:
    todo = spec["array"]
    print(f"./run.sh all --slurm --dry-run: {len(jobs)} configuration x plan jobs ({spec['matrix']}); "
          f"{len(todo)} to submit as array tasks, {len(spec['complete_before'])} complete under {spec['results']}, "
          f"{len(spec['skipped'])} skipped")
    rows = [("task", "configuration / plan", "est. h", "GPU GiB", "")]
    for e in spec["jobs"]:
        state = ("" if e["index"] in todo else "complete" if e["key"] in spec["complete_before"]
                 else f"skipped: {spec['skipped'].get(e['key'], '')}")
        rows.append((str(e["index"]) if e["index"] in todo else "-", e["key"], f"{e['hours']:g}",
                     f"{e['gpu_mem_gib']:g}", state))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4])
    hours = [e["hours"] for e in spec["jobs"] if e["index"] in todo]
    if hours:
        print(f"time per task (estimate, RTX 4090 class): {min(hours):g}-{max(hours):g} h, {sum(hours):.1f} h in "
              f"all; GPU memory per task up to {max(e['gpu_mem_gib'] for e in spec['jobs'] if e['index'] in todo):g}"
              " GiB (every task gets the same --gres: choose a GPU type that takes the largest)")
    if not any(o.startswith("--time=") for o in opts):
        print("--time not given: the partition's default time limit applies (a task cut off by it is re-run from its "
              "last complete session on resubmission)")
    note = shared_note(Path(spec["results"]))
    print(f"results: {spec['results']} ({filesystem(Path(spec['results']))}); every node must see it"
          + (f"\nnote: {note}" if note else ""))
    if not todo:
        print("nothing to submit")
        return 0
    print(f"\n--- {sub}/array.sbatch")
    print(array_script(sub, spec, opts), end="")
    print(f"\n--- {sub}/check.sbatch")
    print(check_script(sub, spec, opts, "<array job id>"), end="")
    found = shutil.which("sbatch")
    print(f"\nwould run: sbatch --test-only array.sbatch; sbatch --parsable array.sbatch; sbatch --parsable "
          f"check.sbatch\nsbatch: {found or 'not found on PATH (needed to submit)'}; nothing submitted")
    return 0


# --- the tasks ---------------------------------------------------------------------------------------------------

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
    argv = [exe, "exec", "--cleanenv", "--containall", "--pwd", "/artifact", *(["--nv"] if not spec["cpu"] else []),
            *[a for b in binds for a in ("--bind", b)], *[a for e in env for a in ("--env", e)], spec["image"],
            "/artifact/scripts/isolate.sh", "/artifact/.venv/bin/python", "-m", "artifact", "run", job.config_path,
            "--plan", job.plan, "--results", "/results", *(["--episodes", str(spec["episodes"])] if spec["episodes"]
                                                            else [])]
    return argv, dict(os.environ)


def task_fanout(task: Task, job: Job):
    """The back-end a task runs its job with (see the module's docstring)."""
    from artifact.orchestrate import native

    spec, results = task.spec, Path(task.spec["results"])
    if spec["mode"] == "docker":
        return docker_fanout(spec, job, results)
    if spec["mode"] == "apptainer":
        command, kind = partial(apptainer_command, spec=spec), "apptainer"
    else:
        command, kind = partial(native.job_command, results=results, episodes=spec["episodes"]), "slurm"
    # Slurm signals every process of the job itself (scancel, the time limit): no second signal from here
    return native.NativeFanout(results, native.expected_builds(spec["expect_build"]), command,
                               progress_every=spec["progress_every"], kind=kind, forward_signals=False)


def docker_fanout(spec: dict, job: Job, results: Path):
    from artifact.orchestrate import host, images
    from artifact.orchestrate.fanout import Fanout

    client = host.docker_client()
    image_args = SimpleNamespace(cpu=spec["cpu"], base_image=spec["base_image"], cuda_archs=spec["cuda_archs"])
    ispec = engines.image_spec(job.engine, image_args)
    image = images.ensure_image(client, ispec, results / "logs",
                                ca_bundle=Path(spec["ca_bundle"]) if spec.get("ca_bundle") else None)
    return Fanout(client, {job.engine: image}, {job.engine: ispec.expect_build_info}, results,
                  Path(spec["weights"]), Path(spec["hf_hub_cache"]), episodes=spec["episodes"],
                  progress_every=spec["progress_every"], shm_size={job.engine: ispec.shm_size})


def run_task(args) -> int:
    """One array task: its job, its record (running, then the outcome); exit 0 done, 3 failed, 130 stopped."""
    task = load_task(args)
    e = task.entry
    record = {"index": e["index"], "key": e["key"], "state": "running", "node": socket.gethostname(),
              "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "started_epoch": time.time()}
    write_json(task.record_path, record)
    say(f"task {e['index']}: {e['key']} on {record['node']} ({task.spec['mode']}"
        + (f", CUDA_VISIBLE_DEVICES={record['cuda_visible_devices']}" if record["cuda_visible_devices"] else "")
        + ")")
    t0 = time.monotonic()
    try:
        job = entry_job(e)
        outcome = task_fanout(task, job).run([job], [task_slot(task.spec)])[0]
    except KeyboardInterrupt:
        outcome = Outcome(entry_job(e), INTERRUPTED, note="stopped by a signal")
    except ArtifactError as exc:
        outcome = Outcome(entry_job(e), FAILED, note=str(exc))
    record.update(state=outcome.status, note=outcome.note, seconds=round(time.monotonic() - t0, 1),
                  ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if outcome.status == INTERRUPTED:
        record["note"] = "stopped by a signal (scancel, the time limit or preemption); resubmitting resumes"
    write_json(task.record_path, record)
    print(f"task {e['index']}: {e['key']} {outcome.status} after {hms(record['seconds'])}"
          + (f" ({record['note']})" if record["note"] else ""))
    return 0 if outcome.status == DONE else 130 if outcome.status == INTERRUPTED else 3


# --- state: the check job and --status ---------------------------------------------------------------------------

def read_record(sub: Path, index: int) -> dict | None:
    try:
        return json.loads((sub / "tasks" / f"{index}.json").read_text())
    except (OSError, ValueError):
        return None


def last_progress(results: Path, job_key: str, record: dict) -> str:
    """Where a running task is, from its newest log through the fan-out's own Progress reader."""
    config, plan = job_key.rsplit("/", 1)
    logs = sorted((results / config / plan / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return ""
    from artifact.config import load_plan

    total, per_session = runs_per_session(load_plan(plan))
    p = Progress(SimpleNamespace(key=job_key), total,
                 started=time.monotonic() - (time.time() - record.get("started_epoch", time.time())))
    for line in logs[-1].read_text(errors="replace").splitlines():
        p.feed(line, per_session)
    return p.summary()


def task_states(sub: Path, spec: dict, live: bool) -> list[dict]:
    """Per job of the submission: its state from the results directory and its task record, and with `live` what
    squeue (and sacct, where accounting is on) say."""
    results = Path(spec["results"])
    queue = queue_states(spec.get("array_job_id")) if live else {}
    acct, _ = accounting([spec.get("array_job_id")]) if live else ({}, None)
    rows = []
    for e in spec["jobs"]:
        i, key = e["index"], e["key"]
        rec = read_record(sub, i) if i in spec["array"] else None
        is_complete = plan_problem(results, key) is None
        q = queue.get(i)
        a = acct.get(f"{spec.get('array_job_id')}_{i}")
        node, secs, note = (rec or {}).get("node", ""), (rec or {}).get("seconds"), (rec or {}).get("note", "")
        if key in spec["skipped"]:
            state, note = SKIPPED, spec["skipped"][key]
        elif i not in spec["array"]:
            state, note = DONE, "complete before this submission"
        elif q:
            state = q[0]
            if state == "pending":
                note = q[1]
            elif state == "running" and rec:
                node = q[1] or node
                secs = time.time() - rec.get("started_epoch", time.time())
                note = last_progress(results, key, rec)
        elif rec and rec["state"] == "running":
            state = "stopped"
            note = ("ended without its record (killed, cancelled or the node failed): resubmitting resumes"
                    + (f"; sacct: {a[0]} {a[1]}" if a else ""))
        elif rec:
            state = rec["state"]
        elif is_complete:
            state = DONE
        else:
            state = a[0] if a else "no record"
            note = ("the task never started, or its node cannot see the results directory (it must be on a file "
                    f"system every node mounts); Slurm's output: {sub}/logs/")
        if state == DONE and not is_complete:
            state, note = FAILED, plan_problem(results, key)
        rows.append({"index": i, "key": key, "state": state, "node": node, "seconds": secs, "note": note or ""})
    return rows


def latest(results: Path) -> Path:
    subs = submissions(results)
    if not subs:
        raise ArtifactError(f"no Slurm submission under {results / SUBMISSIONS} (./run.sh all --slurm --results "
                            f"{results} submits one)")
    return subs[-1]


def status(results: Path) -> int:
    sub = latest(results)
    spec = read_spec(sub)
    rows = task_states(sub, spec, live=True)
    print(f"== ./run.sh all --slurm --status: submission {sub.name} ({spec['mode']}), array job "
          f"{spec.get('array_job_id')}, check job {spec.get('check_job_id')}")
    table = [("task", "configuration / plan", "state", "node", "time", "note")]
    for r in rows:
        table.append((str(r["index"]) if r["index"] in spec["array"] else "-", r["key"], r["state"], r["node"] or "-",
                      hms(r["seconds"]) if r["seconds"] else "-", r["note"]))
    widths = [max(len(t[i]) for t in table) for i in range(5)]
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t[:5], widths)) + "  " + t[5])
    check = queue_states(spec.get("check_job_id")).get("job")
    _, why = accounting([spec.get("array_job_id")])
    counts = {s: sum(r["state"] == s for r in rows) for s in dict.fromkeys(r["state"] for r in rows)}
    print(", ".join(f"{n} {s}" for s, n in counts.items())
          + f"; check job {spec.get('check_job_id')}: " + (f"{check[0]} ({check[1]})" if check else
                                                            "not queued (ended, or never submitted)")
          + (f"; {why}" if why else ""))
    if (results / "check" / "check.json").is_file():
        print(f"check: {results / 'check' / 'report.html'}")
    return 0


def finish(args) -> int:
    """The check job: the final table from the task records, then check and the report (the exit code of `all`)."""
    if not args.submission:
        raise ArtifactError("--slurm-finish needs --submission DIR (the batch script passes it)")
    sub = Path(args.submission)
    spec = read_spec(sub)
    t0 = time.monotonic() - (time.time() - spec.get("created_epoch", time.time()))  # the total since submission
    jobs, outcomes = [], []
    for r, e in zip(task_states(sub, spec, live=False), spec["jobs"]):
        job = entry_job(e)
        jobs.append(job)
        status_ = r["state"] if r["state"] in (DONE, SKIPPED) else FAILED
        note = r["note"] if r["state"] in (DONE, SKIPPED, FAILED) else f"{r['state']}: {r['note']}".strip(": ")
        outcomes.append(Outcome(job, status_, r["node"], r["seconds"] or 0.0, note))
    print(f"submission {sub.name}: array job {spec.get('array_job_id')}")
    return conclude(outcomes, jobs, Path(spec["results"]), t0)
