"""Replaying a check the checker has already made: the same results, byte for byte, judged by the same checker.

A check's outputs are a function of what it reads: every file under the results directory, the checker (this
package's files and the checkout's configs/ and expected/), the libraries that compute with it, and the check's
options (the results and output paths as given, the expectations file, the working directory, the ARTIFACT_*
settings). Once a check has run to its end, the checker keeps its outputs, its exit code and what it printed in an
entry of its own cache (beside the record cache, `records.decoded.directory`: never inside results), named by the
sha256 of everything above but the files' bytes (`key`: their names, kinds and sizes) and holding each file's sha256.
A later check whose key names an entry hashes every file under the results and replays the entry only where every
hash is the one recorded: the outputs are written (whole, as a check writes them: `run.publish`), the summary
printed, the exit code returned, and timings.json says it was a replay (`REPLAYED`). Any other difference (a file
added, removed or changed, another checker, library or option) runs the check.

What it may do: nothing inside a results directory is read but the results' own files, which are hashed whole; an
entry is written only after a check ran to its end (an input error, exit 2, writes none), and not where a file under
the results changed while the check read them (`unchanged`). ARTIFACT_CHECK_REPLAY=0 turns replays off (and
ARTIFACT_RECORD_COPIES=0 turns off the checker's whole cache); the record cache's size bound (`decoded.prune`) holds
the entries too. A check of an evidence folder (its records unpacked into a new temporary directory every time)
is never replayed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from typing import cast
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import msgspec

from artifact.records import decoded

ENV = "ARTIFACT_CHECK_REPLAY"  # "0": never replay a check nor keep one
FORMAT = 1
SUBDIR = "checks"  # under the checker's cache directory (`decoded.directory`), beside the record entries
REPLAYED = "replayed"  # timings.json's key on a replay: the entry replayed
_PACKAGE = Path(__file__).resolve().parents[1]  # artifact/
_CHECKOUT_INPUTS = ("configs", "expected")  # what check reads of the checkout beside its own package
# settings that decide where the cache is or whether it is used, not what a check computes
_CACHE_SETTINGS = (decoded.ENV, decoded.DIR_ENV, decoded.MAX_ENV, ENV, "ARTIFACT_CHECK_WORKER")


class Entry(msgspec.Struct, array_like=True):
    format: int
    key: str  # `key()`: the checker, its options and the names, kinds and sizes of the files it read
    files: list[tuple[str, str]]  # per regular file under the results (its relative path): its sha256
    exit_code: int
    printed: str  # what the check printed (its summary), or "" for a quiet check
    outputs: dict[str, bytes]  # every output the check wrote (timings.json left out: it is each check's own)


def wanted() -> bool:
    """Whether checks are replayed and kept (ENV "0", or the checker's cache off: never)."""
    return decoded.wanted() and os.environ.get(ENV, "").strip() != "0"


# --- what a check reads -----------------------------------------------------------------------------------------

Listing = list[tuple[str, str, int, int]]  # (relative path, kind: f/l/d/o, size or link target's length, mtime_ns)


def listing(root: Path, out: Path) -> Listing | None:
    """Every entry under `root` but the check's own output folder `out` (and its staging folders: `run.staging`),
    sorted: (relative path, kind f(ile)/l(ink)/d(irectory)/o(ther), size, mtime_ns); None where `root` cannot be
    walked."""
    entries: Listing = []
    try:
        skip, beside = str(out.resolve()), out.resolve().parent
        stage = (f".{out.name}.new-", f".{out.name}.old-")
        stack = [root.resolve()]
        base = str(stack[0])
        while stack:
            here = stack.pop()
            with os.scandir(here) as it:
                for e in it:
                    if e.path == skip or (here == beside and e.name.startswith(stage)):
                        continue
                    st = e.stat(follow_symlinks=False)
                    rel = os.path.relpath(e.path, base)
                    if e.is_symlink():
                        entries.append((rel, "l", len(os.readlink(e.path)), st.st_mtime_ns))
                    elif e.is_dir(follow_symlinks=False):
                        entries.append((rel, "d", 0, 0))
                        stack.append(Path(e.path))
                    elif e.is_file(follow_symlinks=False):
                        entries.append((rel, "f", st.st_size, st.st_mtime_ns))
                    else:
                        entries.append((rel, "o", 0, st.st_mtime_ns))
    except OSError:
        return None
    return sorted(entries)


_WHOLE_BYTES = 1 << 20  # a checkout file up to this size is hashed whole; a larger one (weights) by size and time


def _tree(paths: list[Path], base: Path) -> str:
    """The sha256 of the files under each of `paths`: their names and bytes (__pycache__ left out); a file larger
    than _WHOLE_BYTES (an adapter's weights, which check does not compute with) by its size and modification time."""
    h = hashlib.sha256()
    for top in paths:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                p = Path(dirpath) / name
                with contextlib.suppress(OSError):
                    h.update(f"{p.relative_to(base)}\0".encode())
                    st = p.stat()
                    h.update(
                        hashlib.sha256(p.read_bytes()).digest()
                        if st.st_size <= _WHOLE_BYTES
                        else f"{st.st_size} {st.st_mtime_ns}".encode()
                    )
    return h.hexdigest()


@cache
def checker() -> str:
    """The checker and what it computes with: this package's files, the checkout's configs/ and expected/, the
    Python and every installed distribution's version (the names of the *.dist-info folders on sys.path)."""
    base = _PACKAGE.parent
    dists = sorted({name for p in sys.path if os.path.isdir(p) for name in _listdir(p) if name.endswith(".dist-info")})
    return hashlib.sha256(
        "\n".join([_tree([_PACKAGE, *(base / d for d in _CHECKOUT_INPUTS)], base), sys.version, *dists]).encode()
    ).hexdigest()


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def key(root: Path, out: Path, expected_path: str | Path | None, files: Listing) -> str:
    """The entry's name: the checker, the check's options and settings, and every file's name, kind and size (their
    bytes are checked against the entry's hashes: `lookup`)."""
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith("ARTIFACT_") and k not in _CACHE_SETTINGS)
    expected: list[str | None] | None = None
    if expected_path is not None:
        try:
            expected = [str(expected_path), hashlib.sha256(Path(expected_path).read_bytes()).hexdigest()]
        except OSError:
            expected = [str(expected_path), None]
    blob = json.dumps(
        [
            FORMAT,
            checker(),
            os.getcwd(),
            str(root),
            str(out),
            expected,
            settings,
            [(rel, kind, size) for rel, kind, size, _ in files],
        ]
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _entry_path(name: str) -> Path:
    return decoded.directory() / SUBDIR / f"{name}.msgpack"


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()  # hashlib leaves the GIL: two files hash at once
    except OSError:
        return None


def digests(root: Path, files: Listing, known: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """(relative path, sha256) of every regular file in `files`, in order; `known`: those the caller hashed (the
    runs' requests.jsonl, as check read them)."""
    known = known or {}
    todo = [rel for rel, kind, _, _ in files if kind == "f" and rel not in known]
    base = root.resolve()
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(todo, pool.map(lambda rel: _digest(base / rel), todo)))
    got.update(known)
    return [(rel, got[rel]) for rel, kind, _, _ in files if kind == "f"]


# --- lookup and keeping ---------------------------------------------------------------------------------------


class Pending:
    """A check about to run: what it reads (`files`, the listing before it read them) and its entry's name."""

    def __init__(self, root: Path, out: Path, files: Listing, name: str):
        self.root, self.out, self.files, self.name = root, out, files, name


def lookup(root: Path, out: Path, expected_path: str | Path | None = None) -> tuple[Entry | None, Pending | None]:
    """(the entry to replay, or None; what to keep this check under, or None where checks are not kept)."""
    if not wanted():
        return None, None
    files = listing(root, out)
    if files is None or any(kind in "lo" for _, kind, _, _ in files):  # a link's target is not hashed: no replay
        return None, None
    name = key(root, out, expected_path, files)
    pending = Pending(root, out, files, name)
    path = _entry_path(name)
    try:
        if path.is_symlink() or not path.is_file():
            return None, pending
        entry: Entry = msgspec.msgpack.decode(path.read_bytes(), type=Entry)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None, pending
    if entry.format != FORMAT or entry.key != name or entry.files != digests(root, files):
        return None, pending
    with contextlib.suppress(OSError):  # used now: the last entry `decoded.prune` removes
        os.utime(path)
    return entry, pending


def keep(pending: Pending, exit_code: int, printed: str, written: Path, known: dict[str, str]) -> bool:
    """Keep the check that just wrote its outputs into `written` (timings.json left out) as an entry; not where a
    file under the results changed while it ran. Whether an entry was written; never raises (only a shortcut)."""
    try:
        if listing(pending.root, pending.out) != pending.files:
            return False
        outputs = {
            p.name: p.read_bytes() for p in sorted(written.iterdir()) if p.is_file() and p.name != "timings.json"
        }
        files = digests(pending.root, pending.files, known)
        if any(d is None for _, d in files):
            return False
        hashed = cast("list[tuple[str, str]]", files)  # none is None (above)
        blob = msgspec.msgpack.encode(Entry(FORMAT, pending.name, hashed, exit_code, printed, outputs))
        path = _entry_path(pending.name)
        decoded.write_entry(path, blob)
    except (OSError, msgspec.EncodeError):
        return False
    decoded.prune(keep=path)
    return True


def entry_name(entry: Entry) -> str:
    return str(_entry_path(entry.key))
