"""The configurations and plans of configs/ as every run takes them: read and parsed by artifact.config, then
validated by what runs them. The engine and workload plug-ins check their own settings (a configuration's
[engine.settings] and workload keys, a plan's table named after an engine), the model sources their pins, the
protocol a plan's tenants. artifact.config sits below the plug-ins and asks none of them; this module sits above the
protocol and asks each (docs/developer.md, "The folder map": the layers)."""

from __future__ import annotations

from pathlib import Path

from artifact import engines, workloads
from artifact.config import PLANS_FILE, Config, Plan, build_table, read_config, read_toml
from artifact.errors import ArtifactError
from artifact.models import pypi_parts
from artifact.protocol.background_tenants import spec_of


def _plugin_problems(cfg: Config):
    m = cfg.model
    if m.source.startswith("pypi-parts:"):
        try:
            pypi_parts.check_pins(m.source, m.sha256)
        except ArtifactError as exc:
            yield str(exc)
    if cfg.engine.kind not in engines.REGISTRY:
        yield (
            f"engine.kind = {cfg.engine.kind!r} is not implemented in this version of the artifact "
            f"(implemented: {', '.join(engines.REGISTRY)})"
        )
    if cfg.workload.name not in workloads.REGISTRY:
        yield (
            f"workload.name = {cfg.workload.name!r} is not implemented in this version of the artifact "
            f"(implemented: {', '.join(workloads.REGISTRY)})"
        )


def load_config(name_or_path: str, engine_settings: dict | None = None) -> Config:
    """A configuration, validated whole; `engine_settings` (from the command line) replace keys of its
    [engine.settings]."""
    cfg = read_config(name_or_path, engine_settings)
    for problem in _plugin_problems(cfg):
        raise ArtifactError(f"{cfg.path}: {problem}")
    engines.get(cfg.engine.kind).settings(cfg)
    workloads.get(cfg.workload.name).settings(cfg)
    return cfg


def load_plans(path: Path = PLANS_FILE) -> dict[str, Plan]:
    by_key = {engines.get(kind).settings_key: engines.get(kind) for kind in engines.REGISTRY}
    data = read_toml(path)
    arms = workloads.arms()  # every arm a plan may have (the workloads declare theirs)
    plans = {}
    for name, body in data.items():
        if not isinstance(body, dict):
            raise ArtifactError(f"{path}: '{name}' must be a table [{name}]")
        tables = {k: v for k, v in body.items() if k in by_key}
        for key, table in tables.items():
            if not isinstance(table, dict):
                raise ArtifactError(f"{path}: {name}.{key} must be a table of {by_key[key].kind} settings")
            by_key[key].check_plan_table(table, f"{path}: {name}.{key}")
        rest = {k: v for k, v in body.items() if k not in by_key}
        plan = build_table(Plan, {"name": name, **rest, "engine_settings": tables}, str(path), f"{name}.")
        bad = [a for a in plan.arms if a not in arms]
        if bad or not plan.arms:
            raise ArtifactError(f"{path}: {name}.arms: each arm must be one of {', '.join(arms)}")
        if plan.runs < 1:
            raise ArtifactError(f"{path} [{name}].runs must be >= 1")
        if plan.tenants:
            spec_of(plan, f"{path}: {name}.tenants")
        plans[name] = plan
    return plans


def load_plan(name: str) -> Plan:
    plans = load_plans()
    if name not in plans:
        raise ArtifactError(f"unknown plan '{name}' (known: {', '.join(plans)})")
    return plans[name]
