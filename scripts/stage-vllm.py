#!/usr/bin/env python3
"""Stage vLLM 0.25.0 for a GPU host without internet (scripts/vllm-gpu.sh; docs/gpu-hosts.md): the vLLM wheel and
exactly the requirements the host's Python lacks (scripts/vllm-device-wheels.txt, each pinned by its sha256),
repacked into one xz stream and split into parts that fit a transfer limit (--limit-mib) beside the repository.

    scripts/stage-vllm.py [--out .device/vllm] [--limit-mib MIB] [--after .device/STAGE.json] [--preset 6]

Everything comes from PyPI (`pip download --no-deps --require-hashes`). Wheels are zip files of deflate members;
xz over their members is ~30% smaller (the vLLM wheel: 250.1 MB as published, 178.7 MB as xz), which saves whole
calls. Nothing is changed: `scripts/vllm-gpu.sh unpack` joins the parts, checks the stream's sha256, rebuilds every
wheel from its members and checks each member against the wheel's own RECORD (sha256 of every file) before
`pip install --no-index --no-deps --target` installs them.

OUT/STAGE.json records every part (sha256, bytes, the call that carries it), the stream's sha256, each wheel's PyPI
sha256 and the install command. Where transfers to the host are limited, one transfer carries at most --limit-mib including the
repository's own files; the parts go into OUT/call1, OUT/call2, ... (carry one per transfer, in order).

A piece beside scripts/stage-device.py (llama.cpp's sdist, the protocol's wheels, the base model), not a copy of it:
with --after (that script's STAGE.json) the first part is sized to the room its last call leaves, and that call
carries both folders.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "scripts" / "vllm-device-wheels.txt"
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    a
    for tag in (
        "manylinux_2_28_x86_64",
        "manylinux_2_27_x86_64",
        "manylinux_2_26_x86_64",
        "manylinux_2_24_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux_2_12_x86_64",
        "manylinux2010_x86_64",
        "manylinux_2_5_x86_64",
        "manylinux1_x86_64",
        "manylinux_2_31_x86_64",
        "manylinux_2_34_x86_64",
        "any",
    )
    for a in ("--platform", tag)
]
STREAM = "vllm-wheels.tar.xz"
INSTALL = "python3 -m pip install -q --no-index --no-deps --no-compile --target $W/vllm-site $W/vwheels/*.whl"
MIB = 1 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(MIB):
            h.update(block)
    return h.hexdigest()


def pins() -> dict[str, str]:
    """File name -> sha256, from the pinned list (`name==version --hash=sha256:H  # file name`)."""
    out = {}
    for line in WHEELS.read_text().splitlines():
        m = re.match(r"^\S+==\S+ --hash=sha256:([0-9a-f]{64})\s+#\s+(\S+\.whl)$", line.strip())
        if m:
            out[m.group(2)] = m.group(1)
        elif line.strip() and not line.lstrip().startswith("#"):
            raise SystemExit(f"error: {WHEELS.name}: cannot read line {line!r}")
    return out


def tree_bytes() -> int:
    """What every call carries besides the staged files: tracked files and untracked files git does not ignore."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    return sum((REPO / p).stat().st_size for p in out.decode().split("\0") if p and (REPO / p).is_file())


def download(dest: Path) -> list[Path]:
    want = pins()
    reqs = dest / "requirements.txt"
    reqs.write_text(
        "\n".join(line.split("#")[0].strip() for line in WHEELS.read_text().splitlines() if line.split("#")[0].strip())
        + "\n"
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--require-hashes",
            *PLATFORM,
            "-d",
            str(dest),
            "-r",
            str(reqs),
        ],
        check=True,
    )
    files = []
    for name, digest in want.items():
        path = dest / name
        if not path.is_file() or sha256(path) != digest:
            raise SystemExit(f"error: {name} missing or not the pinned file (sha256 {digest[:16]}...)")
        files.append(path)
    extra = sorted(p.name for p in dest.glob("*.whl") if p.name not in want)
    if extra:
        raise SystemExit(f"error: pip downloaded files the list does not pin: {', '.join(extra)}")
    return files


def repack(wheels: list[Path], out: Path, preset: int) -> list[dict]:
    """One tar of every wheel's members (in the wheel's own order, with their permission bits), xz-compressed:
    fixed owners and times, so the same wheels give the same stream."""
    listing = []
    with (
        lzma.open(out, "wb", format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=preset) as xz,
        tarfile.open(fileobj=xz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                members = []
                for info in z.infolist():
                    if info.is_dir():
                        continue
                    data = z.read(info)
                    entry = tarfile.TarInfo(f"{wheel.name}/{info.filename}")
                    entry.size, entry.mtime, entry.mode = len(data), 0, (info.external_attr >> 16) & 0o777 or 0o644
                    tar.addfile(entry, io.BytesIO(data))
                    members.append(info.filename)
            listing.append(
                {"file": wheel.name, "sha256": sha256(wheel), "bytes": wheel.stat().st_size, "members": len(members)}
            )
            print(f"stage: {wheel.name} ({wheel.stat().st_size / MIB:.1f} MiB, {len(members)} files)", file=sys.stderr)
    return listing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / ".device" / "vllm")
    ap.add_argument(
        "--limit-mib",
        type=float,
        default=0,
        help="what one transfer to the host carries, the repository included; default 0: no limit, one part",
    )
    ap.add_argument("--after", type=Path, help="scripts/stage-device.py's STAGE.json: fill its last call first")
    ap.add_argument("--preset", type=int, default=6, help="xz preset (0-9)")
    args = ap.parse_args()
    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    tree = tree_bytes()
    # 1 MiB for what the command writes beside; no limit: one part
    room = int(args.limit_mib * MIB) - tree - MIB if args.limit_mib > 0 else 1 << 50
    first = room
    after = None
    if args.after:
        stage = json.loads(args.after.read_text())
        last = stage["calls"][-1]
        first = room - int(last["mib"] * MIB)
        # stage-device.py names each call by its folder beside its STAGE.json
        after = last.get("carry") or str((args.after.resolve().parent / last["dir"]).relative_to(REPO))
    if room < 8 * MIB:
        raise SystemExit(f"error: the repository ({tree / MIB:.1f} MiB) leaves no room under {args.limit_mib} MiB")
    with tempfile.TemporaryDirectory(prefix="stage-vllm-") as tmp:
        work = Path(tmp)
        (work / "dl").mkdir()
        wheels = download(work / "dl")
        stream = work / STREAM
        listing = repack(wheels, stream, args.preset)
        data_bytes, digest = stream.stat().st_size, sha256(stream)
        calls, offset, part = [], 0, 0
        with open(stream, "rb") as fh:
            while offset < data_bytes:
                size = first if part == 0 and first > 4 * MIB else room
                if part == 0 and first <= 4 * MIB:
                    after = None  # the last call of the other staging has no room left: start a call of our own
                chunk = fh.read(size)
                part += 1
                d = out / f"call{len(calls) + 1}"
                d.mkdir(parents=True)
                p = d / f"{STREAM}.part{part:03d}"
                p.write_bytes(chunk)
                offset += len(chunk)
                calls.append(
                    {
                        "carry": str(d.relative_to(REPO)) if d.is_relative_to(REPO) else str(d),
                        "with": after if part == 1 else None,
                        "files": [{"path": p.name, "bytes": len(chunk), "sha256": sha256(p)}],
                        "mib": round(len(chunk) / MIB, 2),
                    }
                )
    record = {
        "limit_mib": args.limit_mib,
        "tree_mib": round(tree / MIB, 2),
        "preset": args.preset,
        "stream": {"file": STREAM, "bytes": data_bytes, "sha256": digest, "parts": part},
        "wheels": listing,
        "wheels_bytes": sum(w["bytes"] for w in listing),
        "install": INSTALL,
        "calls": calls,
    }
    (out / "STAGE.json").write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"stage: {len(listing)} wheels, {record['wheels_bytes'] / MIB:.1f} MiB as published, "
        f"{data_bytes / MIB:.1f} MiB as one xz stream in {part} part(s)",
        file=sys.stderr,
    )
    for c in calls:
        beside = f" together with {c['with']}" if c["with"] else ""
        print(f"{c['carry']}: {c['mib']} MiB (+ the repository, {record['tree_mib']} MiB){beside}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
