"""Offline staging: what a host without internet needs, fetched here from the package registries, cut to a transfer
limit, every file sha256-recorded; on the host, received, verified and joined.

Python's standard library only: the host side runs on the host's bare Python, before any environment exists.

A bundle is a list of `Item`s (a local file, the group it belongs to, where it came from). `stage()` writes them as
OUT/call1, OUT/call2, ... (each at most the limit together with what every transfer carries anyway, e.g. the
repository) with the staging manifest OUT/STAGE.json, a copy of which goes into every call directory. The items are
laid end to end in their given order and cut where a call is full, so the fewest calls carry them; a file split
across calls travels as parts. On the host, `receive()` copies one or more call directories into a stage directory,
checks each part's sha256, joins a file once all its parts are there and checks the joined file's sha256; `verify()`
says whether the stage is complete and fits this Python.

A received stage directory DEST:

    DEST/STAGE.json        the staging manifest (every file: group, bytes, sha256, source, parts)
    DEST/<group>/<name>    the joined files by group; group `pip` is pip's --find-links directory
    DEST/weights/<dir>/<f>  weights files, for $ARTIFACT_WEIGHTS/<dir>/<f> (`place_weights` puts them there)
    DEST/.parts/           parts waiting for the rest of their file

Other bundles (an engine's wheels, weights) reuse it: compose `Item`s (`pip_download` fetches pinned wheels for a
target Python and platform), call `stage()`, and on the host `python3 -m artifact.orchestrate.staging receive DEST
CALL_DIR...` then `verify DEST`.

    python3 -m artifact.orchestrate.staging receive DEST SRC...   SRC: call directories, or a staging output root
    python3 -m artifact.orchestrate.staging verify DEST [--repo DIR] [--quiet]

One module: both sides of a stage (made here, received and verified on the host) share its manifest and checks, and
the host runs it on its bare Python with nothing but the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

FORMAT = 1
MANIFEST = "STAGE.json"
PARTS = ".parts"
MIB = 1 << 20
# The platforms of an x86-64 Linux host with glibc >= 2.17; pip matches each manylinux tag exactly, so every one
# that a wheel may carry is named (e.g. a host with glibc 2.39).
MANYLINUX_X86_64 = tuple(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)) + (
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)


class StageError(Exception):
    """A one-line, actionable failure (the CLI prints `error: ...` and exits 2)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(MIB):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Target:
    """The Python and platform the staged wheels are for: this interpreter (`here`), or another one named by version
    and platform tags (pip download --python-version/--platform)."""

    python: str  # "3.12"
    platforms: tuple = ()  # () = this interpreter's own tags
    implementation: str = "cp"
    machine: str = ""

    @classmethod
    def here(cls) -> "Target":
        return cls(
            f"{sys.version_info[0]}.{sys.version_info[1]}",
            (),
            "cp" if sys.implementation.name == "cpython" else sys.implementation.name,
            platform.machine(),
        )

    @classmethod
    def preset(cls, name: str) -> "Target":
        if name == "here":
            return cls.here()
        if name in ("h200", "cp312-manylinux-x86_64"):
            return cls("3.12", MANYLINUX_X86_64, "cp", "x86_64")
        raise StageError(f"unknown target {name!r} (known: here, h200 = cp312-manylinux-x86_64)")

    @property
    def is_here(self) -> bool:
        return not self.platforms

    def pip_args(self) -> list[str]:
        if self.is_here:
            return []
        abi = f"{self.implementation}{self.python.replace('.', '')}"
        args = ["--python-version", self.python, "--implementation", self.implementation, "--abi", abi]
        for p in self.platforms:
            args += ["--platform", p]
        return args

    def record(self) -> dict:
        rec = {
            "python": self.python,
            "implementation": self.implementation,
            "machine": self.machine,
            "platforms": list(self.platforms) or "this interpreter's own tags",
        }
        if self.is_here:
            rec.update(
                interpreter=sys.version.split()[0],
                platform=sysconfig.get_platform(),
                libc=" ".join(platform.libc_ver()).strip() or None,
            )
        return rec

    def words(self) -> str:
        impl = "CPython" if self.implementation == "cp" else self.implementation
        where = "this interpreter's own tags" if self.is_here else f"{self.platforms[0]} ... {self.platforms[-1]}"
        return f"{impl} {self.python} {self.machine} ({where})"


def pip_download(
    requirements: list[str],
    dest: Path,
    target: Target,
    *,
    requirement_files: tuple = (),
    no_deps: bool = False,
    python: str = sys.executable,
) -> list[Path]:
    """Wheels of `requirements` (and of `requirement_files`) for `target`, through pip download (binary only); returns
    the files pip wrote (dest may hold earlier ones)."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    cmd = [
        python,
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        *(["--no-deps"] if no_deps else []),
        *target.pip_args(),
        "-d",
        str(dest),
        *requirements,
    ]
    for f in requirement_files:
        cmd += ["-r", str(f)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.startswith("ERROR")] or (
            r.stderr or r.stdout or "no output"
        ).splitlines()[-1:]
        raise StageError(f"pip download for {target.words()} failed: {lines[0][:300]}")
    return sorted(set(dest.iterdir()) - before)


@dataclass(frozen=True)
class Item:
    path: Path  # the local file
    group: str  # where it goes on the host: DEST/<group>/<name>
    source: str  # where it came from, e.g. "pypi:numpy==2.2.6 (pip download)"
    note: str = ""

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class Call:
    index: int
    pieces: list = field(default_factory=list)  # (Item, offset, length, part number)

    @property
    def nbytes(self) -> int:
        return sum(n for _, _, n, _ in self.pieces)


def cut(items: list[Item], room: int) -> list[Call]:
    """The items end to end, cut into calls of at most `room` bytes (the last one less)."""
    if room <= 0:
        raise StageError("no room for staged files under the transfer limit")
    calls, free = [Call(1)], room
    for item in items:
        size, offset, part = item.path.stat().st_size, 0, 0
        while offset < size or (size == 0 and part == 0):
            if free == 0:
                calls.append(Call(len(calls) + 1))
                free = room
            n = min(size - offset, free)
            part += 1
            calls[-1].pieces.append((item, offset, n, part))
            offset, free = offset + n, free - n
            if size == 0:
                break
    return calls


def stage(
    items: list[Item],
    out: Path,
    *,
    limit_bytes: int,
    carried_bytes: int,
    margin_bytes: int = MIB // 4,
    meta: dict | None = None,
) -> dict:
    """Write `items` as OUT/call1, OUT/call2, ... each at most limit - carried - margin bytes; returns the manifest
    (also written to OUT/STAGE.json and into every call directory)."""
    names = {}
    for it in items:
        key = (it.group, it.name)
        if key in names and sha256_file(names[key].path) != sha256_file(it.path):
            raise StageError(f"two different files named {it.group}/{it.name}")
        names.setdefault(key, it)
    items = list(names.values())
    room = limit_bytes - carried_bytes - margin_bytes
    if room < 4 * MIB:
        raise StageError(
            f"what every transfer carries ({carried_bytes / MIB:.1f} MiB) leaves "
            f"{max(room, 0) / MIB:.1f} MiB under the {limit_bytes / MIB:g} MiB limit"
        )
    calls = cut(items, room)
    if out.exists():
        shutil.rmtree(out)
    files: dict[tuple, dict] = {}
    for it in items:
        files[(it.group, it.name)] = {
            "name": it.name,
            "group": it.group,
            "bytes": it.path.stat().st_size,
            "sha256": sha256_file(it.path),
            "source": it.source,
            **({"note": it.note} if it.note else {}),
            "parts": [],
        }
    nparts = {}
    for call in calls:
        for it, _, _, part in call.pieces:
            nparts[(it.group, it.name)] = max(part, nparts.get((it.group, it.name), 0))
    record_calls = []
    for call in calls:
        d = out / f"call{call.index}"
        for it, offset, n, part in call.pieces:
            key = (it.group, it.name)
            total = nparts[key]
            rel = f"{it.group}/{it.name}" if total == 1 else f"{it.group}/{it.name}.part{part}of{total}"
            dst = d / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            h = hashlib.sha256()
            with open(it.path, "rb") as src, open(dst, "wb") as fh:
                src.seek(offset)
                left = n
                while left:
                    block = src.read(min(MIB, left))
                    if not block:
                        raise StageError(f"{it.path} changed while it was staged")
                    fh.write(block)
                    h.update(block)
                    left -= len(block)
            files[key]["parts"].append({"call": call.index, "path": rel, "bytes": n, "sha256": h.hexdigest()})
        record_calls.append(
            {
                "dir": f"call{call.index}",
                "bytes": call.nbytes,
                "mib": round(call.nbytes / MIB, 2),
                "files": len(call.pieces),
            }
        )
    manifest = {
        "format": FORMAT,
        "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "limit_mib": round(limit_bytes / MIB, 2),
        "carried_mib": round(carried_bytes / MIB, 2),
        "room_mib": round(room / MIB, 2),
        "total_mib": round(sum(f["bytes"] for f in files.values()) / MIB, 2),
        **(meta or {}),
        "files": list(files.values()),
        "calls": record_calls,
    }
    manifest = {"id": hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16], **manifest}
    text = json.dumps(manifest, indent=1) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(text)
    for c in record_calls:
        (out / c["dir"] / MANIFEST).write_text(text)
    return manifest


def carried_tree_bytes(repo: Path) -> int:
    """What every transfer to the host carries besides the staged files (the repository): tracked files and untracked files
    git does not ignore."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    return sum((repo / p).stat().st_size for p in out.decode().split("\0") if p and (repo / p).is_file())


# --- the host side -----------------------------------------------------------------------------------------------


def load_manifest(path: Path) -> dict:
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageError(f"{path} not found: not a stage (scripts/stage-device.py writes one)") from None
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: unreadable ({exc})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("files"), list):
        raise StageError(f"{path}: not a staging manifest of format {FORMAT}")
    return m


def call_dirs(sources: list[Path]) -> list[Path]:
    """Call directories among `sources`; a staging output root stands for all of its call directories."""
    out = []
    for s in sources:
        if (s / MANIFEST).is_file() and not any(s.glob("call*/" + MANIFEST)):
            out.append(s)
        elif any(s.glob("call*/" + MANIFEST)):
            out += sorted((p.parent for p in s.glob("call*/" + MANIFEST)), key=lambda p: int(p.name[4:] or 0))
        else:
            raise StageError(f"{s}: no {MANIFEST} (not a staged call directory)")
    return out


def _check(path: Path, want: str, what: str) -> None:
    got = sha256_file(path)
    if got != want:
        path.rename(path.with_name(path.name + ".sha256-mismatch"))
        raise StageError(f"{what}: sha256 {got[:16]}... is not the staged {want[:16]}... (moved aside; carry it again)")


def receive(dest: Path, sources: list[Path], say=print) -> dict:
    """Copy the staged parts of `sources` into `dest`, verify them, join complete files; returns the manifest."""
    dirs = call_dirs(sources)
    manifest = None
    for d in dirs:
        m = load_manifest(d / MANIFEST)
        if manifest is None:
            manifest = m
            dest.mkdir(parents=True, exist_ok=True)
            have = dest / MANIFEST
            if have.is_file() and load_manifest(have).get("id") != m.get("id"):
                raise StageError(
                    f"{dest} holds another stage (made {load_manifest(have).get('made_at')}); "
                    "receive into an empty directory"
                )
            have.write_text((d / MANIFEST).read_text())
        elif m.get("id") != manifest.get("id"):
            raise StageError(f"{d} belongs to another stage than {dirs[0]}")
        index = int(d.name[4:]) if d.name.startswith("call") and d.name[4:].isdigit() else None
        copied = 0
        for f in manifest["files"]:
            for p in f["parts"]:
                src = d / p["path"]
                if (index is not None and p["call"] != index) or not src.is_file():
                    continue
                whole = len(f["parts"]) == 1
                dst = dest / p["path"] if whole else dest / PARTS / p["path"]
                if whole and dst.is_file() and dst.stat().st_size == f["bytes"]:
                    continue
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                _check(dst, p["sha256"], f"{d.name}/{p['path']}")
                copied += 1
        say(f"stage: {d.name}: {copied} file(s) or parts verified into {dest}")
    for f in (manifest or {}).get("files", []):
        if len(f["parts"]) > 1:
            _join(dest, f, say)
    return manifest


def _join(dest: Path, f: dict, say) -> None:
    out = dest / f["group"] / f["name"]
    if out.is_file() and out.stat().st_size == f["bytes"]:
        return
    parts = [dest / PARTS / p["path"] for p in f["parts"]]
    if not all(p.is_file() for p in parts):
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".joining")
    with open(tmp, "wb") as fh:
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, fh, MIB)
    _check(tmp, f["sha256"], f"{f['group']}/{f['name']} (joined from {len(parts)} parts)")
    tmp.rename(out)
    for p in parts:
        p.unlink()
    say(f"stage: {f['group']}/{f['name']} joined from {len(parts)} parts and verified")


WEIGHTS = "weights"  # the group of a weights file: WEIGHTS/<its folder under $ARTIFACT_WEIGHTS>


def weights_group(rel: str) -> str:
    """The group a weights file is staged in, from its path relative to the weights directory."""
    parent = PurePosixPath(rel).parent
    if parent.is_absolute() or ".." in parent.parts:
        raise StageError(f"weights file {rel!r}: not a path inside the weights directory")
    return WEIGHTS if str(parent) == "." else f"{WEIGHTS}/{parent}"


def place_weights(dest: Path, manifest: dict, root: Path) -> list[str]:
    """The stage's weights files put where the weights directory `root` keeps them (hard-linked, else copied; a file
    already there is left as it is: every server start verifies its sha256). Returns what was placed."""
    placed = []
    for f in manifest.get("files", []):
        group = f["group"]
        if group != WEIGHTS and not group.startswith(WEIGHTS + "/"):
            continue
        rel = PurePosixPath(group[len(WEIGHTS) + 1 :], f["name"])
        if rel.is_absolute() or ".." in rel.parts:
            raise StageError(f"stage file {group}/{f['name']}: not a path inside the weights directory")
        dst = root / rel
        if dst.is_file():
            continue
        src = dest / group / f["name"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".staging")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        tmp.rename(dst)
        placed.append(str(rel))
    return placed


def missing(dest: Path, manifest: dict) -> list[str]:
    """Files of the stage not (yet) joined in `dest`, with the calls that carry them."""
    out = []
    for f in manifest["files"]:
        p = dest / f["group"] / f["name"]
        if not (p.is_file() and p.stat().st_size == f["bytes"]):
            calls = sorted({p["call"] for p in f["parts"]})
            out.append(f"{f['group']}/{f['name']} (call{'s' * (len(calls) > 1)} {','.join(map(str, calls))})")
    return out


def fits_this_python(manifest: dict) -> str | None:
    """None if the stage's wheels are for this interpreter, else why not (one line)."""
    t = manifest.get("target") or {}
    here = Target.here()
    if t.get("python") and t["python"] != here.python:
        return (
            f"it was staged for Python {t['python']}, this is {sys.version.split()[0]} ({sys.executable}): stage "
            f"again for this Python, or point PYTHON= at a Python {t['python']}"
        )
    if t.get("machine") and t["machine"] != here.machine:
        return f"it was staged for {t['machine']}, this machine is {here.machine}"
    if t.get("implementation") and t["implementation"] != here.implementation:
        return f"it was staged for {t['implementation']}, this Python is {here.implementation}"
    return None


def verify(dest: Path, repo: Path | None = None, *, full: bool = True) -> dict:
    """The stage in `dest` is complete, every file has its sha256 (full=False: its size), and it fits this Python;
    with `repo`, the repository files the manifest pins have their sha256 too. Raises StageError saying what is
    wrong."""
    manifest = load_manifest(dest / MANIFEST)
    gone = missing(dest, manifest)
    if gone:
        raise StageError(
            f"{dest} is incomplete: {len(gone)} staged file(s) missing, e.g. {gone[0]}: receive the "
            "remaining calls first (python3 -m artifact.orchestrate.staging receive DEST CALL_DIR)"
        )
    if full:
        for f in manifest["files"]:
            p = dest / f["group"] / f["name"]
            if sha256_file(p) != f["sha256"]:
                raise StageError(
                    f"{p}: sha256 differs from the staging manifest (a damaged or replaced file): "
                    "receive its call again"
                )
    why = fits_this_python(manifest)
    if why:
        raise StageError(f"{dest}: {why}")
    for rel, want in (manifest.get("repo_files") or {}).items():
        if repo is None:
            break
        p = repo / rel
        if not p.is_file() or sha256_file(p) != want:
            raise StageError(
                f"{p}: not the file the stage was made with (sha256 {want[:16]}...): use the same "
                "commit of the repository on both machines"
            )
    return manifest


def summary(manifest: dict) -> str:
    groups: dict[str, list] = {}
    for f in manifest["files"]:
        groups.setdefault(f["group"], []).append(f["bytes"])
    parts = ", ".join(f"{g} {len(v)} ({sum(v) / MIB:.1f} MiB)" for g, v in groups.items())
    t = manifest.get("target") or {}
    return (
        f"stage {manifest.get('id')}: {len(manifest['files'])} files, {manifest.get('total_mib')} MiB for Python "
        f"{t.get('python', '?')} {t.get('machine', '')}: {parts}; made {manifest.get('made_at')}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m artifact.orchestrate.staging",
        description="Receive and verify a staged bundle on a host without internet.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("receive", help="copy call directories into DEST, verify, join")
    r.add_argument("dest", type=Path)
    r.add_argument("sources", type=Path, nargs="+")
    v = sub.add_parser("verify", help="DEST is complete, verified and fits this Python")
    v.add_argument("dest", type=Path)
    v.add_argument("--repo", type=Path, default=None, help="also check the repository files the stage pins")
    v.add_argument("--quick", action="store_true", help="sizes only, no sha256 (the receive step checked them)")
    v.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "receive":
            manifest = receive(args.dest, args.sources)
            gone = missing(args.dest, manifest)
            print(
                f"stage: {len(manifest['files']) - len(gone)} of {len(manifest['files'])} files complete in "
                f"{args.dest}"
                + (f"; still to carry: {', '.join(gone[:4])}{', ...' if len(gone) > 4 else ''}" if gone else "")
            )
            return 0
        manifest = verify(args.dest, args.repo, full=not args.quick)
        if not args.quiet:
            print(f"stage: {args.dest}: complete and verified: {summary(manifest)}")
        return 0
    except StageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
