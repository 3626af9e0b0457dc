"""Run records, the one on-disk contract between the protocol and everything that reads results.

A run directory holds:
  manifest.json   written at start (status "incomplete") and finalised at the end (status "complete"),
                  always replaced atomically;
  requests.jsonl  one line per request, appended and flushed as it happens;
  episodes.jsonl  one line per unit (an episode, an item): the workload's verdict, number of requests, error;
Nothing else in a run directory is read as records: what the reader decoded and validated is cached by the checker
outside the results (`decoded`; a `requests.decoded.msgpack` earlier versions wrote beside requests.jsonl is ignored).
Readers find runs by their manifests under a results directory, never by directory names, and refuse a symbolic
link there (a run directory, or a record file, that is a link could count one run's records twice or bring in
records from outside). Every field of the three record kinds is typed in `schema` (MANIFEST, REQUEST, UNIT): the
writer refuses a record that breaks it, and the readers validate what they load through the same schema. Readers
decode strictly: a JSON object that holds a key twice, nesting too deep to decode, or text that is not UTF-8 is
corruption (ArtifactError naming file and line), never read as something else (how a file's bytes become records:
`reading`).

One module: the run directory's contract, its writer, the `Run` that reads it and every check of what was read
(validation, integrity, top-2 texts), kept together so that what is written and what is accepted are read side by side.
"""

from __future__ import annotations

from typing import IO, Any, Callable, cast
import itertools
import json
import operator
import os
import stat
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path


from artifact.errors import ArtifactError
from artifact.records import decoded, listing
from artifact.records.listing import Listing
from artifact.records.reading import (
    MAX_MANIFEST_BYTES,
    LazyRecord,
    corrupt,
    loads,
    read_bytes,
    read_jsonl,
    read_requests,
    read_text,
    top2_parse,
    why_corrupt,
)
from artifact.records.schema import MANIFEST as MANIFEST_SCHEMA
from artifact.records.schema import (
    LOGPROB_TOLERANCE,
    PROB_SUM_TOLERANCE,
    REQUEST,
    UNIT,
    Schema,
    top_logprobs_problem,
)

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
EPISODES = "episodes.jsonl"
TENANTS = "tenants.jsonl"  # runs of a plan with background tenants: their requests and the measured intervals
DISCARDED = "discarded"  # incomplete runs are moved here, never deleted


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a temporary file beside it, flushed to disk, then renamed into place (a
    reader finds the old file, or the new one whole)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _valid(schema: Schema, record: dict[str, Any], where: Path) -> dict[str, Any]:
    """The writer's side of the schema: a record that breaks it is a bug of the artifact, never written."""
    if not schema.valid(record):
        raise ArtifactError(
            f"refusing to write a {schema.kind} record to {where}: {schema.problem(record)} "
            "(a bug of the artifact: please report it)"
        )
    return record


class RunWriter:
    """Writes one run; `finish()` marks it complete. A run never finished stays 'incomplete' on disk."""

    def __init__(self, run_dir: Path, manifest: dict[str, Any]):
        if (run_dir / MANIFEST).exists():
            raise ArtifactError(f"{run_dir} already holds a run; refusing to overwrite it")
        self.dir = run_dir
        self.manifest = _valid(
            MANIFEST_SCHEMA,
            {**manifest, "status": "incomplete", "started_at": now_iso(), "finished_at": None},
            run_dir / MANIFEST,
        )
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / MANIFEST, self.manifest)
        self._requests = open(run_dir / REQUESTS, "a", encoding="utf-8")
        self._episodes = open(run_dir / EPISODES, "a", encoding="utf-8")

    @staticmethod
    def _append(fh: IO[str], record: dict[str, Any]) -> None:
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        fh.flush()

    def request(self, record: dict[str, Any]) -> None:
        self._append(self._requests, _valid(REQUEST, record, self.dir / REQUESTS))

    def episode(self, record: dict[str, Any]) -> None:
        self._append(self._episodes, _valid(UNIT, record, self.dir / EPISODES))

    def update(self, **fields: Any) -> None:
        self.manifest.update(fields)
        write_json_atomic(self.dir / MANIFEST, _valid(MANIFEST_SCHEMA, self.manifest, self.dir / MANIFEST))

    def finish(self, **fields: Any) -> None:
        self.close()
        self.update(**fields, status="complete", finished_at=now_iso())

    def close(self) -> None:
        for fh in (self._requests, self._episodes):
            if not fh.closed:
                os.fsync(fh.fileno())
                fh.close()


@dataclass
class Run:
    path: Path
    manifest: dict[str, Any]
    _requests: list[Any] | None = field(default=None, repr=False)
    _episodes: list[Any] | None = field(default=None, repr=False)
    _integrity: list[Any] | None = field(default=None, repr=False)
    _top2: tuple[Any, dict[int, tuple[int, int]]] | None = field(default=None, repr=False)
    _top2_arrays: tuple[list[Any], list[int], Any, Any] | None = field(default=None, repr=False)
    _by_episode: dict[str, Any] | None = field(default=None, repr=False)
    _episode_outputs: dict[str, Any] | None = field(default=None, repr=False)
    # the request records and their top-2 arrays came from the checker's cache (`decoded`): check validated them
    # when it cached them, from the same bytes (`validate_records` checks only the episodes then)
    _validated: bool = field(default=False, repr=False)
    # requests.jsonl's bytes as read (`read_bytes`) and their sha256, where known: what the cache is keyed by
    _data: bytes | None = field(default=None, repr=False)
    _sha256: str | None = field(default=None, repr=False)
    cache: str = field(default="none", repr=False)  # what check's loading did with the cache (`cache_validated`)

    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == "complete"

    @property
    def label(self) -> str:
        m = self.manifest
        return f"{m['config']}/{m['plan']}/{m['arm']}-run{m['run']}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        if self._requests is None:
            self._read_requests()
        return cast("list[dict[str, Any]]", self._requests)  # `_read_requests` set it

    def _read_requests(self) -> None:
        """requests.jsonl's records (`read_requests`), from the checker's cache where it holds the records of the
        file's bytes as they are, read by this reader, for the run in its present state (`decoded.lookup`). Nothing
        in the run's own directory but requests.jsonl is read for them."""
        path = self.path / REQUESTS
        if not decoded.wanted() or not path.is_file() or path.is_symlink():
            self._requests = read_requests(path, self.complete)
            return
        data = self.request_bytes()
        got = decoded.lookup(data, self.sha256(), self.complete, _lazy_record)
        if got is None:
            self._requests = read_requests(path, self.complete, data)
            return
        self._requests, self._top2_arrays = got
        self._validated = True

    def request_bytes(self) -> bytes:
        """requests.jsonl's bytes as the reader reads them (`read_bytes`; memoised until the records are read)."""
        if self._data is None:
            self._data = read_bytes(self.path / REQUESTS)
        return self._data

    def sha256(self) -> str:
        """The sha256 of `request_bytes` (memoised): the checker's cache's key."""
        if self._sha256 is None:
            self._sha256 = decoded.digest(self.request_bytes())
        return self._sha256

    def in_cache(self) -> bool:
        """Whether the checker's cache holds an entry for this run's requests.jsonl as it is now (a hint for where
        to read it: `decoded.lookup` checks the entry)."""
        path = self.path / REQUESTS
        if not decoded.any_entries() or not path.is_file() or path.is_symlink():
            return False
        try:
            return decoded.cached(self.sha256(), self.complete)
        except ArtifactError:
            return False

    @property
    def episodes(self) -> list[dict[str, Any]]:
        if self._episodes is None:
            self._episodes = read_jsonl(self.path / EPISODES, self.complete)
        return self._episodes

    def top2_arrays(self) -> tuple[list[Any], list[int], Any, Any]:
        """The run's top-2 log-probabilities parsed at once (memoised; `top2_parse`): (records, position counts,
        ids (n, 2) int64, logprobs (n, 2)), positions in record order, for each record whose top_logprobs text is a
        top-2 list at every position, as the engines write them; at paper scale ~1.4 million positions."""
        if self._top2_arrays is None:
            self._top2_arrays = top2_parse([r for r in self.requests if type(r) is LazyRecord and r._raw is not None])
        return self._top2_arrays

    def top2_table(self) -> tuple[Any, dict[int, tuple[int, int]]]:
        """The run's top-2 positions as one (n, 4) array [id1, logprob1, id2, logprob2] (ids as floats), and
        id(request record) -> (first row, rows) of its positions there, for the records of `top2_arrays` (memoised;
        the analyses index it for many requests at once)."""
        if self._top2 is None:
            import numpy as np

            records, counts, ids, lps = self.top2_arrays()
            table = np.column_stack([ids[:, 0], lps[:, 0], ids[:, 1], lps[:, 1]]).astype(float)
            starts = np.cumsum([0, *counts[:-1]]).tolist() if records else []
            self._top2 = (table, dict(zip(map(id, records), zip(starts, counts))))
        return self._top2

    def top2(self) -> dict[int, Any]:
        """id(request record) -> its top_logprobs as an (n, 4) array [id1, logprob1, id2, logprob2] (a view of
        `top2_table`), for the records of `top2_arrays`; the others are left out (read their `top_logprobs`)."""
        table, rows = self.top2_table()
        return {key: table[start : start + n] for key, (start, n) in rows.items()}

    def requests_by_episode(self) -> dict[str, list[dict[str, Any]]]:
        """episode id -> its requests in request_index order (memoised: the analyses ask for it per comparison; do
        not change the lists)."""
        if self._by_episode is None:
            out: dict[str, list[dict[str, Any]]] = {e: [] for e in self.manifest["episodes"]}
            for r in self.requests:
                out.setdefault(r["episode_id"], []).append(r)
            for reqs in out.values():
                reqs.sort(key=lambda r: r["request_index"])
            self._by_episode = out
        return self._by_episode

    def episode_outputs(self) -> dict[str, tuple[list[Any], list[Any], list[Any], list[Any]]]:
        """episode id -> `outputs` of its requests in request_index order (`requests_by_episode`; memoised: each run
        is compared with several others and walked by the analyses; check's loading makes it, in the worker too);
        do not change the lists."""
        if self._episode_outputs is None:
            self._episode_outputs = {eid: outputs(reqs) for eid, reqs in self.requests_by_episode().items()}
        return self._episode_outputs

    def integrity_problems(self) -> list[str]:
        """Why a run marked complete is not whole (memoised; empty for a whole run and for an incomplete one,
        which is invalid for being incomplete): see `integrity_problems`."""
        if self._integrity is None:
            self._integrity = integrity_problems(self) if self.complete else []
        return self._integrity


_TOKENS = operator.itemgetter("output_tokens")
_PROMPT = operator.itemgetter("prompt_sha256")


def outputs(reqs: list[dict[str, Any]]) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """(output_tokens, prompt_sha256, error, number of output tokens) of each request, as four lists (dict.get: never
    decodes lazy fields): what comparing two runs reads of them (analysis.divergence)."""
    tokens = list(map(_TOKENS, reqs))
    return (
        tokens,
        list(map(_PROMPT, reqs)),
        list(map(dict.get, reqs, itertools.repeat("error"))),
        list(map(len, tokens)),
    )


def validate_records(run: Run) -> None:
    """Raise ArtifactError (one line naming file, line and field) where a record of the run breaks the records'
    schema: its fields and rules (artifact.records.schema, the one the writer enforces), the top_logprobs the typed
    decoder left as text included (`top2_problem`)."""
    requests = run.requests
    for schema, records in ((REQUEST, [] if run._validated else requests), (UNIT, run.episodes)):
        valid, typed = schema.valid, schema.valid_decoded
        if all((typed if type(r) is LazyRecord else valid)(r) for r in records):  # one compiled test per record
            continue
        i, record = next((i, r) for i, r in enumerate(records, 1) if not (typed if type(r) is LazyRecord else valid)(r))
        # a LazyRecord's fields were typed by its decoder: its problem is a required field or a rule (its top_logprobs
        # text, still undecoded, is left to top2_problem)
        raise ArtifactError(f"{run.path / schema.file}:{i}: {schema.problem(dict(record))}")
    bad = None if run._validated else top2_problem(run)
    if bad is not None:
        raise ArtifactError(f"{run.path / REQUESTS}:{bad[0]}: {bad[1]}")


def _lazy_record(fields: dict[str, Any], raw: bytes | None) -> LazyRecord:
    rec = LazyRecord(fields)
    rec._raw = raw
    return rec


def cache_validated(run: Run) -> str:
    """Keep a run's request records in the checker's cache (`decoded.store`) once `validate_records` has passed on
    them; what happened: "read" (they came from the cache), "written", or "none" (cache off, nothing to keep, or a
    record the typed decoder did not read). Never raises for the cache's sake (it is only ever a shortcut)."""
    if run._validated:
        return "read"
    path = run.path / REQUESTS
    if not decoded.wanted() or not path.is_file() or path.is_symlink():
        return "none"
    try:
        data = run.request_bytes()
        stored = decoded.store(data, run.sha256(), run.complete, run.requests, run.top2_arrays())
    except (ArtifactError, OSError):
        return "none"
    except Exception as exc:  # a bug in making the shortcut must not fail a check
        print(
            f"warning: {run.path} not cached ({type(exc).__name__}: {exc}); its {REQUESTS} is decoded next time "
            "too (please report this)",
            file=sys.stderr,
        )
        return "none"
    return "written" if stored else "none"


def _text_problem(rec: LazyRecord, complete: bool) -> str | None:
    """The schema's verdict on one record's top_logprobs text, decoded by the strict decoder (and kept)."""
    try:
        top = rec._decode()
    except (ValueError, RecursionError) as exc:
        return why_corrupt(exc, complete)
    return (
        top_logprobs_problem(top, dict.__getitem__(rec, "output_tokens"))
        if isinstance(top, list)
        else f"field 'top_logprobs' must be list, not {type(top).__name__}"
    )


def top2_problem(run: Run) -> tuple[int, str] | None:
    """(record number, reason) of the first request whose top_logprobs, left as text by the typed decoder, break
    the schema's rule (`schema.top_logprobs_problem`), or None. The top-2 texts (`Run.top2_arrays`) are checked at
    once on their numbers: one position per token, finite log-probabilities <= 0 (LOGPROB_TOLERANCE), two different
    ids whose probabilities sum to <= 1 (PROB_SUM_TOLERANCE), best first, the emitted token the most likely (a tie
    may list another first). A text of another shape, and a record the bulk check finds wrong, is decoded and
    judged by the rule itself, which words the reason."""
    import numpy as np

    records, counts_list, ids, lps = run.top2_arrays()
    parsed = set(map(id, records))
    suspects = [r for r in run.requests if type(r) is LazyRecord and r._raw is not None and id(r) not in parsed]
    tokens = [dict.__getitem__(r, "output_tokens") for r in records]
    counts = np.asarray(counts_list, dtype=np.int64)
    aligned = np.array([len(t) for t in tokens], dtype=np.int64) == counts
    everywhere = bool(aligned.all())  # as the engines write them: then the arrays are taken whole, not copied
    if not everywhere:
        suspects += [r for r, a in zip(records, aligned) if not a]
    kept = records if everywhere else [r for r, a in zip(records, aligned) if a]
    ends = np.cumsum(counts if everywhere else counts[aligned])
    try:
        t = np.fromiter(
            itertools.chain.from_iterable(r["output_tokens"] for r in kept),
            dtype=np.int64,
            count=int(ends[-1]) if kept else 0,
        )
    except OverflowError:  # a token id beyond int64: each record is judged by the rule itself
        suspects += kept
    else:
        at = slice(None) if everywhere else np.repeat(aligned, counts)
        (i1, i2), (l1, l2) = ids[at].T, lps[at].T
        with np.errstate(over="ignore"):  # exp of a log-probability far above 0: refused below anyway
            total = np.exp(l1) + np.exp(l2)
        ok = (
            np.isfinite(l1)
            & np.isfinite(l2)
            & (l1 <= LOGPROB_TOLERANCE)
            & (i1 != i2)
            & (total <= 1 + PROB_SUM_TOLERANCE)
            & (l1 >= l2)
            & ((i1 == t) | ((i2 == t) & (l2 == l1)))
        )
        suspects += [kept[k] for k in np.unique(np.searchsorted(ends, np.flatnonzero(~ok), side="right"))]
    if not suspects:
        return None
    number = {id(r): i for i, r in enumerate(run.requests, 1)}
    for rec in sorted(suspects, key=lambda r: number[id(r)]):
        why = _text_problem(rec, run.complete)
        if why:
            return number[id(rec)], why
    return None


def integrity_problems(run: Run) -> list[str]:
    """A run marked complete is whole: each episode its manifest lists is listed once, has exactly one record in
    episodes.jsonl and its requests in requests.jsonl (as many as that record's n_requests, with request_index
    running 0, 1, ..., n-1), and no record belongs to an episode the manifest does not list. One line per problem,
    at most one per kind (the first offending episode is named)."""
    listed = run.manifest["episodes"]
    where = f"{run.label} is marked complete but"
    problems = []
    seen: set[Any] = set()
    twice = next((e for e in listed if e in seen or seen.add(e)), None)  # type: ignore[func-returns-value]  # add() as a side effect
    if twice is not None:
        problems.append(f"{where} its manifest lists episode {twice} twice ({run.path})")
    records: dict[Any, Any] = {}
    for e in run.episodes:
        eid = e.get("episode_id")
        if eid in records:
            problems.append(f"{where} episodes.jsonl holds episode {eid} twice ({run.path})")
            break
        records[eid] = e
    by_episode: dict[Any, list[Any]] = {}
    get = dict.get  # plain lookups: the records may be LazyRecords
    for r in run.requests:
        by_episode.setdefault(get(r, "episode_id"), []).append(get(r, "request_index"))
    checks: tuple[tuple[str, Callable[[Any], bool]], ...] = (
        ("has no episode record (verdict) for", lambda e: e not in records),
        ("has no requests for", lambda e: not by_episode.get(e) and get(records.get(e, {}), "n_requests") != 0),
        (
            "holds a different number of requests than its episode record says for",
            lambda e: e in records
            and type(get(records[e], "n_requests")) is int
            and get(records[e], "n_requests") != len(by_episode.get(e, ())),
        ),
        ("holds a request_index twice for", lambda e: len(set(by_episode.get(e, ()))) != len(by_episode.get(e, ()))),
        (
            "holds request_index values that do not run 0..n-1 for",
            lambda e: sorted(by_episode.get(e, ())) != list(range(len(by_episode.get(e, ())))),
        ),
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
        manifest = loads(read_text(mf, MAX_MANIFEST_BYTES))
    except (ValueError, RecursionError) as exc:
        raise corrupt(mf, None, exc, False) from None
    if not MANIFEST_SCHEMA.valid(manifest):
        raise ArtifactError(f"{mf}: {MANIFEST_SCHEMA.problem(manifest)}")
    return Run(path, manifest)


RECORD_FILES = (MANIFEST, REQUESTS, EPISODES, TENANTS)


def read_tenants(run: Run) -> list[dict[str, Any]] | None:
    """The run's tenants.jsonl records (None: the run has no such file), decoded as every record file is; the
    schema (`schema.TENANT`) is the caller's to apply."""
    path = run.path / TENANTS
    if not path.exists() and not path.is_symlink():
        return None
    return read_jsonl(path, run.complete)


MAX_LOG_BYTES = 256 << 20  # a server log larger than this is not read (a session of 1,000 requests logs ~1 MiB)


def read_server_log(run: Run) -> str | None:
    """The text of the run's server-session log (manifest `server_log`, relative to the run's plan directory), or
    None where it was not kept. The record files' rules hold for it: a relative path under the plan directory
    (no '..'), no symbolic link on the way, a regular file (never a pipe or a device, which would block or never
    end), at most MAX_LOG_BYTES; anything else is an ArtifactError naming the manifest or the file. Bytes that are
    not UTF-8 are replaced (a log is evidence read by pattern, not a record decoded field by field)."""
    rel = run.manifest.get("server_log")
    if rel is None:
        return None
    mf = run.path / MANIFEST
    parts = Path(rel).parts if isinstance(rel, str) else ()
    if not parts or Path(rel).is_absolute() or ".." in parts or "\0" in rel:
        raise ArtifactError(
            f"{mf}: field 'server_log' ({rel!r}) must be a relative path under the run's plan "
            f"directory ({run.path.parent}), without '..'; refusing to read it"
        )
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
        raise ArtifactError(
            f"{path}: the server log is not a regular file (a pipe, device or directory); refusing to read it"
        )
    if st.st_size > MAX_LOG_BYTES:
        raise ArtifactError(
            f"{path}: the server log holds {st.st_size} bytes, more than the {MAX_LOG_BYTES} a "
            "server log may; refusing to read it"
        )
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
        raise ArtifactError(
            f"{path} is a symbolic link ({what} -> {os.readlink(path)}): results must hold their "
            "records themselves; a link could count another run's records twice or bring in "
            "records from outside (copy the files instead)"
        )


def find_runs(results_dir: Path, skip: Path | None = None, listed: Listing | None = None) -> list[Run]:
    """Every run under `results_dir` (complete or not), found by manifest; discarded runs are skipped. What is
    looked at is the results directory's one listing (`listing.entries`: every entry under it but `skip`, a check's
    output folder), given as `listed` where the caller made it. A directory or record file under it that is a
    symbolic link is refused (ArtifactError), as is an entry that cannot be read."""
    results_dir = Path(results_dir)
    listed = listed if listed is not None else listing.entries(results_dir, skip)
    children: dict[str, list[listing.Entry]] = defaultdict(list)
    for e in listed:
        children[os.path.dirname(e.rel)].append(e)
    runs = []
    todo = [""]  # the folders in the order a top-down walk of sorted names visits them, discarded ones left out
    while todo:
        rel = todo.pop()
        here = results_dir / rel if rel else results_dir
        inside = children.get(rel, [])
        folders = [e for e in inside if e.kind == "d" and os.path.basename(e.rel) != DISCARDED]
        for e in inside:  # a link to a folder: refused, as a folder that is a link
            if e.kind == "l" and os.path.basename(e.rel) != DISCARDED and os.path.isdir(results_dir / e.rel):
                _refuse_link(results_dir / e.rel, "a directory")
        names = {os.path.basename(e.rel) for e in inside}
        if MANIFEST in names:
            for name in RECORD_FILES:
                _refuse_link(here / name, "a record file")
            runs.append(load_run(here))
        todo.extend(e.rel for e in reversed(folders))
    return sorted(
        runs,
        key=lambda r: (
            r.manifest["config"],
            r.manifest["plan"],
            r.manifest["arm"] != "off",
            r.manifest["arm"],
            r.manifest["run"],
        ),
    )
