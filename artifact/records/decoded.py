"""The checker's own cache of request records as its reader decoded and validated them: never inside results.

requests.jsonl is the record. Decoding and validating a paper-scale run takes ~30 ms; reading what the reader
produced last time takes ~5-9 ms. So once check has read a run and every schema rule held (`store.validate_records`:
every field, every top-2 position), it keeps what its reader produced (msgspec's MessagePack: the request records
with the same keys in the same order and the same values, the place of each record's top-2 text in the file, the
parsed top-2 arrays) in a file of its own, under the checker's cache directory (`directory`: $ARTIFACT_RECORD_CACHE,
else ${XDG_CACHE_HOME:-~/.cache}/artifact/records), named by the sha256 of requests.jsonl's bytes, the run's state
(complete or not) and `reader_key` (this module's, the records' and the schema's source, and the versions of the
libraries that decoded them). A later reader of the same bytes, in the same state, by the same reader, reads that
entry instead (and checks its recorded sha256, state and key again); any other file, or an entry that does not
decode, is decoded from requests.jsonl as always. Either way the reader gives the same records, the same arrays and
the same errors (tests/records/test_decoded.py).

Why outside the results: a file inside a results directory is written by whoever produced the results. An
earlier version kept this copy beside requests.jsonl (`requests.decoded.msgpack`), keyed by a sha256 and a reader key
anyone can compute, so a copy edited on its own changed what check judged. Nothing found inside a results directory
is read as records now (a `requests.decoded.msgpack` there is ignored), the protocol's writer writes none, and only
check writes entries here, only after validating the run. ARTIFACT_RECORD_COPIES=0 turns the cache off (nothing read
or written: every reader decodes requests.jsonl); check.json's `record_cache` says what a check read and wrote.

Its size is bounded (`prune`): when a process first writes an entry, the least recently used entries (a read renews
an entry's time) go until the cache holds at most $ARTIFACT_RECORD_CACHE_MIB MiB (default 2048, about twenty
paper-scale result sets); what one check writes may exceed the bound until the next check writes.

No import of the records' store here (it imports this module): the store passes in what it reads and builds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable
import contextlib
import hashlib
import math
import os
import tempfile
from functools import cache
from importlib import metadata
from pathlib import Path

import msgspec

from artifact.errors import ArtifactError

if TYPE_CHECKING:
    # the reader's record from a record's fields and its top_logprobs' JSON text (store._lazy_record)
    MakeRecord = Callable[[dict[str, Any], bytes | None], Any]

LEGACY_NAME = "requests.decoded.msgpack"  # what earlier versions wrote beside requests.jsonl: never read
ENV = "ARTIFACT_RECORD_COPIES"  # "0": no cache (nothing read or written; requests.jsonl decoded every time)
DIR_ENV = "ARTIFACT_RECORD_CACHE"  # the cache's directory (default: ${XDG_CACHE_HOME:-~/.cache}/artifact/records)
MAX_ENV = "ARTIFACT_RECORD_CACHE_MIB"  # the cache's size bound in MiB (`prune`)
DEFAULT_MAX_MIB = 2048
FORMAT = 1
_TOP = "top_logprobs"
_KEY = b'"top_logprobs": '  # as the protocol's writer writes the key before its text
_SOURCES = ("decoded.py", "reading.py", "schema.py", "store.py")  # this package's: the reader and its rules
_LIBRARIES = ("msgspec", "numpy", "pyarrow")  # what decoded the records and parsed the top-2 texts


class Copy(msgspec.Struct, array_like=True):
    format: int
    key: str  # reader_key(): which reader made it
    sha256: str  # of requests.jsonl's bytes as the reader reads them (reading.read_bytes)
    complete: bool  # the run's state when it was read (an interrupted run's last line may be dropped)
    records: list[dict[str, Any]]  # each request record as decoded, without the top_logprobs kept as text
    raw: list[tuple[int, int] | None]  # per record, (offset, length) of its top_logprobs text in the file, or None
    top2: list[int]  # the records of the top-2 arrays (their index in `records`)
    counts: list[int]  # their position counts
    ids: bytes  # (n, 2) int64, native byte order
    logprobs: bytes  # (n, 2) float64


def wanted() -> bool:
    """Whether readers use the checker's cache (ENV "0": never)."""
    return os.environ.get(ENV, "").strip() != "0"


def directory() -> Path:
    """The checker's cache directory: DIR_ENV, else ${XDG_CACHE_HOME:-~/.cache}/artifact/records."""
    chosen = os.environ.get(DIR_ENV, "").strip()
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "artifact" / "records"


def entry(sha256: str, complete: bool) -> Path:
    """Where the cache keeps the records of requests.jsonl bytes with this sha256, for a run in this state, made by
    this reader."""
    return directory() / reader_key()[:32] / f"{sha256}-{'complete' if complete else 'incomplete'}.msgpack"


def any_entries() -> bool:
    """Whether this reader has cached anything at all (where not, no file need be hashed to look)."""
    try:
        return wanted() and (directory() / reader_key()[:32]).is_dir()
    except OSError:
        return False


def cached(sha256: str, complete: bool) -> bool:
    """Whether the cache holds an entry for these bytes and state (a hint: `lookup` checks it)."""
    try:
        return wanted() and entry(sha256, complete).is_file()
    except OSError:
        return False


def lookup(
    data: bytes, sha256: str, complete: bool, make_record: MakeRecord
) -> tuple[list[Any], tuple[Any, ...]] | None:
    """(records, top-2 arrays) from the cache's entry for requests.jsonl bytes `data` (whose sha256 the caller
    computed), or None (no entry, not a regular file, unreadable, or not made from these bytes by this reader)."""
    if not wanted():
        return None
    path = entry(sha256, complete)
    try:
        if path.is_symlink() or not path.is_file():
            return None
        blob = path.read_bytes()
    except OSError:
        return None
    found = decode(blob, data, complete, make_record, sha256)
    if found is not None:
        with contextlib.suppress(OSError):  # used now: the last entry `prune` removes
            os.utime(path)
    return found


def store(data: bytes, sha256: str, complete: bool, records: list[Any], top2: tuple[Any, ...]) -> bool:
    """Keep a validated run's records in the cache (the caller validated them: every schema rule held); whether an
    entry was written. Never raises for the cache's sake: it is only ever a shortcut."""
    if not wanted():
        return False
    blob = encode(data, complete, records, top2, sha256)
    if blob is None:
        return False
    path = entry(sha256, complete)
    try:
        write_entry(path, blob)
    except OSError:
        return False
    global _pruned
    if not _pruned:
        _pruned = True
        prune(keep=path)
    return True


def write_entry(path: Path, blob: bytes) -> None:
    """Write a cache entry whole or not at all (a new file renamed into place), in a folder only its owner reads;
    raises OSError (the callers keep nothing then: the cache is only ever a shortcut)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_pruned = False  # whether this process has bounded the cache yet (once, at its first write)


MAX_MIB = 1 << 40  # the largest bound MAX_ENV may set (a mebibyte count beyond any disk)


def bound() -> int:
    """The cache's size bound in bytes: MAX_ENV MiB (a finite number >= 0; unset or empty: DEFAULT_MAX_MIB).
    ArtifactError (one line) for any other value (junk, inf, nan, a negative number): check asks before it reads
    anything, so that a setting it cannot honour is said at once, never after the outputs were written."""
    text = os.environ.get(MAX_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_MIB << 20
    try:
        mib = float(text)
    except ValueError:
        mib = math.nan
    if not 0 <= mib <= MAX_MIB:  # nan fails both
        raise ArtifactError(
            f"{MAX_ENV}={text!r}: the checker's cache bound must be a number of MiB from 0 to {MAX_MIB} "
            f"(default {DEFAULT_MAX_MIB}); set it so, or unset it"
        )
    return int(mib * (1 << 20))


def prune(keep: Path | None = None) -> int:
    """Remove the least recently used entries (of any reader: older readers' are never read again) until the cache
    holds at most `bound()` bytes; `keep` (the entry just written) stays. Returns how many it removed; never
    raises (the cache is only ever a shortcut)."""
    entries = []
    try:
        for sub in os.scandir(directory()):
            if not sub.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(sub.path):
                if e.name.endswith(".msgpack") and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
        limit = bound()
    except (OSError, ArtifactError):  # a bound check did not accept was said before (`bound`)
        return 0
    total, removed = sum(size for _, size, _ in entries), 0
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        if keep is not None and path == str(keep):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


@cache
def reader_key() -> str:
    """What made a copy: the reader's source and the decoding libraries' versions (a copy made by another is not
    read)."""
    h = hashlib.sha256(f"format {FORMAT}\n".encode())
    here = Path(__file__).parent
    for name in _SOURCES:
        h.update((here / name).read_bytes())
    for lib in _LIBRARIES:
        try:
            version = metadata.version(lib)
        except metadata.PackageNotFoundError:  # not installed as a distribution: a key no writer with it made
            version = "absent"
        h.update(f"{lib} {version}\n".encode())
    return h.hexdigest()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(
    data: bytes, complete: bool, records: list[Any], top2: tuple[Any, ...], sha256: str | None = None
) -> bytes | None:
    """The copy of a run's request records as the reader made them from `data` (requests.jsonl as read), or None
    where a record was not read by the typed decoder (`raw_of` has none: the reader keeps such records as plain
    dicts; they are rare, and decoded again). `top2`: the run's (records, counts, ids, logprobs)."""
    raws: list[tuple[int, int] | None] = []
    pos = 0
    for rec in records:
        raw: Any = getattr(rec, "_raw", False)  # the record's JSON text (bytes), None, or False: not a reader's record
        if raw is False:
            return None
        if raw is None:
            raws.append(None)
            continue
        # the records are in the file's order; any place with the same bytes would do. The key written before the
        # text is found first (a short pattern: a search for the whole text costs ~5 us a record at paper scale)
        at = data.find(_KEY, pos) + len(_KEY)
        if at < len(_KEY) or data[at : at + len(raw)] != raw:
            at = data.find(raw, pos)
        if at < 0:
            return None
        raws.append((at, len(raw)))
        pos = at + len(raw)
    index = {id(r): i for i, r in enumerate(records)}
    top_records, counts, ids, lps = top2
    copy = Copy(
        FORMAT,
        reader_key(),
        sha256 or digest(data),
        complete,
        [dict(r) for r in records],
        raws,
        [index[id(r)] for r in top_records],
        list(counts),
        ids.astype("=i8").tobytes(),
        lps.astype("=f8").tobytes(),
    )
    try:
        return msgspec.msgpack.encode(copy)
    except (msgspec.EncodeError, OverflowError, TypeError, ValueError):  # a value MessagePack cannot hold
        return None


_DECODER: msgspec.msgpack.Decoder[Copy] = msgspec.msgpack.Decoder(Copy)


def decode(
    blob: bytes, data: bytes, complete: bool, make_record: MakeRecord, sha256: str | None = None
) -> tuple[list[Any], tuple[Any, ...]] | None:
    """(records, top-2 arrays) from a copy made from exactly `data` by this reader for a run in this state, or None
    (another file, another state, another reader, or not a copy). `make_record(dict, raw text or None)`: the
    reader's record."""
    import numpy as np  # the protocol's writer imports this module; numpy only where a run is read

    try:
        copy = _DECODER.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if (
        copy.format != FORMAT
        or copy.key != reader_key()
        or copy.complete != complete
        or copy.sha256 != (sha256 or digest(data))
    ):
        return None
    if len(copy.raw) != len(copy.records):
        return None
    try:
        records = [
            make_record(rec, None if at is None else data[at[0] : at[0] + at[1]])
            for rec, at in zip(copy.records, copy.raw)
        ]
        ids = np.frombuffer(copy.ids, dtype="=i8").reshape(-1, 2).copy()
        lps = np.frombuffer(copy.logprobs, dtype="=f8").reshape(-1, 2).copy()
        top = [records[i] for i in copy.top2]
    except (ValueError, IndexError, TypeError):
        return None
    if sum(copy.counts) != len(ids) or len(copy.counts) != len(top):
        return None
    return records, (top, copy.counts, ids, lps)
