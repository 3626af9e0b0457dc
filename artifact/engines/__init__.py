"""Serving engines as plug-ins: one package per engine under artifact/engines/, one line in REGISTRY.

Each package exposes `ENGINE`, an `artifact.engines.base.Engine`: its required core is what the engine can do
(`capabilities`), what produces its tokens (`identity`, known before start), each arm's cache condition in words
(`describe_cache`) and its sessions (`open_session`); its settings, record audit (`audit`) and builds (`builds`)
have defaults. The protocol calls only the functions below; it never asks which engine runs. Adding an engine
(SGLang, a newer vLLM) means adding its package and a line here (docs/extending.md walks through one).
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from artifact.errors import ArtifactError
from artifact.models import derive

if TYPE_CHECKING:
    from artifact.engines.base import Engine

REGISTRY = {
    "llama.cpp": "artifact.engines.llama_cpp",
    "vllm": "artifact.engines.vllm",
    "endpoint": "artifact.engines.endpoint",
}
DEFAULT = "llama.cpp"  # records made before manifests named their engine are of this one


def get(kind: str) -> Engine:
    """The adapter of an implemented engine kind; any other kind is refused before anything runs."""
    if kind not in REGISTRY:
        raise ArtifactError(
            f"engine.kind = {kind!r} is not implemented in this version of the artifact "
            f"(implemented: {', '.join(REGISTRY)})"
        )
    return importlib.import_module(REGISTRY[kind]).ENGINE


def find(kind: str):
    """The adapter of engine `kind`, or None for a kind this version does not implement."""
    return get(kind) if kind in REGISTRY else None


def _tools_dir(kind: str) -> Path:
    builds = get(kind).builds
    tools = builds.tools_dir() if builds is not None else None
    if tools is None:
        raise ArtifactError(f"engine {kind} has no tools a model recipe can run")
    return tools


# A derived model's recipe names the engine whose tools make it (artifact.models.derive sits below the engines and
# asks this table, never the registry).
for _kind in REGISTRY:
    derive.TOOL_DIRS.setdefault(_kind, functools.partial(_tools_dir, _kind))


def of_manifest(manifest: dict):
    """The engine a run's records were served by (its manifest says; older records are the default one's), or None
    for an engine this version does not know."""
    return find(manifest.get("engine") or DEFAULT)


def server_family(manifest: dict) -> str | None:
    """The family of server a run was served by, derived from facts (`Engine.audit.family_of`: the server the engine
    started, or what the server reported of itself); None for an engine this version does not know (the facts cannot
    decide: the run feeds no claim about a family of servers)."""
    engine = of_manifest(manifest)
    return engine.audit.family_of(manifest) if engine is not None else None


LOOPBACK_ONLY = "loopback-only"  # provenance.isolation's network of a run that could reach nothing but loopback


def network(manifest: dict) -> tuple[str, str | None]:
    """(network, why): the network a run ran in, derived from facts: its manifest's isolation.network
    ("not recorded" without one), but "loopback-only" only where every server the run's engine talked to is on a
    loopback address by the records (`Engine.audit.remote_servers`: for a server the user runs, the URL recorded); `why`
    says why a recorded "loopback-only" is not believed (None where it is, or where none was recorded)."""
    iso = manifest.get("isolation")
    net = iso.get("network", "not recorded") if isinstance(iso, dict) else "not recorded"
    if net != LOOPBACK_ONLY:
        return net, None
    engine = of_manifest(manifest)
    remote = engine.audit.remote_servers(manifest) if engine is not None else None
    if remote is None:
        why = (
            "its records show no address of the server it talked to"
            if engine is not None
            else f"its engine ({manifest.get('engine')!r}) is not one this version knows"
        )
        return "not known to be loopback-only", why
    if remote:
        return "host network (not isolated)", f"its server {remote[0]} is not a loopback address"
    return net, None


def identity(cfg, plan) -> dict:
    return get(cfg.engine.kind).identity(cfg, plan)


def describe_cache(cfg, plan, arm: str) -> str:
    """The cache condition an arm's server session runs under, in words (the adapter's own)."""
    return get(cfg.engine.kind).describe_cache(cfg, plan, arm)


def open_session(cfg, plan, arm: str, model_path: Path | None, log_path: Path):
    """A not yet started server session for one arm's runs (use it as a context manager); `model_path` is the
    verified weights, None for an engine that loads none (`Capabilities.loads_weights`)."""
    return get(cfg.engine.kind).open_session(cfg, plan, arm, model_path, log_path)


def check_needs(cfg, plan, needs: dict, who: str) -> None:
    """Refuse, in one line and before anything starts, a workload whose needs the engine lacks."""
    engine = get(cfg.engine.kind)
    missing = engine.capabilities_for(cfg).missing({"arms": tuple(plan.arms), **needs})
    if missing:
        raise ArtifactError(
            f"{cfg.name}: {who} needs {', '.join(missing)}, which engine {engine.kind} does not "
            f"have (plan '{plan.name}'); run it on an engine that does"
        )
