"""What `./run.sh all` asks of an engine kind, through the engine registry: the image that serves it, whether this
version can run it (in a container, or natively here), and what it builds on the host for `--native`. Each engine
declares these itself (`artifact.engines.base.Engine`: `image`, `container_unavailable`, `native_unavailable`,
`native_build`); the orchestrator never branches on engine names."""

from __future__ import annotations

from artifact import engines as registry
from artifact.engines.base import ImageSpec


def image_spec(kind: str, args) -> ImageSpec | None:
    """The image that serves engine `kind` (None: no image for it in this version)."""
    engine = registry.find(kind)
    return engine.image(args) if engine else None


def unavailable(job, where: str = "container", gpu: bool = True) -> str | None:
    """None if this version can run `job`'s engine `where` ("container" or "native"), else why not (one line)."""
    engine = registry.find(job.engine)
    if engine is None:
        return f"the {job.engine} engine adapter is not part of this version of the artifact"
    return engine.container_unavailable() if where == "container" else engine.native_unavailable(job.cfg, gpu)


def native_builds() -> dict:
    """engine kind -> what `all --native` builds for it before any job (`Engine.native_build`), registry order."""
    out = {}
    for kind in registry.REGISTRY:
        build = registry.get(kind).native_build()
        if build is not None:
            out[kind] = build
    return out


def plan_native_builds(args) -> tuple[dict, list[str]]:
    """(engine kind -> the label its jobs will report, the dry run's lines), building nothing."""
    labels, lines = {}, []
    for kind, build in native_builds().items():
        labels[kind], more = build.plan(args)
        lines += more
    return labels, lines


def ensure_native_builds(args) -> dict:
    """Build (or find) what each engine needs natively; engine kind -> the label every manifest must read."""
    return {kind: build.ensure(args) for kind, build in native_builds().items()}
