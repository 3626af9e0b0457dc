"""Run records, the one on-disk contract between the protocol and everything that reads results.

A run directory holds:
  manifest.json   written at start (status "incomplete") and finalised at the end (status "complete"),
                  always replaced atomically;
  requests.jsonl  one line per request, appended and flushed as it happens;
  episodes.jsonl  one line per unit (an episode, an item): the workload's verdict, number of requests, error.
Readers find runs by their manifests under a results directory, never by directory names, and refuse a symbolic
link there (a run directory, or a record file, that is a link could count one run's records twice or bring in
records from outside). Every field of the three record kinds is typed in `schema` (MANIFEST, REQUEST, UNIT): the
writer refuses a record that breaks it, and the readers validate what they load through the same schema. Readers
decode strictly: a JSON object that holds a key twice, nesting too deep to decode, or text that is not UTF-8 is
corruption (ArtifactError naming file and line), never read as something else.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from artifact.errors import ArtifactError
from artifact.records.schema import MANIFEST as MANIFEST_SCHEMA
from artifact.records.schema import REQUEST, UNIT, Schema, top_logprobs_problem

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
EPISODES = "episodes.jsonl"
TENANTS = "tenants.jsonl"  # runs of a plan with background tenants: their requests and the measured intervals
DISCARDED = "discarded"  # incomplete runs are moved here, never deleted


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _valid(schema: Schema, record: dict, where: Path) -> dict:
    """The writer's side of the schema: a record that breaks it is a bug of the artifact, never written."""
    if not schema.valid(record):
        raise ArtifactError(f"refusing to write a {schema.kind} record to {where}: {schema.problem(record)} "
                            "(a bug of the artifact: please report it)")
    return record


class RunWriter:
    """Writes one run; `finish()` marks it complete. A run never finished stays 'incomplete' on disk."""

    def __init__(self, run_dir: Path, manifest: dict):
        if (run_dir / MANIFEST).exists():
            raise ArtifactError(f"{run_dir} already holds a run; refusing to overwrite it")
        self.dir = run_dir
        self.manifest = _valid(MANIFEST_SCHEMA, {**manifest, "status": "incomplete", "started_at": now_iso(),
                                                 "finished_at": None}, run_dir / MANIFEST)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / MANIFEST, self.manifest)
        self._requests = open(run_dir / REQUESTS, "a", encoding="utf-8")
        self._episodes = open(run_dir / EPISODES, "a", encoding="utf-8")

    @staticmethod
    def _append(fh, record: dict) -> None:
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        fh.flush()

    def request(self, record: dict) -> None:
        self._append(self._requests, _valid(REQUEST, record, self.dir / REQUESTS))

    def episode(self, record: dict) -> None:
        self._append(self._episodes, _valid(UNIT, record, self.dir / EPISODES))

    def update(self, **fields) -> None:
        self.manifest.update(fields)
        write_json_atomic(self.dir / MANIFEST, _valid(MANIFEST_SCHEMA, self.manifest, self.dir / MANIFEST))

    def finish(self, **fields) -> None:
        self.close()
        self.update(**fields, status="complete", finished_at=now_iso())

    def close(self) -> None:
        for fh in (self._requests, self._episodes):
            if not fh.closed:
                os.fsync(fh.fileno())
                fh.close()


class DuplicateKey(ValueError):
    """A JSON object that holds one key twice (a decoder would keep the last silently)."""


def _unique_keys(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        raise DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


loads = json.JSONDecoder(object_pairs_hook=_unique_keys).decode  # json.loads, refusing duplicate keys


def _corrupt(path: Path, lineno: int | None, exc: Exception, complete: bool) -> ArtifactError:
    where = f"{path}:{lineno}" if lineno is not None else str(path)
    if isinstance(exc, DuplicateKey):
        why = f"a JSON object holds the key {exc.args[0]!r} twice"
    elif isinstance(exc, RecursionError):
        why = "JSON nested too deeply to decode"
    else:
        why = "not valid JSON" + (" (cut short?) in a run marked complete" if complete else "")
    return ArtifactError(f"{where}: {why}; the record is corrupt")


def read_text(path: Path) -> str:
    """A record file's text; one line naming the file where it is not readable UTF-8 text. Only a regular file is
    opened (a named pipe or a device would block or never end)."""
    try:
        if path.exists() and not path.is_file() and not path.is_dir():  # a directory: "Is a directory" below
            raise ArtifactError(f"{path}: not a regular file; the record is corrupt")
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path}: not UTF-8 text (byte {exc.start}); the record is corrupt") from None
    except OSError as exc:
        raise ArtifactError(f"cannot read {path} ({exc.strerror or exc})") from None


def _read_jsonl(path: Path, complete: bool = False, decode=loads) -> list:
    """The records of a JSON-lines file. Only the last line of an interrupted (not complete) run may be cut short
    and is then dropped; any other line that does not decode is corruption (ArtifactError naming file and line)."""
    if not path.exists() and not path.is_symlink():
        return []
    lines = read_text(path).split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(decode(line))
        except (ValueError, RecursionError) as exc:
            if type(exc) is json.JSONDecodeError and lineno == len(lines) and not complete:
                break  # the last line of an interrupted run may be cut short
            raise _corrupt(path, lineno, exc, complete) from None
    return rows


# Readers need every request's token ids but rarely the top-2 log-probabilities (the report reads those of one
# request), and those are most of the bytes of requests.jsonl: at paper scale, decoding them took 4.3 of the 4.9 s
# spent reading records. `read_requests` therefore leaves them as text until first accessed. It returns the same
# records as `_read_jsonl` (same rules: only the last line of a run not marked complete may be cut short); a line
# whose top_logprobs are not plain numbers falls back to decoding the whole line. The texts are checked against
# the schema's rule in bulk (`top2_problem`), and parsed for the analyses once per run (`Run.top2`).

_TOP_LOGPROBS = re.compile(r'"top_logprobs": (\[[-0-9.eE+,\[\] INaNfinity]*\])')


class LazyRecord(dict):
    """A request record whose `top_logprobs` are decoded from their JSON text on first access."""

    __slots__ = ("_raw",)

    def _decode(self):
        value = loads(self._raw)
        dict.__setitem__(self, "top_logprobs", value)
        self._raw = None
        return value

    def __missing__(self, key):
        if key == "top_logprobs" and self._raw is not None:
            return self._decode()
        raise KeyError(key)

    def get(self, key, default=None):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return self._decode() if key == "top_logprobs" and self._raw is not None else default

    def __contains__(self, key):
        return dict.__contains__(self, key) or (key == "top_logprobs" and self._raw is not None)


def _decode_line(line: str):
    # The match holds only numbers, brackets, commas and spaces, so it cannot run past the value (the next key
    # starts with a quote). If the value holds anything else (null, a string) the match is a proper prefix, which
    # leaves an unmatched "]" behind the placeholder: that line does not decode, and is decoded whole instead.
    # The text holds no JSON object, so no key in it can be doubled; a second "top_logprobs" key is left in the
    # rest, where `loads` refuses it.
    m = _TOP_LOGPROBS.search(line)
    if m is not None:
        try:
            rec = loads(line[:m.start(1)] + "0" + line[m.end(1):])
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and rec.get("top_logprobs") == 0:
            del rec["top_logprobs"]
            lazy = LazyRecord(rec)
            lazy._raw = m.group(1)
            return lazy
    return loads(line)


def read_requests(path: Path, complete: bool = False) -> list:
    return _read_jsonl(path, complete, _decode_line)


_SEPARATORS = str.maketrans("[], ", "\n\n\n\n")


def _parse_top2(texts: list[str]):
    """The numbers of top-2 texts ("[[[id, lp], [id, lp]], ...]"), one flat array in one pass of pandas' C reader;
    None where they are not all numbers."""
    import numpy as np  # noqa: PLC0415  (readers that never ask for it, the protocol's writer, skip the import)
    import pandas as pd  # noqa: PLC0415

    text = "\n".join(texts).translate(_SEPARATORS)
    if not text.strip():
        return np.empty(0)
    try:
        return pd.read_csv(io.StringIO(text), header=None, dtype=float, engine="c")[0].to_numpy()
    except (ValueError, pd.errors.ParserError):
        return None


@dataclass
class Run:
    path: Path
    manifest: dict
    _requests: list | None = field(default=None, repr=False)
    _episodes: list | None = field(default=None, repr=False)
    _integrity: list | None = field(default=None, repr=False)
    _top2: dict | None = field(default=None, repr=False)

    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == "complete"

    @property
    def label(self) -> str:
        m = self.manifest
        return f"{m['config']}/{m['plan']}/{m['arm']}-run{m['run']}"

    @property
    def requests(self) -> list[dict]:
        if self._requests is None:
            self._requests = read_requests(self.path / REQUESTS, self.complete)
        return self._requests

    @property
    def episodes(self) -> list[dict]:
        if self._episodes is None:
            self._episodes = _read_jsonl(self.path / EPISODES, self.complete)
        return self._episodes

    def top2(self) -> dict:
        """id(request record) -> its top_logprobs as an (n, 4) array [id1, logprob1, id2, logprob2], for each record
        whose top_logprobs are still text (LazyRecord) with two entries at every position, as the engines write
        them; the others are left out (read their `top_logprobs`). Parsed in one pass per run, memoised: at paper
        scale the runs hold ~1.4 million positions."""
        if self._top2 is None:
            lazy = [(rec, rec._raw) for rec in self.requests if type(rec) is LazyRecord and rec._raw is not None]
            counts = [raw.count("]]") for _, raw in lazy]  # every position's list ends in "]]"
            vals = _parse_top2([raw for _, raw in lazy]) if lazy else None
            self._top2 = {}
            if vals is not None and vals.size == 4 * sum(counts):
                at = 0
                for (rec, _), n in zip(lazy, counts):
                    self._top2[id(rec)] = vals[at:at + 4 * n].reshape(n, 4)
                    at += 4 * n
        return self._top2

    def requests_by_episode(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {e: [] for e in self.manifest["episodes"]}
        for r in self.requests:
            out.setdefault(r["episode_id"], []).append(r)
        for reqs in out.values():
            reqs.sort(key=lambda r: r["request_index"])
        return out


    def integrity_problems(self) -> list[str]:
        """Why a run marked complete is not whole (memoised; empty for a whole run and for an incomplete one,
        which is invalid for being incomplete): see `integrity_problems`."""
        if self._integrity is None:
            self._integrity = integrity_problems(self) if self.complete else []
        return self._integrity


def validate_records(run: Run) -> None:
    """Raise ArtifactError (one line naming file, line and field) where a record of the run breaks the records'
    schema: its fields and rules (artifact.records.schema, the one the writer enforces), top_logprobs still held as
    text included (`top2_problem`)."""
    for schema, records in ((REQUEST, run.requests), (UNIT, run.episodes)):
        valid = schema.valid
        if all(valid(r) for r in records):  # the common case: one compiled test per record
            continue
        i, record = next((i, r) for i, r in enumerate(records, 1) if not valid(r))
        raise ArtifactError(f"{run.path / schema.file}:{i}: {schema.problem(record)}")
    bad = top2_problem(run)
    if bad is not None:
        raise ArtifactError(f"{run.path / REQUESTS}:{bad[0]}: {bad[1]}")


def _text_problem(rec: LazyRecord) -> str:
    """The schema's verdict on one record's top_logprobs text, decoded."""
    try:
        top = loads(rec._raw)
    except ValueError:
        return "field 'top_logprobs' is not valid JSON"
    return top_logprobs_problem(top, dict.__getitem__(rec, "output_tokens")) if isinstance(top, list) else \
        f"field 'top_logprobs' must be list, not {type(top).__name__}"


def top2_problem(run: Run) -> tuple[int, str] | None:
    """(record number, reason) of the first request whose top_logprobs, still text, break the schema's rule
    (`schema.top_logprobs_problem`), or None. The top-2 texts are checked at once on their parsed numbers
    (`Run.top2`): one position per token, ids integral, best first, the emitted token the most likely (a tie
    may list another first); a text of another shape is decoded and checked on its own."""
    import numpy as np  # noqa: PLC0415

    table = run.top2()
    arrays, tokens, owners = [], [], []
    for i, rec in enumerate(run.requests, 1):
        if type(rec) is not LazyRecord or rec._raw is None:
            continue  # decoded: the schema's rule saw it (validate_records)
        arr, toks = table.get(id(rec)), dict.__getitem__(rec, "output_tokens")
        if arr is None or len(arr) != len(toks):
            why = _text_problem(rec)
            if why:
                return i, why
            continue
        arrays.append(arr)
        tokens += toks
        owners.append((i, len(toks)))
    if not arrays:
        return None
    a, t = np.concatenate(arrays), np.asarray(tokens, dtype=float)
    ok = ((a[:, 0] == np.trunc(a[:, 0])) & (a[:, 2] == np.trunc(a[:, 2])) & (a[:, 1] >= a[:, 3])
          & ((a[:, 0] == t) | ((a[:, 2] == t) & (a[:, 3] == a[:, 1]))))
    if ok.all():
        return None
    first = int(np.argmin(ok))
    ends = np.cumsum([n for _, n in owners])
    k = int(np.searchsorted(ends, first, side="right"))
    i = owners[k][0]
    return i, _text_problem(run.requests[i - 1]) or (
        f"field 'top_logprobs' position {first - int(ends[k] - owners[k][1])}: the emitted token is not the most "
        "likely entry, or an id is not an integer")


def integrity_problems(run: Run) -> list[str]:
    """A run marked complete is whole: each episode its manifest lists is listed once, has exactly one record in
    episodes.jsonl and its requests in requests.jsonl (as many as that record's n_requests, with request_index
    running 0, 1, ..., n-1), and no record belongs to an episode the manifest does not list. One line per problem,
    at most one per kind (the first offending episode is named)."""
    listed = run.manifest["episodes"]
    where = f"{run.label} is marked complete but"
    problems = []
    seen: set = set()
    twice = next((e for e in listed if e in seen or seen.add(e)), None)
    if twice is not None:
        problems.append(f"{where} its manifest lists episode {twice} twice ({run.path})")
    records: dict = {}
    for e in run.episodes:
        eid = e.get("episode_id")
        if eid in records:
            problems.append(f"{where} episodes.jsonl holds episode {eid} twice ({run.path})")
            break
        records[eid] = e
    by_episode: dict = {}
    get = dict.get  # plain lookups: the records may be LazyRecords
    for r in run.requests:
        by_episode.setdefault(get(r, "episode_id"), []).append(get(r, "request_index"))
    checks = (
        ("has no episode record (verdict) for", lambda e: e not in records),
        ("has no requests for", lambda e: not by_episode.get(e) and get(records.get(e, {}), "n_requests") != 0),
        ("holds a different number of requests than its episode record says for",
         lambda e: e in records and type(get(records[e], "n_requests")) is int
         and get(records[e], "n_requests") != len(by_episode.get(e, ()))),
        ("holds a request_index twice for", lambda e: len(set(by_episode.get(e, ()))) != len(by_episode.get(e, ()))),
        ("holds request_index values that do not run 0..n-1 for",
         lambda e: sorted(by_episode.get(e, ())) != list(range(len(by_episode.get(e, ()))))),
    )
    for what, bad in checks:
        first = next((e for e in listed if bad(e)), None)
        if first is not None:
            problems.append(f"{where} {what} episode {first} ({run.path})")
    listed_set = set(listed)
    stray = next((e for e in list(records) + list(by_episode) if e not in listed_set), None)
    if stray is not None:
        problems.append(f"{where} holds records of episode {stray}, which its manifest does not list ({run.path})")
    return problems


def load_run(path: Path) -> Run:
    path = Path(path)
    if path.name == MANIFEST:
        path = path.parent
    mf = path / MANIFEST
    if not mf.exists():
        raise ArtifactError(f"{path} is not a run directory (no {MANIFEST})")
    try:
        manifest = loads(read_text(mf))
    except (ValueError, RecursionError) as exc:
        raise _corrupt(mf, None, exc, False) from None
    if not MANIFEST_SCHEMA.valid(manifest):
        raise ArtifactError(f"{mf}: {MANIFEST_SCHEMA.problem(manifest)}")
    return Run(path, manifest)


RECORD_FILES = (MANIFEST, REQUESTS, EPISODES, TENANTS)


def read_tenants(run: Run) -> list[dict] | None:
    """The run's tenants.jsonl records (None: the run has no such file), decoded as every record file is; the
    schema (`schema.TENANT`) is the caller's to apply."""
    path = run.path / TENANTS
    if not path.exists() and not path.is_symlink():
        return None
    return _read_jsonl(path, run.complete)


MAX_LOG_BYTES = 256 << 20  # a server log larger than this is not read (a session of 1,000 requests logs ~1 MiB)


def read_server_log(run: Run) -> str | None:
    """The text of the run's server-session log (manifest `server_log`, relative to the run's plan directory), or
    None where it was not kept. The record files' rules hold for it: a relative path under the plan directory
    (no '..'), no symbolic link on the way, a regular file (never a pipe or a device, which would block or never
    end), at most MAX_LOG_BYTES; anything else is an ArtifactError naming the manifest or the file. Bytes that are
    not UTF-8 are replaced (a log is evidence read by pattern, not a record decoded field by field)."""
    import stat  # noqa: PLC0415

    rel = run.manifest.get("server_log")
    if rel is None:
        return None
    mf = run.path / MANIFEST
    parts = Path(rel).parts if isinstance(rel, str) else ()
    if not parts or Path(rel).is_absolute() or ".." in parts or "\0" in rel:
        raise ArtifactError(f"{mf}: field 'server_log' ({rel!r}) must be a relative path under the run's plan "
                            f"directory ({run.path.parent}), without '..'; refusing to read it")
    path = run.path.parent
    for part in parts:
        path = path / part
        _refuse_link(path, "a server log")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # not kept (an evidence folder ships logs apart; a copy may leave them out)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path} ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactError(f"{path}: the server log is not a regular file (a pipe, device or directory); refusing "
                            "to read it")
    if st.st_size > MAX_LOG_BYTES:
        raise ArtifactError(f"{path}: the server log holds {st.st_size} bytes, more than the {MAX_LOG_BYTES} a "
                            "server log may; refusing to read it")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path} ({exc.strerror})") from None
    if len(data) > MAX_LOG_BYTES:
        raise ArtifactError(f"{path}: the server log holds more than {MAX_LOG_BYTES} bytes; refusing to read it")
    return data.decode("utf-8", errors="replace")


def _refuse_link(path: Path, what: str) -> None:
    if path.is_symlink():
        raise ArtifactError(f"{path} is a symbolic link ({what} -> {os.readlink(path)}): results must hold their "
                            "records themselves; a link could count another run's records twice or bring in "
                            "records from outside (copy the files instead)")


def find_runs(results_dir: Path) -> list[Run]:
    """Every run under `results_dir` (complete or not), found by manifest; discarded runs are skipped. A directory
    or record file under it that is a symbolic link is refused (ArtifactError), as is an entry that cannot be read."""
    results_dir = Path(results_dir)
    if not results_dir.exists():
        raise ArtifactError(f"results directory {results_dir} does not exist")
    if not results_dir.is_dir():
        raise ArtifactError(f"results path {results_dir} is not a directory (give the folder that holds the runs)")

    def unreadable(exc: OSError) -> None:
        raise ArtifactError(f"cannot read {exc.filename} under the results directory ({exc.strerror})")

    runs = []
    for here, dirs, files in os.walk(results_dir, onerror=unreadable):
        here = Path(here)
        dirs[:] = sorted(d for d in dirs if d != DISCARDED)
        for d in dirs:
            _refuse_link(here / d, "a directory")
        if MANIFEST in files or MANIFEST in dirs:
            for name in RECORD_FILES:
                _refuse_link(here / name, "a record file")
            runs.append(load_run(here))
    return sorted(runs, key=lambda r: (r.manifest["config"], r.manifest["plan"], r.manifest["arm"] != "off",
                                       r.manifest["arm"], r.manifest["run"]))
