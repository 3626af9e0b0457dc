"""vLLM's build facet: the image that serves it (Dockerfile.vllm), or natively a vLLM the user installed."""

from __future__ import annotations

from artifact.config import Config
from artifact.engines.builds import BuildOptions, Builds, ImageSpec
from artifact.engines.vllm import env as vllm_env
from artifact.engines.vllm import versions
from artifact.errors import ArtifactError


class VllmBuilds(Builds):
    host_folders = (".venv-vllm",)  # scripts/setup-vllm.sh's environment (~8 GB), never in an image's context

    def image(self, opts: BuildOptions) -> ImageSpec:
        """Dockerfile.vllm: the paper's vLLM 0.11.0 (the Dockerfile checks the same pin; requirements-vllm.lock for
        the CPU build)."""
        return ImageSpec(
            self.engine.kind,
            "Dockerfile.vllm",
            "prefix-cache-artifact/vllm",
            f"v{versions.DEFAULT}",
            {},
            None,
            shm_size="8g",
        )

    def native_unavailable(self, cfg: Config, gpu: bool) -> str | None:
        """A vLLM the user installed, at the version the configuration is written for (versions.DEFAULT unless its
        [engine.settings] version says otherwise), and for a GPU run its CUDA build."""
        why = self.container_unavailable()
        if why:
            return why
        want = self.engine.settings(cfg).version
        try:
            exe = vllm_env.resolve_executable(cfg.engine.binary)
            info = vllm_env.probe(str(exe))
        except ArtifactError as exc:
            return f"no usable vLLM ({exc}); install vLLM {want} and point ARTIFACT_VLLM_VENV at its prefix"
        if versions.mismatch(info.get("vllm"), want):
            return f"{exe} is vLLM {info.get('vllm')}, the configuration is written for {want}"
        if gpu and info.get("build") != "cuda":
            return f"{exe} is vLLM {info.get('vllm')}'s {info.get('build')} build, not a CUDA build that sees a GPU"
        return None
