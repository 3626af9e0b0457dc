"""Workloads as plug-ins: one package per workload under artifact/workloads/, one line in REGISTRY.

Each package exposes `WORKLOAD`, an `artifact.workloads.base.Workload`: its settings (the configuration's
[workload] keys beyond name, episodes and n_predict), its units and their execution (`prepare`, `run_unit`), the
engine capabilities it needs, and its own tables, summary and report section. Adding a workload means adding its
package and a line here; outside workloads/ no module names one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from artifact.errors import ArtifactError

if TYPE_CHECKING:
    from artifact.records.store import Run

REGISTRY = {
    "bfcl_multi_turn_base": "artifact.workloads.bfcl",
    "gsm8k": "artifact.workloads.gsm8k",
}
DEFAULT = "bfcl_multi_turn_base"  # records made before manifests named their workload are of this one


def get(name: str):
    if name not in REGISTRY:
        raise ArtifactError(
            f"workload.name = {name!r} is not implemented in this version of the artifact "
            f"(implemented: {', '.join(REGISTRY)})"
        )
    return importlib.import_module(REGISTRY[name]).WORKLOAD


def arms() -> tuple[str, ...]:
    """Every arm a plan may have: the paired arms and those of the registered workloads."""
    return tuple(dict.fromkeys(a for name in REGISTRY for a in get(name).arms))


def of_run(run: Run) -> Any:  # a Workload or None (base.py imports this package: it is not imported back)
    """The workload a run's records belong to (its manifest says; older records are the default one's)."""
    name = run.manifest.get("workload") or DEFAULT
    return get(name) if name in REGISTRY else None


def by_workload(runs: list) -> dict:
    """name -> (workload, its runs), in registry order, for the runs whose workload this version knows."""
    out: dict = {}
    for run in runs:
        w = of_run(run)
        if w is not None:
            out.setdefault(w.name, (w, []))[1].append(run)
    return {name: out[name] for name in REGISTRY if name in out}


def cache_bridges() -> dict:
    """name -> (workload, its CacheBridge) for every registered cache-bridge workload, in registry order."""
    out = {}
    for name in REGISTRY:
        w = get(name)
        if w.cache_bridge is not None:
            out[name] = (w, w.cache_bridge)
    return out
