"""Serving engines behind one interface (`base.EngineSession`); configurations pick one with `engine.kind`.

Each adapter module provides `KIND`, `identity(cfg, plan)` (what produces the tokens, known before start) and a
session class built from (cfg, plan, arm, model_path, log_path). The protocol calls only `identity` and
`open_session`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from artifact.config import Config, Plan
from artifact.errors import ArtifactError


def adapter(kind: str) -> ModuleType:
    """The adapter module of an implemented engine kind; any other kind is refused before anything runs."""
    if kind == "llama.cpp":
        from artifact.engines import llama_server

        return llama_server
    if kind == "vllm":
        from artifact.engines import vllm_server

        return vllm_server
    raise ArtifactError(f"engine.kind = {kind!r} is not implemented in this version of the artifact "
                        "(implemented: llama.cpp, vllm)")


def identity(cfg: Config, plan: Plan) -> dict:
    return adapter(cfg.engine.kind).identity(cfg, plan)


def describe_cache(cfg: Config, plan: Plan, arm: str) -> str:
    """The cache condition an arm's server session runs under, in words."""
    return adapter(cfg.engine.kind).describe_cache(plan, arm)


def open_session(cfg: Config, plan: Plan, arm: str, model_path: Path, log_path: Path):
    """A not yet started server session for one arm's runs (use it as a context manager)."""
    return adapter(cfg.engine.kind).open_session(cfg, plan, arm, model_path, log_path)
