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
import sys
import tarfile
import time
from pathlib import Path

from artifact.config import REPO
from artifact.engines.builds import ImageSpec
from artifact.errors import ArtifactError
from artifact import engines

# Never in an image's build context: environments (.venv-cuda, --native's; and each engine's own, `host_folders`, e.g.
# an ~8 GB one), results, weights and models, tests. Top-level folders only (the package has its own
# artifact/models/), caches at any depth.
EXCLUDE_TOP = {
    ".git",
    ".venv",
    ".venv-cuda",
    "results",
    "weights",
    "models",
    "build",
    ".whl",
    ".gl",
    "tests",
    "bench",
    ".ci",
    ".device",
    "node_modules",
}
EXCLUDE_DIRS = {"__pycache__", ".pytest_cache"}
BUILD_INPUTS = "docker/build-inputs"


def excluded_top() -> set[str]:
    """EXCLUDE_TOP and the repository folders of the engines' own set-ups (`Builds.host_folders`)."""
    facets = [engines.get(kind).builds for kind in engines.REGISTRY]
    return EXCLUDE_TOP | {f for b in facets if b is not None for f in b.host_folders}


def context_files(root: Path = REPO) -> list[Path]:
    out = []
    exclude = excluded_top()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        top = exclude if rel_dir == Path(".") else set()
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in EXCLUDE_DIRS and d not in top and (rel_dir / d).as_posix() not in (f"{BUILD_INPUTS}/cache",)
        )
        for name in sorted(filenames):
            rel = rel_dir / name
            # GGUF files stay out (weights, derived models), except the package's own committed data (the agent
            # model's 4.9 MB LoRA under artifact/models/recipes/, which every derived model starts from)
            gguf = name.endswith(".gguf") and rel.parts[0] != "artifact"
            if name.endswith((".pyc", ".whl")) or gguf or rel.as_posix() == f"{BUILD_INPUTS}/ca.crt":
                continue
            out.append(rel)
    return out


def build_context(ca_bundle: Path | None = None, extra: list[tuple[str, Path]] = ()) -> tuple[bytes, str]:
    """(tar of the build context, its content hash). Deterministic: sorted, mtimes and owners zeroed. `extra`: host
    files the engine's image adds under docker/build-inputs/ (ImageSpec.extra_context: e.g. a wheel cache)."""
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
        for arcname, path in extra:
            add(f"{BUILD_INPUTS}/{arcname}", path)
    return buf.getvalue(), h.hexdigest()


def ensure_image(
    client,
    spec: ImageSpec,
    log_dir: Path,
    ca_bundle: Path | None = None,
    rebuild: bool = False,
    say=lambda m: print(m, file=sys.stderr, flush=True),
):
    """The image for `spec`: reused when its tag exists, else built (Docker's layer cache makes a rebuild after a
    code change take seconds). Returns the SDK Image; build failures are one line plus the log's path."""
    import docker

    context, digest = build_context(ca_bundle, spec.extra_context() if spec.extra_context else [])
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
            for chunk in client.api.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                tag=tag,
                rm=True,
                dockerfile=spec.dockerfile,
                buildargs=spec.buildargs,
                decode=True,
                forcerm=True,
            ):
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
    return {
        "id": image.id,
        "tags": image.tags,
        "size_bytes": image.attrs.get("Size"),
        "llama_build_info": labels.get("artifact.llama_build_info"),
        "labels": json.loads(json.dumps(labels)),
    }
