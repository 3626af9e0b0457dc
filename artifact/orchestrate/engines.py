"""What `./run.sh all` needs to know of an engine kind, in one place: the image that serves it and whether this
version can run it, in a container or natively. One table (`ENGINES`) behind two functions (`image_spec`,
`unavailable`), so that the engine registry (engines with declared capabilities) can stand in for the table; the
orchestrator itself never branches on engine names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from artifact.config import REPO
from artifact.orchestrate import images

VLLM_PIN = "0.11.0"  # the paper's vLLM (Dockerfile.vllm checks the same; requirements-vllm.lock for the CPU build)


@dataclass(frozen=True)
class EngineSupport:
    image: Callable  # (args) -> images.ImageSpec
    in_container: Callable  # () -> None, or why this version cannot run it in its image
    native: Callable  # (job, gpu: bool) -> None, or why it cannot run natively here


def _llama_image(args) -> images.ImageSpec:
    return images.llamacpp_spec(cpu=getattr(args, "cpu", False), base=getattr(args, "base_image", None),
                                cuda_archs=getattr(args, "cuda_archs", images.DEFAULT_CUDA_ARCHS))


def _always(*_args) -> None:
    return None  # llama.cpp: natively, `all --native` builds the llama-server every job uses before any job starts


def _in_container(kind: str) -> Callable:
    """None if engine `kind` is registered and declares an image whose Dockerfile is here, else why not."""
    def check() -> str | None:
        from artifact import engines as registry

        if kind not in registry.REGISTRY:
            return f"the {kind} engine adapter is not part of this version of the artifact"
        image = registry.get(kind).capabilities.image
        if not image or not (REPO / image).is_file():
            return f"engine {kind} declares no image this version can build ({image or 'none'})"
        return None
    return check


_vllm_in_container = _in_container("vllm")


def _vllm_native(job, gpu: bool) -> str | None:
    """A vLLM the user installed, at the version the configuration is written for (VLLM_PIN unless its
    [engine.settings] version says otherwise: artifact/engines/vllm/versions.py), and for a GPU run its CUDA build."""
    from artifact.engines import vllm as vllm_engine
    from artifact.engines.vllm import env as vllm_env, versions
    from artifact.errors import ArtifactError

    why = _vllm_in_container()
    if why:
        return why
    want = vllm_engine.ENGINE.settings(job.cfg).version
    try:
        exe = vllm_env.resolve_executable(job.cfg.engine.binary)
        info = vllm_env.probe(str(exe))
    except ArtifactError as exc:
        return f"no usable vLLM ({exc}); install vLLM {want} and point ARTIFACT_VLLM_VENV at its prefix"
    if versions.mismatch(info.get("vllm"), want):
        return f"{exe} is vLLM {info.get('vllm')}, the configuration is written for {want}"
    if gpu and info.get("build") != "cuda":
        return f"{exe} is vLLM {info.get('vllm')}'s {info.get('build')} build, not a CUDA build that sees a GPU"
    return None


ENGINES = {
    "llama.cpp": EngineSupport(_llama_image, _in_container("llama.cpp"), _always),
    "vllm": EngineSupport(lambda args: images.vllm_spec(), _vllm_in_container, _vllm_native),
}


def image_spec(kind: str, args) -> images.ImageSpec | None:
    """The image that serves engine `kind` (None: no image for it in this version)."""
    support = ENGINES.get(kind)
    return support.image(args) if support else None


def unavailable(job, where: str = "container", gpu: bool = True) -> str | None:
    """None if this version can run `job`'s engine `where` ("container" or "native"), else why not (one line)."""
    support = ENGINES.get(job.engine)
    if support is None:
        return f"the {job.engine} engine adapter is not part of this version of the artifact"
    return support.in_container() if where == "container" else support.native(job, gpu)
