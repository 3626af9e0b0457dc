#!/usr/bin/env bash
# vLLM 0.25.0 on one NVIDIA GPU without internet (docs/gpu-hosts.md, "vLLM on a GPU host"; docs/beyond-the-paper.md).
# The host first runs `./run.sh all --native --offline STAGE ...` once (scripts/stage-device.py's stage): that makes
# .venv-cuda, the protocol's environment with llama.cpp's CUDA build, whose tools derive the agent model. vLLM 0.25.0
# and the requirements the host's Python lacks are staged by scripts/stage-vllm.py into .device/vllm/call1, ... (one
# xz stream in parts; each transfer to the host carries the next part). WORK (required: a folder that outlives each phase)
# keeps the state between the phases; PYTHON (default .venv-cuda's) runs the protocol, VLLM_BASE_PYTHON (default python3: the host's Python
# with torch 2.11) runs vLLM.
#
#   scripts/vllm-gpu.sh unpack        the vLLM parts this transfer carried (sha256 against .device/vllm/STAGE.json);
#                                     with the last one the stream is joined and checked, every wheel rebuilt and
#                                     checked against its own RECORD, installed (pip --no-index --no-deps --target
#                                     WORK/vllm-site) and WORK/vllm-venv made (its vllm sees vllm-site first, then
#                                     VLLM_BASE_PYTHON's packages)
#   scripts/vllm-gpu.sh check         the installed vLLM: version, CUDA, the probe, a Triton kernel, and the serve flags
#                                     the adapter gives each configuration, parsed by vLLM's own parser
#   scripts/vllm-gpu.sh start JOB...  in the background: the agent model's F16 derived (pinned), converted for vLLM
#                                     (pinned, artifact/engines/vllm/conversions.json), then every JOB at once, each
#                                     with a compile cache of its own
#   scripts/vllm-gpu.sh wait [S]      follow the pipeline for up to S seconds (default 540); exit 0 when done
#   scripts/vllm-gpu.sh collect DIR   records (server logs included), the pipeline's logs and the environment into DIR
#
# JOB: PRECISION-PLAN, PRECISION fp16 or bf16 (configs/h200-vllm/h200-vllm-agent-PRECISION.toml), PLAN one of
# configs/plans.toml (main, bi, bi-salt, salt; the kernel plans bi-fa2, bi-triton, bi-flex, bi-eager, eager), e.g.
# fp16-main bf16-main bf16-bi bf16-bi-salt bf16-salt, or bf16-main bf16-bi bf16-bi-fa2 bf16-bi-triton bf16-bi-eager.
# Every protocol run goes through the same isolation as ./run.sh (scripts/isolate.sh: an empty environment plus an
# allowlist, a loopback-only network namespace).
set -euo pipefail
W=${WORK:?set WORK to a folder that outlives each phase: it keeps the state between them}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv-cuda/bin/python}
BASE=${VLLM_BASE_PYTHON:-python3}
mkdir -p "$W/logs" "$W/vstage" "$W/home"

isolated() {  # isolated LOG CACHE CMD...: a protocol process with a clean environment
  local log=$1 cache=$2
  shift 2
  env -i PATH="$PATH" HOME="$W/home" LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONPATH="$W/repo" \
    ARTIFACT_VLLM_VENV="$W/vllm-venv" ARTIFACT_CACHE="$cache" ${LD_LIBRARY_PATH:+LD_LIBRARY_PATH="$LD_LIBRARY_PATH"} \
    "$W/repo/scripts/isolate.sh" "$@" >"$log" 2>&1
}

phase_unpack() {
  [ -f .device/vllm/STAGE.json ] || { echo "unpack: no vLLM parts in this call"; return 0; }
  cp .device/vllm/STAGE.json "$W/vstage/"
  local d
  for d in .device/vllm/call*/; do cp -r "$d"/. "$W/vstage/"; done
  "$BASE" - "$W" <<'PY'
import base64, csv, hashlib, io, json, lzma, sys, tarfile, zipfile
from pathlib import Path
W = Path(sys.argv[1]); stage = W / "vstage"; rec = json.loads((stage / "STAGE.json").read_text())
def digest(p):
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while b := fh.read(1 << 20): h.update(b)
    return h.hexdigest()
parts = [f for c in rec["calls"] for f in c["files"]]
have = 0
for f in parts:
    p = stage / f["path"]
    if p.exists():
        if digest(p) != f["sha256"]:
            sys.exit(f"error: {p} sha256 {digest(p)[:16]} != staged {f['sha256'][:16]}")
        have += 1
print(f"unpack: vLLM parts verified: {have}/{len(parts)}")
if have < len(parts) or (W / "vwheels.done").exists():
    sys.exit(0)
stream = stage / rec["stream"]["file"]
with open(stream, "wb") as out:
    for f in parts:
        out.write((stage / f["path"]).read_bytes())
if digest(stream) != rec["stream"]["sha256"]:
    sys.exit("error: the joined vLLM stream does not have the staged sha256")
dest = W / "vwheels"; dest.mkdir(exist_ok=True)
zips, members = {}, {}
with lzma.open(stream) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
    for entry in tar:
        wheel, name = entry.name.split("/", 1)
        if wheel not in zips:
            zips[wheel] = zipfile.ZipFile(dest / wheel, "w", zipfile.ZIP_STORED)
        data = tar.extractfile(entry).read()
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | entry.mode) << 16
        zips[wheel].writestr(info, data)
        members.setdefault(wheel, {})[name] = data
for z in zips.values():
    z.close()
for w in rec["wheels"]:  # every file of every wheel, against the wheel's own RECORD (sha256 of each file)
    files = members[w["file"]]
    record = next(n for n in files if n.endswith(".dist-info/RECORD"))
    listed = {row[0]: row[1] for row in csv.reader(io.StringIO(files[record].decode())) if row}
    if set(listed) != set(files):
        sys.exit(f"error: {w['file']}: the files differ from its RECORD")
    for name, h in listed.items():
        if h:
            algo, want = h.split("=", 1)
            got = base64.urlsafe_b64encode(hashlib.new(algo, files[name]).digest()).rstrip(b"=").decode()
            if got != want:
                sys.exit(f"error: {w['file']}: {name} does not match its RECORD")
(W / "vwheels.done").write_text("\n".join(sorted(zips)) + "\n")
print(f"unpack: {len(zips)} wheels rebuilt, every file matches its wheel's RECORD")
PY
  if [ -f "$W/vwheels.done" ] && [ ! -f "$W/vllm-venv/bin/vllm" ]; then
    local t0=$SECONDS site
    "$BASE" -m pip install -q --no-index --no-deps --no-compile --target "$W/vllm-site" "$W"/vwheels/*.whl
    "$BASE" -m venv --without-pip "$W/vllm-venv"
    site=$("$W/vllm-venv/bin/python3" -c "import site; print(site.getsitepackages()[0])")
    echo "import site; site.addsitedir('$W/vllm-site')" >"$site/00-vllm-site.pth"
    echo "import site; site.addsitedir('$("$BASE" -c "import site; print(site.getsitepackages()[0])")')" >"$site/01-machine.pth"
    # the __main__ guard: vLLM starts its engine core with multiprocessing's spawn, which re-imports this script
    printf '#!%s\nimport sys\nfrom vllm.entrypoints.cli.main import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
      "$W/vllm-venv/bin/python3" >"$W/vllm-venv/bin/vllm"
    chmod +x "$W/vllm-venv/bin/vllm"
    echo "unpack: vLLM installed into $W/vllm-site, environment $W/vllm-venv ($((SECONDS - t0)) s)"
  fi
}

copy_repo() {
  rm -rf "$W/repo" && mkdir -p "$W/repo" && (cd "$REPO" && tar --exclude=./.device --exclude=./.git --exclude=./models --exclude=./results \
    --exclude='./.venv*' -cf - .) | tar -C "$W/repo" -xf -
  mkdir -p "$REPO/models" && ln -sfn "$REPO/models" "$W/repo/models"  # the derived models ./run.sh all --native made
}

phase_check() {
  [ -d "$W/repo" ] || copy_repo
  "$W/vllm-venv/bin/python3" -c "import torch, vllm; print('check: vllm', vllm.__version__, 'torch', torch.__version__, \
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
  "$W/vllm-venv/bin/python3" "$W/repo/artifact/engines/vllm/probe.py" | tee "$W/probe.json"
  # torch.compile and vLLM's kernels are Triton's, compiled at start with the host's C compiler and Python headers
  (cd "$W" && TRITON_CACHE_DIR="$W/triton-check" "$W/vllm-venv/bin/python3" - <<'PY'
import torch, triton, triton.language as tl

@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)

a = torch.arange(1000, device="cuda", dtype=torch.float32)
out = torch.empty_like(a)
add[(4,)](a, a, out, 1000, BLOCK=256)
assert torch.equal(out, 2 * a), "triton kernel gave a wrong result"
print("check: a Triton kernel compiled and ran (triton", triton.__version__ + ")")
PY
  )
  (cd "$W/repo" && "$PY" - "$W/vllm-venv/bin/python3" <<'PY'
import json, subprocess, sys
from artifact.catalog import load_plans
from artifact.config import read_config
from artifact.engines import get
from artifact.engines.vllm.adapter import ARM_FLAGS, serve_args
vllm = get("vllm")
plans = [p for p in load_plans().values() if p.name == "main" or vllm.settings_key in p.engine_settings]
for name in ("h200-vllm/h200-vllm-agent-fp16", "h200-vllm/h200-vllm-agent-bf16"):
    cfg = read_config(name)
    for plan in plans:  # every plan's kernel flags (attention config, eager) too, parsed by vLLM's own parser
        settings = vllm.settings(cfg, plan)
        for flag in ARM_FLAGS.values():
            args = serve_args(cfg, "MODEL", "1", flag, settings)
            r = subprocess.run([sys.argv[1], "artifact/engines/vllm/flags.py", *args], capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"check: {name} {plan.name} {flag}: vLLM refuses the adapter's flags: {r.stderr.strip()[-400:]}")
            print(f"check: {name} {plan.name} {flag}: {r.stdout.strip().splitlines()[-1]}")
PY
  )
}

pipeline() {  # the background part of `start`
  set -e
  local t0=$SECONDS j
  echo "[$((SECONDS - t0)) s] deriving the agent model's F16 (pinned)"
  (cd "$W/repo" && "$PY" -m artifact models derive F16) >"$W/logs/derive.log" 2>&1 || { cat "$W/logs/derive.log"; exit 1; }
  tail -2 "$W/logs/derive.log"
  echo "[$((SECONDS - t0)) s] converting it for vLLM (pinned)"
  if ! (cd "$W/repo" && isolated "$W/logs/convert.log" "$W/cache" "$PY" -m artifact.engines.vllm.convert \
       configs/h200-vllm/h200-vllm-agent-fp16.toml); then
    cat "$W/logs/convert.log"
    # Not the pinned bytes (another converter than the pin's, or another result): keep the evidence (the
    # .mismatch folder's record goes into collect's logs), record this machine's conversion as a pin of its own
    # converter (collect brings conversions.json back) and go on; the manifests name the conversion they served.
    grep -q "differs from its pin\|has weights" "$W/logs/convert.log" || exit 1
    echo "PIN MISMATCH: the conversion is not the pinned one; pinning this machine's (see conversions.json)"
    (cd "$W/repo" && isolated "$W/logs/convert-pin.log" "$W/cache" "$PY" -m artifact.engines.vllm.convert --pin \
       configs/h200-vllm/h200-vllm-agent-fp16.toml) || { cat "$W/logs/convert-pin.log"; exit 1; }
    cat "$W/logs/convert-pin.log"
  fi
  tail -3 "$W/logs/convert.log"
  for j in "$@"; do  # every job at once, each with a compile cache of its own (the converted model hard-linked in)
    local cache=$W/cache-$j
    mkdir -p "$cache/vllm"
    [ -d "$cache/vllm/models" ] || cp -al "$W/cache/vllm/models" "$cache/vllm/"
    (rc=0
     echo "[$((SECONDS - t0)) s] $j: starting"
     cd "$W/repo" && isolated "$W/logs/$j.log" "$cache" "$PY" -m artifact run "configs/h200-vllm/h200-vllm-agent-${j%%-*}.toml" \
       --plan "${j#*-}" --results "$W/results" || rc=$?
     echo $rc >"$W/logs/$j.rc"; echo "[$((SECONDS - t0)) s] $j: exit $rc") &
  done
  wait
  echo "[$((SECONDS - t0)) s] done"
}

phase_start() {
  [ -f "$W/vllm-venv/bin/vllm" ] || { echo "error: vLLM is not installed yet (unpack the last part first)"; exit 2; }
  [ -x "$PY" ] || { echo "error: no protocol environment at $PY: run ./run.sh all --native --offline STAGE first (or set PYTHON)"; exit 2; }
  copy_repo
  echo "$*" >"$W/jobs"
  (cd "$W" && setsid nohup bash -c "$(declare -f isolated pipeline); W=$W PY=$PY; \
     (pipeline $*); echo \$? >$W/pipeline.rc" </dev/null >"$W/logs/pipeline.log" 2>&1 &)
  echo "pipeline started: $*"
}

phase_wait() {
  local deadline=$((SECONDS + ${1:-540})) j
  while [ ! -f "$W/pipeline.rc" ] && [ $SECONDS -lt "$deadline" ]; do sleep 10; done
  echo "== pipeline"; tail -15 "$W/logs/pipeline.log" 2>/dev/null || true
  for j in $(cat "$W/jobs" 2>/dev/null); do
    [ -f "$W/logs/$j.log" ] && echo "$j: $(grep -E '^\s+\[(on|off)' "$W/logs/$j.log" | tail -1 | cut -c1-120)"
  done
  [ -f "$W/pipeline.rc" ] || { echo "still running"; exit 3; }
  echo "pipeline exit $(cat "$W/pipeline.rc")"
}

phase_collect() {
  local out=${1:?usage: collect DIR (the folder to pack into)}
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv >"$out/gpu.csv" 2>&1 || true
  "$W/vllm-venv/bin/python3" -m pip list --format=freeze >"$W/vllm-pip-freeze.txt" 2>/dev/null \
    || "$PY" -m pip list --path "$W/vllm-site" --format=freeze >"$W/vllm-pip-freeze.txt" 2>/dev/null || true
  [ -d "$W/results" ] && (cd "$W" && tar -cJf "$out/records-vllm.tar.xz" --exclude="*.decoded.msgpack" results)
  cp "$W/repo/artifact/engines/vllm/conversions.json" "$W/conversions.json" 2>/dev/null || true
  (cd "$W" && tar -czf "$out/logs-vllm.tar.gz" logs jobs probe.json vllm-pip-freeze.txt vstage/STAGE.json \
     conversions.json $(ls -d cache/vllm/models/*/conversion.json 2>/dev/null)) || true
  ls -la "$out"
}

case "${1:-}" in
  unpack) phase_unpack ;;
  check) phase_check ;;
  start) shift; phase_start "$@" ;;
  wait) shift; phase_wait "${1:-540}" ;;
  collect) phase_collect "${2:-}" ;;
  *) echo "usage: scripts/vllm-gpu.sh unpack|check|start JOB...|wait [S]|collect DIR" >&2; exit 2 ;;
esac
