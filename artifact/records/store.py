"""Run records, the one on-disk contract between the protocol and everything that reads results.

A run directory holds:
  manifest.json   written at start (status "incomplete") and finalised at the end (status "complete"),
                  always replaced atomically;
  requests.jsonl  one line per request, appended and flushed as it happens;
  episodes.jsonl  one line per episode (BFCL verdict, number of requests, error).
Readers find runs by their manifests under a results directory, never by directory names.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from artifact.errors import ArtifactError

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
EPISODES = "episodes.jsonl"
DISCARDED = "discarded"  # incomplete runs are moved here, never deleted
REQUIRED_MANIFEST_KEYS = ("config", "arm", "run", "plan", "status", "episodes")


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


class RunWriter:
    """Writes one run; `finish()` marks it complete. A run never finished stays 'incomplete' on disk."""

    def __init__(self, run_dir: Path, manifest: dict):
        if (run_dir / MANIFEST).exists():
            raise ArtifactError(f"{run_dir} already holds a run; refusing to overwrite it")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.dir = run_dir
        self.manifest = {**manifest, "status": "incomplete", "started_at": now_iso(), "finished_at": None}
        write_json_atomic(run_dir / MANIFEST, self.manifest)
        self._requests = open(run_dir / REQUESTS, "a", encoding="utf-8")
        self._episodes = open(run_dir / EPISODES, "a", encoding="utf-8")

    @staticmethod
    def _append(fh, record: dict) -> None:
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        fh.flush()

    def request(self, record: dict) -> None:
        self._append(self._requests, record)

    def episode(self, record: dict) -> None:
        self._append(self._episodes, record)

    def update(self, **fields) -> None:
        self.manifest.update(fields)
        write_json_atomic(self.dir / MANIFEST, self.manifest)

    def finish(self, **fields) -> None:
        self.close()
        self.update(**fields, status="complete", finished_at=now_iso())

    def close(self) -> None:
        for fh in (self._requests, self._episodes):
            if not fh.closed:
                os.fsync(fh.fileno())
                fh.close()


def _read_jsonl(path: Path) -> list[dict]:
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
                # The last line of an interrupted run may be cut short; anything else is corruption.
                if fh.readline() == "":
                    break
                raise ArtifactError(f"{path}:{lineno}: not valid JSON; the record is corrupt") from None
    return rows


@dataclass
class Run:
    path: Path
    manifest: dict
    _requests: list | None = field(default=None, repr=False)
    _episodes: list | None = field(default=None, repr=False)

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
            self._requests = _read_jsonl(self.path / REQUESTS)
        return self._requests

    @property
    def episodes(self) -> list[dict]:
        if self._episodes is None:
            self._episodes = _read_jsonl(self.path / EPISODES)
        return self._episodes

    def requests_by_episode(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {e: [] for e in self.manifest["episodes"]}
        for r in self.requests:
            out.setdefault(r["episode_id"], []).append(r)
        for reqs in out.values():
            reqs.sort(key=lambda r: r["request_index"])
        return out


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
    missing = [k for k in REQUIRED_MANIFEST_KEYS if k not in manifest]
    if missing:
        raise ArtifactError(f"{mf}: missing field '{missing[0]}'")
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
