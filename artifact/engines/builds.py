"""The build facet of an engine: what `./run.sh all` builds or finds to serve it, in a container or natively.

An engine whose servers `./run.sh all` can start opts in (`Engine.Builds`, a `Builds` subclass): the image that serves
it (`image`), whether this version can run a configuration of it in that image or natively here, what it builds on
the host before any `--native` job (`native`), where its build keeps the tools a derived model's recipe runs, and
the repository folders its own set-up makes. An engine without it (the endpoint engine: servers the user runs) is
run by `./run.sh run CONFIG`, never by `all`.

`./run.sh all`'s options reach an engine only as `BuildOptions` (typed: the orchestrator makes it from its command
line, artifact.orchestrate.engine_kinds.build_options); nothing below the orchestrator sees its argparse namespace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from artifact.config import REPO, Config
from artifact.engines.capabilities import EngineFacts

# The GPUs the artifact's CUDA builds target by default (CMAKE_CUDA_ARCHITECTURES): sm_89 + sm_90 native, sm_90 PTX
DEFAULT_CUDA_ARCHS = "89-real;90-real;90-virtual"


@dataclass(frozen=True)
class BuildOptions:
    """What `./run.sh all` asks of the engines' builds (its options of the same names)."""

    cpu: bool = False  # the CPU variant: no CUDA
    base_image: str | None = None  # base of the images' build and runtime stages (None: each Dockerfile's default)
    cuda_archs: str = DEFAULT_CUDA_ARCHS  # CMAKE_CUDA_ARCHITECTURES of the CUDA images and native builds
    llama_source: str | None = None  # a llama.cpp checkout (or sdist) the native build compiles instead of the pin
    llama_build: str = "b10434"  # the pinned llama.cpp the native build makes: b10434 (the paper's) or b10435
    no_build: bool = False  # natively: build nothing, use what is installed


@dataclass(frozen=True)
class ImageSpec:
    """The container image `./run.sh all` builds (or reuses) to serve an engine, as the engine declares it."""

    engine: str  # the configurations' engine.kind it serves
    dockerfile: str
    repository: str
    pin_tag: str
    buildargs: dict[str, Any] = field(default_factory=dict)
    expect_build_info: str | None = None  # what every manifest's engine_build must read
    shm_size: str | None = None
    # host files added to the build context: () -> [(path inside the context, host file)], e.g. a wheel cache
    extra_context: Any = field(default=None, compare=False)

    def tag(self, context_hash: str) -> str:
        return f"{self.repository}:{self.pin_tag}-{context_hash[:12]}"


def native_venv() -> Path:
    """The environment `./run.sh all --native` builds into and runs its jobs from (run.sh passes the same)."""
    return Path(os.environ.get("ARTIFACT_NATIVE_VENV") or REPO / ".venv-cuda")


class NativeBuild(Protocol):
    """What `./run.sh all --native` (and --slurm's native tasks) builds on the host for an engine before any job
    starts, and the label every manifest of its jobs must then read (`engine_build`)."""

    def plan(self, opts: BuildOptions) -> tuple[str | None, list[str]]:
        """(the label its jobs will report, the dry run's lines about it), without building anything."""
        ...

    def ensure(self, opts: BuildOptions) -> str | None:
        """Build (or find) it; returns the label every manifest of the engine's jobs must read."""
        ...


class Builds:
    """The default build facet; an engine subclasses it (`Engine.Builds`) for its image and native build."""

    host_folders: tuple[str, ...] = ()  # repository folders its own set-up makes, never in an image's build context

    def __init__(self, engine: EngineFacts):
        self.engine = engine

    def image(self, opts: BuildOptions) -> ImageSpec | None:
        """The image that serves it under `./run.sh all`'s options; None: none."""
        return None

    def container_unavailable(self) -> str | None:
        """None if this version can run it in its image, else why not (one line)."""
        image = self.engine.capabilities.image
        if not image or not (REPO / image).is_file():
            return f"engine {self.engine.kind} declares no image this version can build ({image or 'none'})"
        return None

    def native_unavailable(self, cfg: Config, gpu: bool) -> str | None:
        """None if this version can run configuration `cfg` natively here (on a GPU if `gpu`), else why not."""
        return None

    def native(self) -> NativeBuild | None:
        """What `all --native` builds for it on the host before any job (None: nothing, it runs what is installed)."""
        return None

    def tools_dir(self) -> Path | None:
        """Where its build keeps the tools a derived model's recipe runs (artifact.models.derive); None: none."""
        return None
