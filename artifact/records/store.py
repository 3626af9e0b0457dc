"""Run records, the one on-disk contract between the protocol and everything that reads results.

A run directory holds:
  manifest.json   written at start (status "incomplete") and finalised at the end (status "complete"),
                  always replaced atomically;
  requests.jsonl  one line per request, appended and flushed as it happens;
  episodes.jsonl  one line per unit (an episode, an item): the workload's verdict, number of requests, error.
Readers find runs by their manifests under a results directory, never by directory names. Every field of the three
record kinds is typed in `schema` (MANIFEST, REQUEST, UNIT): the writer refuses a record that breaks it, and the
readers validate what they load through the same schema.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from artifact.errors import ArtifactError
from artifact.records.schema import MANIFEST as MANIFEST_SCHEMA
from artifact.records.schema import REQUEST, UNIT, Schema

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
EPISODES = "episodes.jsonl"
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


def _corrupt(path: Path, lineno: int, complete: bool) -> ArtifactError:
    why = " (cut short?) in a run marked complete" if complete else ""
    return ArtifactError(f"{path}:{lineno}: not valid JSON{why}; the record is corrupt")


def _read_jsonl(path: Path, complete: bool = False) -> list[dict]:
    """The records of a JSON-lines file. Only the last line of an interrupted (not complete) run may be cut short
    and is then dropped; any other line that does not decode is corruption (ArtifactError naming file and line)."""
    if not path.exists():
        return []
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if not complete and fh.readline() == "":
                    break
                raise _corrupt(path, lineno, complete) from None
    return rows


# Readers need every request's token ids but rarely the top-2 log-probabilities (the report reads those of one
# request), and those are most of the bytes of requests.jsonl: at paper scale, decoding them took 4.3 of the 4.9 s
# spent reading records. `read_requests` therefore leaves them as text until first accessed. It returns the same
# records as `_read_jsonl` (same rules: only the last line of a run not marked complete may be cut short); a line
# whose top_logprobs are not plain numbers falls back to decoding the whole line.

_TOP_LOGPROBS = re.compile(r'"top_logprobs": (\[[-0-9.eE+,\[\] INaNfinity]*\])')


class LazyRecord(dict):
    """A request record whose `top_logprobs` are decoded from their JSON text on first access."""

    __slots__ = ("_raw",)

    def _decode(self):
        value = json.loads(self._raw)
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
    m = _TOP_LOGPROBS.search(line)
    if m is not None:
        try:
            rec = json.loads(line[:m.start(1)] + "0" + line[m.end(1):])
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and rec.get("top_logprobs") == 0:
            del rec["top_logprobs"]
            lazy = LazyRecord(rec)
            lazy._raw = m.group(1)
            return lazy
    return json.loads(line)


def read_requests(path: Path, complete: bool = False) -> list:
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(_decode_line(line))
        except json.JSONDecodeError:
            if lineno == len(lines) and not complete:  # the last line of an interrupted run may be cut short
                break
            raise _corrupt(path, lineno, complete) from None
    return rows


@dataclass
class Run:
    path: Path
    manifest: dict
    _requests: list | None = field(default=None, repr=False)
    _episodes: list | None = field(default=None, repr=False)
    _integrity: list | None = field(default=None, repr=False)

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


def integrity_problems(run: Run) -> list[str]:
    """A run marked complete is whole: each episode its manifest lists is listed once, has exactly one record in
    episodes.jsonl and its requests in requests.jsonl (as many as that record's n_requests, with distinct
    request_index values), and no record belongs to an episode the manifest does not list. One line per problem,
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
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError:
        raise ArtifactError(f"{mf}: not valid JSON; the record is corrupt") from None
    if not MANIFEST_SCHEMA.valid(manifest):
        raise ArtifactError(f"{mf}: {MANIFEST_SCHEMA.problem(manifest)}")
    return Run(path, manifest)


def find_runs(results_dir: Path) -> list[Run]:
    """Every run under `results_dir` (complete or not), found by manifest; discarded runs are skipped."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise ArtifactError(f"results directory {results_dir} does not exist")
    runs = [
        load_run(mf.parent)
        for mf in sorted(results_dir.rglob(MANIFEST))
        if DISCARDED not in mf.relative_to(results_dir).parts
    ]
    return sorted(runs, key=lambda r: (r.manifest["config"], r.manifest["plan"], r.manifest["arm"] != "off",
                                       r.manifest["arm"], r.manifest["run"]))
