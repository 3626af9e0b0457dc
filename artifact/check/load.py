"""One run's records for check, read and validated: `load_run`, a job of check's worker process (artifact.check.worker)
as much as of check's own, and `check_records`, the rules it applies. artifact.check.run imports both (its names).

A module of its own so that the worker, which imports it as it starts (artifact.check.run.WORKER_MODULES), imports
only what loading a run needs: the records, their schema and the workloads' arms, without artifact.check.run's
facts and the analyses they import (~0.1 CPU s of the worker's start, before its first run)."""

from __future__ import annotations

from typing import Any
from pathlib import Path

from artifact import workloads
from artifact.errors import ArtifactError
from artifact.records.schema import MANIFEST
from artifact.records.store import Run, cache_validated, validate_records


def check_records(run: Run) -> None:
    """Raise ArtifactError (one line, naming file, line and field) where a record breaks the records' schema
    (artifact.records.schema: the one the writer enforces, fields and cross-field rules), or a manifest names an
    arm the artifact does not have."""
    m = run.manifest
    problem = MANIFEST.problem(m)
    if problem:
        raise ArtifactError(f"{run.path / 'manifest.json'}: {problem}")
    if m["arm"] not in workloads.arms():
        raise ArtifactError(
            f"{run.path / 'manifest.json'}: arm {m['arm']!r} is not one of the artifact's arms "
            f"({', '.join(workloads.arms())}; labels are lower-case)"
        )
    validate_records(run)


def load_run(
    path: Path, manifest: dict[str, Any], data: bytes | None = None, sha256: str | None = None
) -> tuple[Any, ...]:
    """One run's records, read and validated (`check_records`): (requests, episodes, the parsed top-2 arrays, what
    the checker's cache did: "read", "written" or "none", requests.jsonl's sha256 where it was computed, each episode's
    requests and what the comparisons read of them: `Run.requests_by_episode`, `Run.episode_outputs`), what a `Run` memoises (a job of check's worker process,
    artifact.check.worker: the three travel together, so that the records the arrays name stay the request
    records). Once every rule holds the records are kept in the checker's cache (`store.cache_validated`), never
    before. `data`, `sha256`: requests.jsonl's bytes and their sha256, where the caller has read them."""
    run = Run(path, manifest, _data=data, _sha256=sha256)
    check_records(run)
    cache = cache_validated(run)
    run._data = None
    return (
        run.requests,
        run.episodes,
        run.top2_arrays(),
        cache,
        run._sha256,
        run.requests_by_episode(),
        run.episode_outputs(),
    )
