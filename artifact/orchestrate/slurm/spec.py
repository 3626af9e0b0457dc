"""A submission's directory, `<results>/slurm/<stamp>/`: jobs.json (the spec: task index -> configuration x plan, and
how the tasks run) and tasks/<index>.json (each task's own record), read and written alike by the submission, the
tasks and the status."""

from __future__ import annotations

import json
import os
from pathlib import Path

from artifact.config import REPO

from artifact.catalog import load_config
from artifact.errors import ArtifactError
from artifact.orchestrate.matrix import Job

SUBMISSIONS = "slurm"  # <results>/slurm/<stamp>/
SPEC = "jobs.json"


def job_entry(i: int, j: Job) -> dict:
    return {
        "index": i,
        "key": j.key,
        "config": j.config_path,
        "plan": j.plan,
        "gpu_mem_gib": j.gpu_mem_gib,
        "hours": j.hours,
        "engine": j.engine,
    }


def entry_job(e: dict) -> Job:
    return Job(load_config(str(REPO / e["config"])), e["config"], e["plan"], float(e["gpu_mem_gib"]), float(e["hours"]))


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


def read_record(sub: Path, index: int) -> dict | None:
    try:
        return json.loads((sub / "tasks" / f"{index}.json").read_text())
    except (OSError, ValueError):
        return None
