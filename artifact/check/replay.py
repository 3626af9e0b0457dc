"""Replaying a check the checker has already made: the same results, byte for byte, judged by the same checker.

A check's outputs are a function of what it reads: the files under the results directory, the checker (this
package's files and the checkout's configs/ and expected/), the libraries that compute with it, and the check's
options (the results and output paths as given, the expectations file, the working directory, the ARTIFACT_*
settings). What it may read of the results is one listing (`records.listing.entries`: every entry under the results
directory but the check's own output folder), which the run finder takes too: the key cannot leave out a folder the
finder reads runs from. Once a check has run to its end, the checker keeps its outputs, its exit code and what it
printed in an entry of its own cache (beside the record cache, `records.decoded.directory`: never inside results),
named by the sha256 of everything above but the files' bytes (`key`: the entries' names, kinds and sizes) and
holding every file's sha256. A later check whose key names an entry hashes every file of the listing and replays
the entry only where every hash is the one recorded: the outputs are written (whole, as a check writes them:
`run.publish`), the summary printed, the exit code returned, and timings.json says it was a replay (`REPLAYED`).
Any other difference (a file added, removed or changed, another checker, library or option) runs the check.

What it may do: nothing inside a results directory is read but the results' own files, each hashed as a stream (in
bounded memory, whatever its size); a file's sha256 is kept in the checker's cache under the file's identity
(`_Digests`: its device, inode, size and modification and change times, which any write changes), so that a large
file that check does not read (weights left in a results folder) is read once, not at every check. An entry is
written only after a check ran to its end (an input error, exit 2, writes none), only where every file the check
read is in the listing (`keep`'s `read`), and not where an entry under the results changed while the check read
them. ARTIFACT_CHECK_REPLAY=0 turns replays off (and ARTIFACT_RECORD_COPIES=0 turns off the checker's whole cache);
the record cache's size bound (`decoded.prune`) holds the entries too. A check of an evidence folder (its records
unpacked into a new temporary directory every time) is never replayed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import time
from typing import Any, cast
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import msgspec

from artifact.records import decoded, listing

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

# what a check may read of its results: the results directory's one listing (`listing.entries`), which the run
# finder takes too; the check's output folder is left out of both
Listing = listing.Listing


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
                    h.update(f"{p.relative_to(base)}\0".encode(errors="surrogateescape"))
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
    """The entry's name: the checker, the check's options and settings, and every entry's name, kind and size
    (the files' bytes are checked against the entry's hashes: `lookup`)."""
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith("ARTIFACT_") and k not in _CACHE_SETTINGS)
    expected: list[str | None] | None = None
    if expected_path is not None:
        expected = [str(expected_path), _digest(Path(expected_path), follow=True)]
    blob = json.dumps(
        [
            FORMAT,
            checker(),
            os.getcwd(),
            str(root),
            str(out),
            expected,
            settings,
            [(e.rel, e.kind, e.size) for e in files],
        ]
    )
    return hashlib.sha256(blob.encode(errors="surrogateescape")).hexdigest()


def _entry_path(name: str) -> Path:
    return decoded.directory() / SUBDIR / f"{name}.msgpack"


_CHUNK = 1 << 20  # what hashing a file holds in memory at a time


def _stream(fd: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK):
        h.update(chunk)  # hashlib leaves the GIL: two files hash at once
    return h.hexdigest()


def _digest(path: Path, digests: _Digests | None = None, follow: bool = False) -> str | None:
    """The sha256 of the regular file at `path`, read as a stream (a link followed only where `follow`, never a
    pipe waited on); from `digests` where it holds the file as it is now. None where it cannot be read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        known = digests.get(st) if digests is not None else None
        if known is not None:
            return known
        started = time.time_ns()
        sha = _stream(fd)
        if digests is not None:
            digests.put(st, sha, started)
        return sha
    except OSError:
        return None
    finally:
        os.close(fd)


class _Digests:
    """The sha256 of files hashed before, by their identity: device, inode, size, modification and change time (a
    write changes the last two; the change time cannot be set back by a user). Kept in the checker's cache, never
    in results, for files of at least MIN_BYTES (smaller ones are hashed every time: it costs less than looking them
    up). A digest is kept only where the file's times lie clearly before the hashing began: a write in the same
    clock tick as the times recorded could not be told apart ("racily clean")."""

    NAME = "digests.msgpack"  # under SUBDIR
    MIN_BYTES = 1 << 20
    MAX_ITEMS = 20_000  # the oldest go first beyond it
    MARGIN_NS = 100_000_000  # a file changed less than this before its hashing began is not kept ...
    COARSE_MARGIN_NS = 2_000_000_000  # ... or this, on a file system that keeps whole seconds

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.changed = False
        try:
            path = self.path()
            if path.is_file() and not path.is_symlink():
                self.items = msgspec.msgpack.decode(path.read_bytes(), type=dict[str, str])
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            self.items = {}

    @staticmethod
    def path() -> Path:
        return decoded.directory() / SUBDIR / _Digests.NAME

    @staticmethod
    def _id(st: os.stat_result) -> str:
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"

    def get(self, st: os.stat_result) -> str | None:
        return self.items.get(self._id(st)) if st.st_size >= self.MIN_BYTES else None

    def put(self, st: os.stat_result, sha: str, started_ns: int) -> None:
        if st.st_size < self.MIN_BYTES:
            return
        latest = max(st.st_mtime_ns, st.st_ctime_ns)
        coarse = st.st_mtime_ns % 1_000_000_000 == 0 and st.st_ctime_ns % 1_000_000_000 == 0
        if latest >= started_ns - (self.COARSE_MARGIN_NS if coarse else self.MARGIN_NS):
            return
        self.items[self._id(st)] = sha
        self.changed = True

    def save(self) -> None:
        """Write the digests back (the newest MAX_ITEMS); never raises (only a shortcut)."""
        if not self.changed:
            return
        items = dict(list(self.items.items())[-self.MAX_ITEMS :])
        with contextlib.suppress(OSError, msgspec.EncodeError):
            decoded.write_entry(self.path(), msgspec.msgpack.encode(items))
        self.changed = False


def digests(root: Path, files: Listing, known: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """(relative path, sha256) of every regular file in `files`, in order; `known`: those the caller hashed (the
    runs' requests.jsonl, as check read them)."""
    known = known or {}
    todo = [e.rel for e in files if e.kind == "f" and e.rel not in known]
    base = Path(listing.resolved(root))
    kept = _Digests()
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(todo, pool.map(lambda rel: _digest(base / rel, kept), todo)))
    kept.save()
    got.update(known)
    return [(e.rel, got[e.rel]) for e in files if e.kind == "f"]


# --- lookup and keeping ---------------------------------------------------------------------------------------


class Pending:
    """A check about to run: what it may read (`files`, the listing before it read them) and its entry's name."""

    def __init__(self, root: Path, out: Path, files: Listing, name: str):
        self.root, self.out, self.files, self.name = root, out, files, name


def _replayable(entry: Entry, name: str) -> bool:
    """Whether an entry is one a check of this key wrote: its format and key, and a check.json whose exit code is
    the entry's (what is replayed says what the process returns)."""
    if entry.format != FORMAT or entry.key != name or "check.json" not in entry.outputs:
        return False
    try:
        said: Any = json.loads(entry.outputs["check.json"])
    except ValueError:
        return False
    return isinstance(said, dict) and said.get("exit_code") == entry.exit_code


def lookup(
    root: Path, out: Path, expected_path: str | Path | None, files: Listing
) -> tuple[Entry | None, Pending | None]:
    """(the entry to replay, or None; what to keep this check under, or None where checks are not kept). `files`:
    the results' listing (`listing.entries(root, out)`), the one the run finder reads runs from."""
    if not wanted() or any(e.kind in "lo" for e in files):  # a link's target is not hashed: no replay
        return None, None
    try:
        name = key(root, out, expected_path, files)
    except OSError:  # the working directory is gone: no key
        return None, None
    pending = Pending(root, out, files, name)
    path = _entry_path(name)
    try:
        if path.is_symlink() or not path.is_file():
            return None, pending
        entry: Entry = msgspec.msgpack.decode(path.read_bytes(), type=Entry)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None, pending
    if not _replayable(entry, name) or entry.files != digests(root, files):
        return None, pending
    with contextlib.suppress(OSError):  # used now: the last entry `decoded.prune` removes
        os.utime(path)
    return entry, pending


def keep(
    pending: Pending, exit_code: int, printed: str, written: Path, known: dict[str, str], read: list[Path]
) -> bool:
    """Keep the check that just wrote its outputs into `written` (timings.json left out) as an entry; not where a
    file it read (`read`: each run's record files and server log) is not in its listing, nor where an entry under
    the results changed while it ran. Whether an entry was written; never raises (only a shortcut)."""
    try:
        if not covers(pending, read):
            return False
        outputs = {
            p.name: p.read_bytes() for p in sorted(written.iterdir()) if p.is_file() and p.name != "timings.json"
        }
        files = digests(pending.root, pending.files, known)
        if any(d is None for _, d in files):
            return False
        if listing.entries(pending.root, pending.out) != pending.files:  # after hashing: what was hashed is listed
            return False
        hashed = cast("list[tuple[str, str]]", files)  # none is None (above)
        blob = msgspec.msgpack.encode(Entry(FORMAT, pending.name, hashed, exit_code, printed, outputs))
        path = _entry_path(pending.name)
        decoded.write_entry(path, blob)
        decoded.prune(keep=path)
    except Exception:  # never raises: the check's outputs are published and its exit code decided
        return False
    return True


def covers(pending: Pending, read: list[Path]) -> bool:
    """Whether the listing the key was made of holds every file a check read (`read`): an existing one listed as a
    file, a missing one (a server log not kept) at a place under the results that the listing covers (so that one
    put there later changes the key)."""
    base, out = Path(listing.resolved(pending.root)), Path(listing.resolved(pending.out))
    listed = {e.rel for e in pending.files if e.kind == "f"}
    for path in read:
        where = Path(listing.resolved(path))
        if not where.is_relative_to(base) or where == out or where.is_relative_to(out):
            return False
        if os.path.lexists(path) and str(where.relative_to(base)) not in listed:
            return False
    return True


def entry_name(entry: Entry) -> str:
    return str(_entry_path(entry.key))
