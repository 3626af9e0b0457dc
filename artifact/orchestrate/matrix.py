"""The run matrix: which configurations run which plans under `./run.sh all` (data: configs/paper/all.toml).

Each `[[run]]` names a configuration (a TOML file next to the matrix file), its plans, the GPU memory it needs
(an estimate) and the estimated GPU hours per plan. Every configuration x plan is one job, run in its own container.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from artifact.config import REPO, Config, read_toml

from artifact.catalog import load_config, load_plans
from artifact.errors import ArtifactError
from artifact.orchestrate.arguments import DEFAULT_MATRIX

RUN_KEYS = {"config": str, "plans": list, "gpu_mem_gib": (int, float), "hours": dict}


@dataclass(frozen=True)
class Job:
    cfg: Config
    config_path: str  # relative to the repository (the image carries the same file)
    plan: str
    gpu_mem_gib: float
    hours: float  # estimate on an RTX 4090-class GPU

    @property
    def key(self) -> str:
        return f"{self.cfg.name}/{self.plan}"

    @property
    def engine(self) -> str:
        return self.cfg.engine.kind


def _entry(path: Path, i: int, run: dict, plans: dict) -> list[Job]:
    where = f"{path}: run[{i}]"
    unknown = sorted(set(run) - set(RUN_KEYS))
    if unknown:
        raise ArtifactError(f"{where}: unknown key '{unknown[0]}' (allowed: {', '.join(RUN_KEYS)})")
    for key, kind in RUN_KEYS.items():
        if key not in run:
            raise ArtifactError(f"{where}: missing key '{key}'")
        if not isinstance(run[key], kind) or isinstance(run[key], bool):
            raise ArtifactError(f"{where}: {key} has the wrong type ({type(run[key]).__name__})")
    cfg_file = (path.parent / f"{run['config']}.toml").resolve()
    try:
        rel = cfg_file.relative_to(REPO)
    except ValueError:
        raise ArtifactError(
            f"{where}: {cfg_file} lies outside the repository; the images carry only its configs/ directory"
        ) from None
    cfg = load_config(str(cfg_file))
    jobs = []
    for plan in run["plans"]:
        if plan not in plans:
            raise ArtifactError(f"{where}: unknown plan '{plan}' (known: {', '.join(plans)})")
        hours = run["hours"].get(plan)
        if not isinstance(hours, (int, float)) or isinstance(hours, bool):
            raise ArtifactError(f"{where}: hours.{plan} missing or not a number")
        jobs.append(Job(cfg, rel.as_posix(), plan, float(run["gpu_mem_gib"]), float(hours)))
    return jobs


def load_jobs(path: Path = DEFAULT_MATRIX, only: list[str] | None = None) -> list[Job]:
    """Every configuration x plan of the matrix, in file order; `only` keeps the named configurations."""
    data = read_toml(path)
    runs = data.get("run")
    if set(data) - {"run"} or not isinstance(runs, list) or not runs:
        raise ArtifactError(f"{path}: expected only [[run]] tables")
    plans = load_plans()
    jobs = [job for i, run in enumerate(runs) for job in _entry(path, i, run, plans)]
    if only:
        names = {j.cfg.name for j in jobs} | {Path(j.config_path).stem for j in jobs}
        missing = [n for n in only if n not in names]
        if missing:
            raise ArtifactError(
                f"--configs: '{missing[0]}' is not in {path.name} "
                f"(known: {', '.join(dict.fromkeys(j.cfg.name for j in jobs))})"
            )
        jobs = [j for j in jobs if j.cfg.name in only or Path(j.config_path).stem in only]
    return jobs
