"""What `./run.sh all` asks of an engine kind, through the engine registry: the image that serves it, whether this
version can run it (in a container, or natively here), and what it builds on the host for `--native`. Each engine
declares these in its build facet (`artifact.engines.builds.Builds`: `image`, `container_unavailable`,
`native_unavailable`, `native`); an engine without one is not run by `all`. The orchestrator never branches on
engine names, and the engines see `./run.sh all`'s options only as `BuildOptions`, never its argparse namespace."""

from __future__ import annotations

from typing import Any

from artifact import engines as registry
from artifact.engines.builds import DEFAULT_CUDA_ARCHS, BuildOptions, ImageSpec, NativeBuild


def build_options(args: Any) -> BuildOptions:
    """The engines' build options from `./run.sh all`'s namespace (or a Slurm task's recorded options)."""
    if isinstance(args, BuildOptions):
        return args
    return BuildOptions(
        cpu=bool(getattr(args, "cpu", False)),
        base_image=getattr(args, "base_image", None),
        cuda_archs=getattr(args, "cuda_archs", None) or DEFAULT_CUDA_ARCHS,
        llama_source=getattr(args, "llama_source", None),
        llama_build=getattr(args, "llama_build", None) or "b10434",
        no_build=bool(getattr(args, "no_build", False)),
    )


def image_spec(kind: str, args: Any) -> ImageSpec | None:
    """The image that serves engine `kind` (None: no image for it in this version)."""
    engine = registry.find(kind)
    builds = engine.builds if engine is not None else None
    return builds.image(build_options(args)) if builds is not None else None


def unavailable(job, where: str = "container", gpu: bool = True) -> str | None:
    """None if this version can run `job`'s engine `where` ("container" or "native"), else why not (one line)."""
    engine = registry.find(job.engine)
    if engine is None:
        return f"the {job.engine} engine adapter is not part of this version of the artifact"
    builds = engine.builds
    if builds is None:
        return (
            f"engine {engine.kind} talks to servers the user runs, which `./run.sh all` does not start: "
            "./run.sh run CONFIG (docs/own-server.md)"
        )
    return builds.container_unavailable() if where == "container" else builds.native_unavailable(job.cfg, gpu)


def native_builds() -> dict[str, NativeBuild]:
    """engine kind -> what `all --native` builds for it before any job (`Builds.native`), registry order."""
    out = {}
    for kind in registry.REGISTRY:
        builds = registry.get(kind).builds
        build = builds.native() if builds is not None else None
        if build is not None:
            out[kind] = build
    return out


def plan_native_builds(args: Any) -> tuple[dict, list[str]]:
    """(engine kind -> the label its jobs will report, the dry run's lines), building nothing."""
    opts = build_options(args)
    labels, lines = {}, []
    for kind, build in native_builds().items():
        labels[kind], more = build.plan(opts)
        lines += more
    return labels, lines


def ensure_native_builds(args: Any) -> dict:
    """Build (or find) what each engine needs natively; engine kind -> the label every manifest must read."""
    opts = build_options(args)
    return {kind: build.ensure(opts) for kind, build in native_builds().items()}
