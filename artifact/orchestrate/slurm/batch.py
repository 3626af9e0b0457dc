"""The batch scripts (array.sbatch, check.sbatch) and the site's own sbatch: the site options checked in one line
each, `sbatch --test-only`, and whether the results directory looks node-local."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from artifact.config import REPO
from artifact.errors import ArtifactError
from artifact.orchestrate.slurm.spec import SPEC

JOB_NAME = "prefix-cache-all"
CHECK_NAME = "prefix-cache-check"
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
                name, "letters, digits, '_', '.', '-'"
            )
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
        return (
            f"{results} is on {kind} under a node-local path: tasks on other nodes cannot see it (fine on a "
            "single node); put --results on a file system every node mounts (NFS, Lustre, GPFS, BeeGFS, ...)"
        )
    return None


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


def body(sub: Path, spec: dict, entry: str) -> str:
    q = shlex.quote
    env = {
        "ARTIFACT_VENV": spec["venv"],
        "ARTIFACT_WEIGHTS": spec["weights"],
        "HF_HUB_CACHE": spec["hf_hub_cache"],
        "HF_HUB_OFFLINE": "1",
    }
    return "\n".join(
        [
            "set -euo pipefail",
            f"sub={q(str(sub))}",
            f'cd {q(str(REPO))} 2>/dev/null || {{ echo "error: the artifact ({REPO}) is not visible on $(hostname): '
            'it must be on a file system every node mounts" >&2; exit 2; }',
            f'[ -f "$sub/{SPEC}" ] || {{ echo "error: the results directory is not visible on $(hostname) '
            f'($sub/{SPEC} missing): --results must be on a file system every node mounts" >&2; exit 2; }}',
            "export " + " ".join(f"{k}={q(v)}" for k, v in env.items()),
            "unset ARTIFACT_ALLOW_NETWORK  # the protocol runs without network (scripts/isolate.sh) whatever sbatch passed",
            entry,
            "",
        ]
    )


def array_script(sub: Path, spec: dict, opts: list[str]) -> str:
    jobs = {e["index"]: e for e in spec["jobs"]}
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={JOB_NAME}",
        f"#SBATCH --array={array_spec(spec['array'])}",
        f"#SBATCH --output={sub}/logs/task-%a-%A.out",
        *(f"#SBATCH {o}" for o in opts),
        f"# ./run.sh all --slurm: one task per configuration x plan ({spec['mode']}"
        f"{', CPU' if spec['cpu'] else ', one GPU each'}); resubmitting resumes. Tasks:",
    ]
    lines += [
        f"#   {i:>3}  {jobs[i]['key']}  (~{jobs[i]['hours']:g} h, ~{jobs[i]['gpu_mem_gib']:g} GiB GPU memory)"
        for i in spec["array"]
    ]
    entry = 'exec ./run.sh all --slurm-task "$SLURM_ARRAY_TASK_ID" --submission "$sub"'
    return "\n".join(lines) + "\n" + body(sub, spec, entry)


def check_script(sub: Path, spec: dict, opts: list[str], array_id: str) -> str:
    site = [o for o in opts if not o.startswith("--gres=")]  # check needs no GPU
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={CHECK_NAME}",
        f"#SBATCH --dependency=afterany:{array_id}",
        f"#SBATCH --output={sub}/logs/check-%j.out",
        *(f"#SBATCH {o}" for o in site),
        "# after every task has ended (done, failed or cancelled): the final table, then check and the report",
    ]
    return "\n".join(lines) + "\n" + body(sub, spec, 'exec ./run.sh all --slurm-finish --submission "$sub"')


def sbatch(args_: list[str], what: str) -> str:
    try:
        r = subprocess.run(["sbatch", *args_], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArtifactError(f"sbatch failed to run ({exc})") from None
    if r.returncode != 0:
        err = [
            ln.strip()
            for ln in (r.stderr + r.stdout).splitlines()
            if ln.strip() and not ln.startswith('Try "sbatch --help"')
        ]
        msg = next((ln for ln in err if "error" in ln.lower()), err[0] if err else f"exit {r.returncode}")
        raise ArtifactError(
            f"sbatch refused the {what} ({msg}): check --partition, --account, --qos, --gres, --time and --sbatch-line"
        )
    return (r.stdout + r.stderr).strip()


def require_sbatch() -> str:
    path = shutil.which("sbatch")
    if not path:
        raise ArtifactError(
            "sbatch not found on PATH: --slurm submits from a host with the Slurm client (a login "
            "node of the cluster); --dry-run prints the batch scripts without it"
        )
    return path
