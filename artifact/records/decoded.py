"""A run's request records as the reader decodes and validates them, kept beside `requests.jsonl` so that check need
not decode them again: `requests.decoded.msgpack`.

requests.jsonl stays the record (what the protocol writes, what every reader and reviewer reads). When the protocol's
writer finishes a run it reads the run back through the same reader check uses (`store.Run`, `store.validate_records`:
every schema rule, every top-2 position) and, where every rule holds, writes what that reader produced: the request
records (msgspec's MessagePack: the same keys in the same order, the same ints, floats, strings, lists and nulls), the
place of each record's top-2 text in the file (a `LazyRecord` keeps it as text), and the parsed top-2 arrays. A
reader uses the copy only when it was made from exactly these bytes of requests.jsonl (their sha256), for a run in
the same state (complete or not) and by the same reader (`reader_key`: this module's, the records' and the schema's
source, and the versions of the libraries that decoded them); otherwise, or where the copy does not decode, it
decodes requests.jsonl as always. Either way the reader gives the same records, the same arrays and the same errors
(tests/records/test_decoded.py holds them equal); at paper scale reading the copy takes ~5 ms a run against ~30 ms
(bench/README.md).

What the copy does not protect against: it is trusted as the file it was made from. A copy edited on its own (its
records changed, its sha256 kept) would be read as requests.jsonl's records, which a reader of requests.jsonl would
not see. For results that come from elsewhere, set ARTIFACT_RECORD_COPIES=0 (`wanted`): every reader then decodes
requests.jsonl itself (or delete the copies; evidence archives hold none).

No import of the records' store here (it imports this module): the store passes in what it reads and builds.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from importlib import metadata
from pathlib import Path

import msgspec

NAME = "requests.decoded.msgpack"
ENV = "ARTIFACT_RECORD_COPIES"  # "0": never read a copy (requests.jsonl decoded every time)
FORMAT = 1
_TOP = "top_logprobs"
_SOURCES = ("decoded.py", "schema.py", "store.py")  # this package's: the reader and its rules
_LIBRARIES = ("msgspec", "numpy", "pyarrow")  # what decoded the records and parsed the top-2 texts


class Copy(msgspec.Struct, array_like=True):
    format: int
    key: str  # reader_key(): which reader made it
    sha256: str  # of requests.jsonl's bytes as the reader reads them (store.read_bytes)
    complete: bool  # the run's state when it was read (an interrupted run's last line may be dropped)
    records: list[dict]  # each request record as decoded, without the top_logprobs kept as text
    raw: list[tuple[int, int] | None]  # per record, (offset, length) of its top_logprobs text in the file, or None
    top2: list[int]  # the records of the top-2 arrays (their index in `records`)
    counts: list[int]  # their position counts
    ids: bytes  # (n, 2) int64, native byte order
    logprobs: bytes  # (n, 2) float64


def wanted() -> bool:
    """Whether readers take a run's copy where it holds (ENV "0": never)."""
    return os.environ.get(ENV, "").strip() != "0"


def present(run_dir: Path) -> bool:
    """Whether a reader would look at the run's copy (one is there and copies are wanted: `wanted`)."""
    return wanted() and (run_dir / NAME).is_file()


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


def encode(data: bytes, complete: bool, records: list, top2: tuple) -> bytes | None:
    """The copy of a run's request records as the reader made them from `data` (requests.jsonl as read), or None
    where a record was not read by the typed decoder (`raw_of` has none: the reader keeps such records as plain
    dicts; they are rare, and decoded again). `top2`: the run's (records, counts, ids, logprobs)."""
    raws, pos = [], 0
    for rec in records:
        raw = getattr(rec, "_raw", False)
        if raw is False:
            return None
        if raw is None:
            raws.append(None)
            continue
        at = data.find(raw, pos)  # the records are in the file's order; any place with the same bytes would do
        if at < 0:
            return None
        raws.append((at, len(raw)))
        pos = at + len(raw)
    index = {id(r): i for i, r in enumerate(records)}
    top_records, counts, ids, lps = top2
    copy = Copy(FORMAT, reader_key(), digest(data), complete, [dict(r) for r in records], raws,
                [index[id(r)] for r in top_records], list(counts), ids.astype("=i8").tobytes(),
                lps.astype("=f8").tobytes())
    try:
        return msgspec.msgpack.encode(copy)
    except (msgspec.EncodeError, OverflowError, TypeError, ValueError):  # a value MessagePack cannot hold
        return None


_DECODER = msgspec.msgpack.Decoder(Copy)


def decode(blob: bytes, data: bytes, complete: bool, make_record) -> tuple[list, tuple] | None:
    """(records, top-2 arrays) from a copy made from exactly `data` by this reader for a run in this state, or None
    (another file, another state, another reader, or not a copy). `make_record(dict, raw text or None)`: the
    reader's record."""
    import numpy as np  # noqa: PLC0415  (the protocol's writer imports this module; numpy only where a run is read)

    try:
        copy = _DECODER.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if copy.format != FORMAT or copy.key != reader_key() or copy.complete != complete or copy.sha256 != digest(data):
        return None
    if len(copy.raw) != len(copy.records):
        return None
    try:
        records = [make_record(rec, None if at is None else data[at[0]:at[0] + at[1]])
                   for rec, at in zip(copy.records, copy.raw)]
        ids = np.frombuffer(copy.ids, dtype="=i8").reshape(-1, 2).copy()
        lps = np.frombuffer(copy.logprobs, dtype="=f8").reshape(-1, 2).copy()
        top = [records[i] for i in copy.top2]
    except (ValueError, IndexError, TypeError):
        return None
    if sum(copy.counts) != len(ids) or len(copy.counts) != len(top):
        return None
    return records, (top, copy.counts, ids, lps)
