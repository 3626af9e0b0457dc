"""The kernels a vLLM plan asks both arms' servers to run (the adapter's `attention_backend`, `flash_attn_version`,
`enforce_eager`): the `vllm serve` flags and environment variables they become in each version (versions.py), and
what the manifest records of them (`kernel_settings`, beside `attention`, what vLLM says it chose).
"""

from __future__ import annotations

import json
import re
from typing import Any

from artifact.engines.vllm import versions

BACKEND_NAME = re.compile(r"[A-Z][A-Z0-9_]*")  # vLLM's attention backend registry names (FLASH_ATTN, TRITON_ATTN)


def kernel_args(settings: Any) -> list[str]:
    """The flags of a plan's kernel settings: eager execution, and where the version takes it the attention config
    (0.11.0 takes the attention settings from the environment: `kernel_env`)."""
    if settings is None:
        return []
    out = ["--enforce-eager"] if settings.enforce_eager else []
    attention = kernel_attention(settings)
    if attention and versions.VERSIONS[settings.version].attention_config:
        out += ["--attention-config", json.dumps(attention, sort_keys=True)]
    return out


def kernel_attention(settings: Any) -> dict:
    """The attention settings a plan asks for (empty: vLLM chooses)."""
    out: dict = {}
    if settings.attention_backend:
        out["backend"] = settings.attention_backend
    if settings.flash_attn_version:
        out["flash_attn_version"] = settings.flash_attn_version
    return out


def kernel_env(settings: Any) -> dict:
    """The attention settings as environment variables, for a version without --attention-config (0.11.0)."""
    if settings is None or versions.VERSIONS[settings.version].attention_config:
        return {}
    attention = kernel_attention(settings)
    names = {"backend": "VLLM_ATTENTION_BACKEND", "flash_attn_version": "VLLM_FLASH_ATTN_VERSION"}
    return {names[k]: str(v) for k, v in attention.items()}


def kernel_record(settings: Any, extra_args: tuple | list = ()) -> dict:
    """What the manifest says the kernels were asked to do (what vLLM chose is `attention`, from its log): the plan's
    settings, and eager execution also where the configuration's own server.extra_args asks for it."""
    eager_from = "plan" if settings.enforce_eager else "configuration" if "--enforce-eager" in extra_args else None
    return {
        "attention_backend": settings.attention_backend or None,
        "flash_attn_version": settings.flash_attn_version or None,
        "enforce_eager": eager_from is not None,
        "enforce_eager_from": eager_from,
        "batch_invariant": settings.batch_invariant,
        "how": "--attention-config" if versions.VERSIONS[settings.version].attention_config else "environment",
    }


def kernel_problems(settings: Any) -> list[str]:
    """What is wrong with a plan's kernel settings, one line each (a name vLLM does not know is vLLM's to refuse)."""
    out = []
    if settings.attention_backend and not BACKEND_NAME.fullmatch(settings.attention_backend):
        out.append(
            f"attention_backend = {settings.attention_backend!r}: a vLLM attention backend's registry name "
            "(upper case, e.g. FLASH_ATTN, TRITON_ATTN, FLEX_ATTENTION), or empty for vLLM's own choice"
        )
    if settings.flash_attn_version not in (0, 2, 3):
        out.append(f"flash_attn_version = {settings.flash_attn_version}: 2 or 3 (0: vLLM's own choice)")
    elif settings.flash_attn_version and settings.attention_backend not in ("", "FLASH_ATTN"):
        out.append(
            f"flash_attn_version = {settings.flash_attn_version} applies to FLASH_ATTN only, not "
            f"{settings.attention_backend}"
        )
    return out
