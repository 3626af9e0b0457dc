"""How a record file's bytes become records: read within a bound, decoded strictly, and requests.jsonl decoded fast.

A record file is read only where it is a regular file no larger than its bound (`MAX_RECORD_BYTES`,
`MAX_MANIFEST_BYTES`: checked before anything is read), as UTF-8 text; a JSON-lines file is decoded line by line by
the strict decoder (`loads`: a key written twice, nesting too deep or text that is not UTF-8 is corruption, an
ArtifactError naming file and line), only the last line of a run not marked complete may be cut short. requests.jsonl,
most of a results directory's bytes, is decoded by a compiled decoder made from the schema where that gives the same
records (`read_requests`), its top-2 texts parsed at once (`top2_parse`). The run directory, its writer and the
`Run` that reads it through these: `store`.
"""

from __future__ import annotations

from typing import Any, Callable, cast
import json
import os
import stat
from functools import cache
from pathlib import Path

import msgspec

from artifact.errors import ArtifactError
from artifact.records.schema import REQUEST, Schema, decoded_text_fields


class DuplicateKey(ValueError):
    """A JSON object that holds one key twice (a decoder would keep the last silently)."""


def _unique_keys(pairs: list[Any]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[Any] = set()
        raise DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]  # add() as a side effect: the first key seen twice
    return obj


loads = json.JSONDecoder(object_pairs_hook=_unique_keys).decode  # json.loads, refusing duplicate keys


def _loads_lists(raw: bytes) -> Any:
    """`loads(raw.decode())`, the same value: a text that holds no JSON object (no '{': no key to be written twice)
    is decoded by msgspec (~3x faster on a record's top-2 lists), which gives what `loads` gives or refuses the text
    (NaN, numbers beyond a float's range, lone surrogates); what it refuses, and every text with an object, is left
    to `loads`, which decides (and words any error)."""
    if b"{" not in raw:
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError:
            pass
    return loads(raw.decode())


def why_corrupt(exc: Exception, complete: bool) -> str:
    if isinstance(exc, DuplicateKey):
        why = f"a JSON object holds the key {exc.args[0]!r} twice"
    elif isinstance(exc, RecursionError):
        why = "JSON nested too deeply to decode"
    else:
        why = "not valid JSON" + (" (cut short?) in a run marked complete" if complete else "")
    return f"{why}; the record is corrupt"


def corrupt(path: Path, lineno: int | None, exc: Exception, complete: bool) -> ArtifactError:
    where = f"{path}:{lineno}" if lineno is not None else str(path)
    return ArtifactError(f"{where}: {why_corrupt(exc, complete)}")


# Bounds checked before a record file is read (a requests.jsonl padded to 2 GiB exhausted memory). A
# paper-scale run's requests.jsonl is ~3 MiB and its manifest a few KiB; these are ~100x that, and a file larger is
# refused in one line without being read.
MAX_RECORD_BYTES = 256 << 20  # requests.jsonl, episodes.jsonl, tenants.jsonl
MAX_MANIFEST_BYTES = 16 << 20  # manifest.json


def too_large(path: Path, size: int, limit: int) -> ArtifactError:
    """The one-line refusal of a record file larger than its bound."""
    return ArtifactError(
        f"{path}: {size} bytes, more than the {limit} ({limit >> 20} MiB) a record file of this kind "
        "may hold; refusing to read it (a corrupt or padded file?)"
    )


def _read_bounded(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most `limit` of them: its size is checked before anything is read (and again as it
    is read: a file that grows), so that a huge or sparse file is refused at once (ArtifactError, one line naming the
    file and the bound), never read into memory."""
    try:
        if path.exists() and not path.is_file() and not path.is_dir():  # a directory: "Is a directory" below
            raise ArtifactError(f"{path}: not a regular file; the record is corrupt")
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size > limit:
                raise too_large(path, st.st_size, limit)
            data = fh.read(limit + 1)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path} ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ArtifactError(
            f"{path}: more than the {limit} bytes ({limit >> 20} MiB) a record file of this kind may "
            "hold; refusing to read it (a corrupt or padded file?)"
        )
    return data


def read_text(path: Path, limit: int = MAX_RECORD_BYTES) -> str:
    """A record file's text; one line naming the file where it is not readable UTF-8 text or holds more than `limit`
    bytes. Only a regular file is opened (a named pipe or a device would block or never end)."""
    data = _read_bounded(path, limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path}: not UTF-8 text (byte {exc.start}); the record is corrupt") from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text  # read_text's newlines


def read_bytes(path: Path, limit: int = MAX_RECORD_BYTES) -> bytes:
    """A record file's text as UTF-8 bytes, as `read_text` reads it: the same checks, bound and one-line errors (a
    byte that is not UTF-8 is named by its offset in the file), its newlines as read_text's ('\\r\\n' and '\\r'
    read as '\\n'). The JSON-lines readers decode bytes: only a file that is not all ASCII is decoded here, to find
    a byte that is not UTF-8 (ASCII is UTF-8)."""
    data = _read_bounded(path, limit)
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"{path}: not UTF-8 text (byte {exc.start}); the record is corrupt") from None
    if b"\r" in data:  # read_text's universal newlines ('\r' is ASCII: never part of a longer UTF-8 character)
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return data


# The first bytes of a line that str.strip() may find blank: ASCII whitespace as str sees it (bytes.strip() leaves
# \x1c-\x1f) and the first byte of any other character (Unicode whitespace, such as U+00A0 or U+3000).
_MAYBE_BLANK = frozenset(b" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f") | frozenset(range(0x80, 0x100))


def _blank(line: bytes) -> bool:
    """Whether a line (UTF-8) is empty or only whitespace, as `str.strip` tells it."""
    return not line or (line[0] in _MAYBE_BLANK and not line.decode("utf-8").strip())


def _strict(line: bytes) -> Any:
    """One line (UTF-8 bytes) decoded by the strict decoder (`loads`)."""
    return loads(line.decode("utf-8"))


def _split_lines(data: bytes) -> list[bytes]:
    """`data.split(b"\\n")`, its newlines found by memchr (bytes.split compares byte by byte: 4-5 times the
    instructions on a run's 3 MiB)."""
    lines, find, start = [], data.find, 0
    while (end := find(b"\n", start)) >= 0:
        lines.append(data[start:end])
        start = end + 1
    lines.append(data[start:])
    return lines


def read_jsonl(path: Path, complete: bool = False, decode: Callable[[bytes], Any] = _strict) -> list[Any]:
    """The records of a JSON-lines file (`decode`: one line, as UTF-8 bytes, to its record). Only the last line of
    an interrupted (not complete) run may be cut short and is then dropped; any other line that does not decode is
    corruption (ArtifactError naming file and line)."""
    if not path.exists() and not path.is_symlink():
        return []
    return _decode_lines(path, _split_lines(read_bytes(path)), complete, decode)


def _decode_lines(
    path: Path, lines: list[bytes], complete: bool, decode: Callable[[bytes], Any], decoded: list[Any] | None = None
) -> list[Any]:
    """`read_jsonl`'s records of a file's lines; `decoded`: per line, its record where the caller has decoded it
    already (None elsewhere)."""
    while lines and _blank(lines[-1]):
        lines.pop()
    rows = []
    for lineno, line in enumerate(lines, 1):
        if decoded is not None and (record := decoded[lineno - 1]) is not None:
            rows.append(record)
            continue
        if _blank(line):
            continue
        try:
            rows.append(decode(line))
        except (ValueError, RecursionError) as exc:
            if type(exc) is json.JSONDecodeError and lineno == len(lines) and not complete:
                break  # the last line of an interrupted run may be cut short
            raise corrupt(path, lineno, exc, complete) from None
    return rows


# --- reading requests.jsonl -----------------------------------------------------------------------------------
# At paper scale a results directory holds ~32,000 request records with ~1.4 million top-2 positions (80 MiB), and
# decoding them with the standard library took most of check's time. Each line is therefore decoded by a compiled
# decoder made from the schema (`REQUEST.decoder`, msgspec), which checks every field's type and range as it decodes
# and keeps `top_logprobs` as JSON text; a run's texts are then checked and parsed at once (`Run.top2`,
# `top2_problem`). A line that decoder refuses, or may have read otherwise than the strict decoder would
# (`_all_keys_decoded`), is decoded by the strict decoder (`loads`) and validated field by field, as is a
# top_logprobs text that is not a top-2 list of numbers: the same records and the same rules either way.

_TOP = "top_logprobs"


class LazyRecord(dict[str, Any]):
    """A request record the typed decoder read (its fields' types and ranges are checked: `validate_records` needs
    only `REQUEST.valid_decoded`); its `top_logprobs`, kept as JSON text (`_raw`, UTF-8), are decoded on first
    access."""

    __slots__ = ("_raw",)
    _raw: bytes | None  # the top_logprobs' JSON text (None: none); `_lazy_record` sets it

    def _decode(self) -> Any:
        value = _loads_lists(cast(bytes, self._raw))  # its callers check that there is a text
        dict.__setitem__(self, _TOP, value)
        return value

    def __missing__(self, key: str) -> Any:
        if key == _TOP and self._raw is not None:
            return self._decode()
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key == _TOP and self._raw is not None and not dict.__contains__(self, key):  # type: ignore[operator]  # dict's own lookup, unbound
            return self._decode()
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (key == _TOP and self._raw is not None)  # type: ignore[operator]  # dict's own lookup, unbound


@cache
def _colons(schema: Schema, raw: tuple[str, ...]) -> Callable[[dict[str, Any]], int | None]:
    """record -> the ':' its line holds if the typed decoder (`schema.decoder(raw)`) dropped no key of it at any
    depth, the fields named in `raw` left out (None where a nested value does not re-encode: the strict decoder then
    says why). See `_all_keys_decoded`."""
    text, encode, get = decoded_text_fields(schema, raw), msgspec.json.Encoder().encode, dict.get

    def colons(record: dict[str, Any]) -> int | None:
        n = len(record)  # one per key
        for name in text:
            value = get(record, name)
            if type(value) is str:
                n += value.count(":")
            elif value is not None:
                try:
                    n += encode(value).count(b":")
                except (msgspec.EncodeError, ValueError, RecursionError):
                    return None
        return n

    return colons


def _typed_requests(data: bytes, lines: list[bytes]) -> list[Any]:
    """Per line of requests.jsonl (`data`, split into `lines`), a LazyRecord where the typed decoder read it whole
    (`_all_keys_decoded`), else None (a blank line, or one left to the strict decoder)."""
    decoder, colons = REQUEST.decoder((_TOP,)), _colons(REQUEST, (_TOP,))
    escapes = b"\\" in data and b"\\u003" in data  # else no line holds one
    typed: list[Any] = [None] * len(lines)
    held = [0] * len(lines)  # per typed line, the ':' it holds if the typed decoder dropped no key of it
    for i, line in enumerate(lines):
        try:
            record = decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
        n = colons(record) if not (escapes and b"\\u003" in line) else None
        if n is None:
            continue
        raw = record.pop(_TOP, None)
        if raw is not None:
            raw = bytes(raw)
            n += raw.count(b":") if b":" in raw else 0
        typed[i], held[i] = LazyRecord(record), n
        typed[i]._raw = raw
    _all_keys_decoded(data, lines, typed, held)
    return typed


def _all_keys_decoded(data: bytes, lines: list[bytes], typed: list[Any], held: list[Any]) -> None:
    """Leaves in `typed` only the records of lines whose every key the typed decoder read, once (the others: None).
    It keeps the last of a key written twice and leaves out keys the schema does not list, silently, at any depth,
    where the strict decoder refuses the first and keeps the second. A JSON text holds a ':' after each key and
    inside strings, nowhere else, and a ':' inside a string is one of the decoded string (one written as an escape,
    \\u003a, is not one in the line: such a line is left to the strict decoder). So for each key of a record its
    line holds 1 + the ':' of the key (no field name holds one: `schema.decoded_text_fields`) + those of its value's
    text: none for a number, null, boolean or list of token ids; the decoded string's for a string; the text's own
    for the raw top_logprobs; and for a nested list or object at least as many as the decoded value re-encoded
    holds, as many when no key in it was dropped (`_colons`). A line therefore holds exactly `held` ':' when no key
    of it was dropped at any depth, and more otherwise (a dropped key takes its ':' with it); and the typed lines
    hold their `held` in all only when each holds its own, which one count over the file tells (the lines are
    counted one by one only where it does not)."""
    import numpy as np  # the protocol's writer never reads; bytes.count takes 4-5 times as long

    others = sum(line.count(b":") for line, record in zip(lines, typed) if record is None)
    if int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == ord(":"))) - others == sum(held):
        return
    for i, (line, record) in enumerate(zip(lines, typed)):
        if record is not None and line.count(b":") != held[i]:
            typed[i] = None


def read_requests(path: Path, complete: bool = False, data: bytes | None = None) -> list[Any]:
    """requests.jsonl's records, as `read_jsonl` reads them (the same rules: only the last line of a run not
    marked complete may be cut short), each decoded by the typed decoder where it can (a LazyRecord) and by the
    strict decoder otherwise (a dict). `data`: the file's bytes (`read_bytes`), where the caller has read them."""
    if data is None:
        if not path.exists() and not path.is_symlink():
            return []
        data = read_bytes(path)
    lines = _split_lines(data)
    return _decode_lines(path, lines, complete, _strict, _typed_requests(data, lines))


# A run's top-2 texts, checked and parsed at once. Their shape is checked on what is left once the numbers are taken
# out ('[[[1, -0.5], [7, -2.25]], ...]' leaves '[[[,],[,]],...]'; the typed decoder checked that each number is a
# JSON number), and the numbers are parsed by pyarrow's CSV reader as rows 'id,logprob,' (ids as int64, so an id
# written 75.0 is refused as the schema refuses it; log-probabilities correctly rounded, as json reads them).
_NUMBER = b"0123456789.eE+- "
_POSITION = b"[[,],[,]]"
# the texts, each followed by '\n', as CSV rows: each '[' begins a row, ']' and ' ' go, and the '\n' after a text
# ends its last row as ',' ends the others ('[[[1, -0.5], [7, -2.25]]]\n' reads '\n\n\n1,-0.5,\n7,-2.25,')
_ROWS = bytes.maketrans(b"[\n", b"\n,")


def _parse_pairs(texts: list[bytes], joined: bytes | None = None) -> tuple[Any, Any] | None:
    """(ids (n, 2) int64, logprobs (n, 2) float64) of top-2 texts of the right shape (`top2_parse`: '], [' between
    positions), positions in order; None if a pair is not separated from the one before it by '], [' (as json
    writes them), an id is not an integer (or not an int64) or a log-probability not a number. `joined`: the texts
    each followed by '\\n' (b"\\n".join([*texts, b""])), where the caller has them."""
    import numpy as np  # the protocol's writer never reads
    import pyarrow as pa
    import pyarrow.csv as csv

    if b"[]" in texts:  # no positions (a row of their own would be a lone ',')
        texts, joined = [t for t in texts if t != b"[]"], None
    if not texts:
        return np.empty((0, 2), dtype=np.int64), np.empty((0, 2))
    if joined is None:
        joined = b"\n".join([*texts, b""])
    try:
        # one thread: Arrow's thread pool can abort the interpreter at exit ("terminate called without an active
        # exception", apache/arrow#34314; seen once here on `compare`), and check's two processes use both cores anyway
        table = csv.read_csv(
            pa.py_buffer(joined.translate(_ROWS, b"] ")),
            read_options=csv.ReadOptions(column_names=["id", "lp", "end"], use_threads=False),
            convert_options=csv.ConvertOptions(
                column_types={"id": pa.int64(), "lp": pa.float64()},
                include_columns=["id", "lp"],
                null_values=[],
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    # the rows read any spacing between pairs: a text of n positions (2n rows) holds '], [' 2n - 1 times (between
    # its pairs and its positions) where json wrote it, fewer otherwise (never more: the shape allows no other)
    if joined.count(b"], [") != table.num_rows - len(texts):
        return None
    ids, lps = (_numpy(table.column(c), dtype) for c, dtype in (("id", np.int64), ("lp", np.float64)))
    if ids is None or lps is None:
        return None
    return ids.reshape(-1, 2), lps.reshape(-1, 2)


def _numpy(column: Any, dtype: Any) -> Any:
    """A column of numbers as a writable numpy array (None where it holds a null), from its data buffer: pyarrow's
    own `to_numpy` imports pandas (~0.5 s; in check's worker, before its first run is loaded)."""
    import numpy as np  # lazy: the protocol's writer never reads

    arr = column.combine_chunks()
    if arr.null_count:  # none is read as a null (null_values=[]): refused as a number that is not one
        return None
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset).copy()


def top2_parse(records: list[Any]) -> tuple[list[Any], list[int], Any, Any]:
    """(records, their position counts, ids, logprobs) of those LazyRecords whose top_logprobs text is a top-2 list
    at every position; the others are left out (their own decoded lists are read)."""
    texts = [rec._raw for rec in records]
    counts = [0 if t == b"[]" else t.count(b"]], [[") + 1 for t in texts]
    shape = {n: b"[" + b",".join([_POSITION] * n) + b"]" for n in set(counts)}
    shapes = list(map(shape.__getitem__, counts))
    joined: bytes | None
    joined = b"\n".join([*texts, b""])
    if joined.translate(None, _NUMBER) != b"\n".join([*shapes, b""]):
        keep = [i for i, (t, s) in enumerate(zip(texts, shapes)) if t.translate(None, _NUMBER) == s]
        records, texts, counts = [records[i] for i in keep], [texts[i] for i in keep], [counts[i] for i in keep]
        joined = None
    parsed = _parse_pairs(texts, joined)
    if parsed is None:  # one text holds an id that is not an int64: parse them one by one, leaving it out
        one: list[tuple[Any, Any, Any]] = [(rec, t, _parse_pairs([t])) for rec, t in zip(records, texts)]
        one = [x for x in one if x[2] is not None]
        records, texts = [x[0] for x in one], [x[1] for x in one]
        import numpy as np

        parsed = (
            np.concatenate([x[2][0] for x in one] or [np.empty((0, 2), dtype=np.int64)]),
            np.concatenate([x[2][1] for x in one] or [np.empty((0, 2))]),
        )
        counts = [0 if t == b"[]" else t.count(b"]], [[") + 1 for t in texts]
    return records, counts, parsed[0], parsed[1]
