"""`./run.sh check [DIR]`: find runs by their manifests, build the tables, judge the claims, write the outputs.

Writes into `<results_dir>/check/` (or `out_dir`), whole or not at all: every output is written into a new folder
beside it, which then takes the old folder's place (`publish`); a failed write leaves the previous outputs as they
were and exits 2 naming the path.
  check.json          per claim: status, observed, expected, band, evidence, and the per-scope verdicts;
                      plus the invalid runs and the files written
  tab2.csv, tab2_comparisons.csv, runs.csv, fig1.csv, fig2.csv, fig2_trend.csv, quant_levels.csv, verdicts.csv
  <workload>.csv      each workload's own tables of its runs (agent.csv, tab3.csv, ...: artifact.workloads)
  fig1.png, fig2.png  (when the runs allow them)
  margins.csv, flip_by_margin.csv, benefit_*.csv, mitigation.csv, beyond_verdicts.csv, ..., flip_margin.png,
  price.png           results beyond the paper (artifact.check.beyond); the "beyond" section of check.json
  report.html         one self-contained page (artifact.report.render)
Prints the verdict table, the invalid runs and the runs that were not network-isolated. Exit codes
(`claims.EXIT_CODES`): 0 every tested claim holds and at least one was tested; 1 RQ1 FAILs or a run is invalid;
2 malformed input (ArtifactError, one line); 3 nothing could be tested; 4 a claim other than RQ1 FAILs.

One module: check's pipeline in the order it runs (find and validate the runs, judge, write and publish the
outputs), with the start-up order that lets its worker load runs while this process imports the analyses.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Final

from artifact import workloads
from artifact.check import replay
from artifact.check.load import check_records, load_run  # noqa: F401 (check_records: one of this module's names)
from artifact.check.worker import Drawing, Worker, preload, want_worker
from artifact.errors import ArtifactError
from artifact.records import decoded
from artifact.records.reading import MAX_RECORD_BYTES, too_large
from artifact.records.listing import Listing, entries, resolved, root_problem
from artifact.records.store import MANIFEST, RECORD_FILES, REQUESTS, Run, find_runs

if TYPE_CHECKING:  # for annotations only: imported lazily where they are used (below)
    import pandas as pd

    from artifact.analysis.tables import Tables
    from artifact.check.core import Claim

# pandas, scipy and the analyses (artifact.check.facts, .claims, .beyond, artifact.analysis.tables,
# artifact.report.render; numpy with them) are imported where they are used, not here: a check at scale starts its
# worker process (artifact.check.worker) first, whose start-up then overlaps these imports (the worker imports
# artifact.check.load to load runs, without them). What is left here (the records' store and schema, msgspec) is what
# finding and loading the runs needs.

CHECK_DIR = "check"
TIMINGS = "timings.json"  # the wall and CPU seconds of one check: different on every check, kept out of check.json


# --- validating the records ---------------------------------------------------------------------------------

# check_records and load_run (a job of the worker): artifact.check.load


def find_results(results_dir: Path, listed: Listing | None = None) -> list[Run]:
    """The runs under `results_dir`, by their manifests (their records not read yet); `listed`: the results' listing
    (`listing.entries`) where the caller made it."""
    try:
        runs = find_runs(results_dir, listed=listed)
    except TypeError:  # manifests whose sort keys have mixed types, or are not JSON objects
        raise ArtifactError(
            f"{results_dir}: a manifest.json has fields of the wrong type (config, plan, arm, run)"
        ) from None
    if not runs:
        raise ArtifactError(f"no runs (manifest.json files) under {results_dir}")
    sizes = [(run.path / name, _size(run.path / name)) for run in runs for name in RECORD_FILES if name != MANIFEST]
    path, size = max(sizes, key=lambda x: x[1])
    if size > MAX_RECORD_BYTES:  # the largest file, named before any is read (the manifests were read, bounded)
        raise too_large(path, size, MAX_RECORD_BYTES)
    total = sum(size for _, size in sizes)
    if total > MAX_RESULTS_BYTES:
        raise ArtifactError(
            f"{results_dir}: its runs' record files hold {total} bytes, more than the "
            f"{MAX_RESULTS_BYTES} ({MAX_RESULTS_BYTES >> 30} GiB) one check reads (paper scale is "
            "~0.1 GiB); check a part of them (one configuration's folder) at a time"
        )
    return runs


# All record files of one check together, checked (by their sizes) before any is read: a check holds every run's
# records in memory (~10x their bytes). Each file has its own bound too (records.reading.MAX_RECORD_BYTES), checked here
# first, and again as it is read.
MAX_RESULTS_BYTES = 2 << 30


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() and not path.is_symlink() else 0
    except OSError:
        return 0


def validate_results(
    runs: list[Run],
    worker: Worker | None = None,
    meanwhile: Callable[[], object] = lambda: None,
    then: tuple[Any, ...] = (),
    cached: list[bool] | None = None,
) -> list[Run]:
    """Read and validate every run's records (`check_records`); one run per (config, plan, arm, run). With a
    `worker`, it reads runs from the front of the list while this process, once it has done `meanwhile()`, reads
    them from the back (each run the worker has not started yet); without, in the list's order. The first problem
    in the list's order is raised either way. `then` (a function and its arguments) is queued for the worker behind
    its runs (only with a worker: what it does once its share is loaded; its result is not waited for)."""
    worker = worker if worker is not None else Worker()
    # a run in the checker's cache (records.decoded: ~9 ms a run) is read here: the worker would take longer to send
    # it; `cached`: the runs found there (their bytes already read and hashed)
    here = Worker()
    cached = cached if cached is not None else [run.in_cache() for run in runs]
    jobs = [
        here.submit(load_run, run.path, run.manifest, run._data, run._sha256)
        if hit
        else worker.submit(load_run, run.path, run.manifest)
        for run, hit in zip(runs, cached)
    ]
    for run in runs:
        run._data = None  # each job reads its own (this process's from what it was given)
    if then and worker.enabled:
        worker.submit(*then)
    meanwhile()
    for job in jobs:
        if not job.in_worker:
            job.run_here()
    # this process's share of the others, with a worker: from the back, up to a run the worker has begun
    theirs = [job for job in jobs if job.in_worker] if worker.enabled else []
    for job in reversed(theirs):
        if not job.cancel():
            break
        job.run_here()
    seen: dict[tuple[Any, ...], Run] = {}
    for run, job in zip(runs, jobs):
        (run._requests, run._episodes, run._top2_arrays, run.cache, sha256, run._by_episode, run._episode_outputs) = (
            job.result()[0]
        )
        run._sha256 = run._sha256 or sha256
        m = run.manifest
        key = (m["config"], m["plan"], m["arm"], m["run"])
        if key in seen:
            raise ArtifactError(
                f"two runs claim to be {run.label}: {seen[key].path} and {run.path}; keep one "
                "(move the other out of the results directory)"
            )
        seen[key] = run
    return runs


def record_cache(runs: list[Run]) -> dict[str, Any]:
    """check.json's `record_cache`: whether the checker's own cache (records.decoded, outside the results) was on,
    and how many runs' records it gave ("read") and took ("written"); nothing inside the results is ever one."""
    states = [run.cache for run in runs]
    return {
        "enabled": decoded.wanted(),
        "read": states.count("read"),
        "written": states.count("written"),
        "runs": len(runs),
    }


def load_results(results_dir: Path) -> list[Run]:
    return validate_results(find_results(results_dir))


def records_bytes(runs: list[Run]) -> int:
    """The size of the runs' request records (what decides whether check uses a worker process)."""
    sizes = [(run.path / REQUESTS).stat().st_size for run in runs if (run.path / REQUESTS).is_file()]
    return sum(sizes)


def workload_tables(runs: list[Run]) -> dict[str, dict[str, pd.DataFrame]]:
    """Each workload's own tables of its runs: workload name -> {file name: table}."""
    out = {}
    for name, (workload, wruns) in workloads.by_workload(runs).items():
        try:
            out[name] = workload.tables(wruns)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArtifactError(
                f"{name} records under {wruns[0].path.parent} are malformed ({type(exc).__name__}: {exc})"
            ) from None
    return out


# --- outputs --------------------------------------------------------------------------------------------------


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if hasattr(x, "item"):  # numpy scalars
        return _json_safe(x.item())
    return x


def verdict_frame(claims: list[Claim]) -> pd.DataFrame:
    import pandas as pd  # slow imports: see the module's imports

    rows = [
        {
            "claim": d.claim,
            "scope": d.scope,
            "kind": d.kind,
            "status": d.status,
            "observed": d.observed,
            "expected": d.expected,
            "band": d.band,
            "evidence": " | ".join(d.evidence),
        }
        for c in claims
        for d in c.details
    ]
    return pd.DataFrame(rows, columns=["claim", "scope", "kind", "status", "observed", "expected", "band", "evidence"])


def write_csvs(out: Path, tables: Tables, wtables: dict[str, Any], claims: list[Claim]) -> list[str]:
    # lazy: pandas and scipy after the worker has started
    from artifact.analysis.tables import quant_levels_frame

    frames = {
        "tab2.csv": tables.tab2,
        "tab2_comparisons.csv": tables.comparisons,
        "runs.csv": tables.runs,
        "fig1.csv": tables.fig1,
        "fig2.csv": tables.fig2,
        "fig2_trend.csv": tables.fig2_trend,
        "quant_levels.csv": quant_levels_frame(),
        "verdicts.csv": verdict_frame(claims),
    }
    for own in wtables.values():
        frames.update(own)
    from artifact.check.cells import safe_frame  # lazy: pandas after the worker has started

    for name, df in frames.items():
        safe_frame(df).to_csv(out / name, index=False, errors=TEXT_ERRORS)
    return list(frames)


# Model text is untrusted and may hold what UTF-8 cannot encode (a lone surrogate, from a JSON escape): written as
# its escape (valid JSON, readable HTML), never an error that leaves a file empty.
TEXT_ERRORS: Final = "backslashreplace"


# Every name a check may write into its output folder (besides the workloads' own `table_files`): what publish()
# may replace or remove there. Never read from the folder itself (a planted check.json could name any file).
OUTPUT_NAMES = frozenset(
    (
        "check.json",
        TIMINGS,
        "report.html",
        "tab2.csv",
        "tab2_comparisons.csv",
        "runs.csv",
        "fig1.csv",
        "fig2.csv",
        "fig2_trend.csv",
        "quant_levels.csv",
        "verdicts.csv",
        "fig1.png",
        "fig2.png",
        # artifact.check.beyond
        "margins.csv",
        "first_divergence_margins.csv",
        "flip_by_margin.csv",
        "flip_trend.csv",
        "margin_trend.csv",
        "benefit_runs.csv",
        "benefit_arms.csv",
        "benefit_ratios.csv",
        "mitigation.csv",
        "tiers.csv",
        "tiers_requests.csv",
        "quant_mechanism.csv",
        "quant_mechanism_pairs.csv",
        "tenants.csv",
        "tenants_runs.csv",
        "beyond_verdicts.csv",
        "flip_margin.png",
        "price.png",
        "tiers.png",
        "quant_mechanism.png",
        "tenants.png",
        # artifact.report.divergences, written by the check command beside the verdicts
        "first-divergence.json",
        "first-divergence.txt",
    )
)


def output_names() -> frozenset[str]:
    """OUTPUT_NAMES and every registered workload's table files."""
    own = {f for name in workloads.REGISTRY for f in workloads.get(name).table_files}
    return OUTPUT_NAMES | own


def foreign_entries(out: Path, new: Path | None = None) -> list[str]:
    """What in `out` is not a check's output: an entry whose name is none of a check's own names (`output_names`,
    and those this check wrote into `new`), or that is not a regular file; and, where `out` holds anything, the
    whole folder if it has no check.json (a check never leaves a folder without it: not a folder a check made)."""
    names = output_names() | (set(os.listdir(new)) if new is not None else set())
    held = sorted(os.listdir(out))
    foreign = [e for e in held if e not in names or (out / e).is_symlink() or not (out / e).is_file()]
    if held and not foreign and "check.json" not in held:
        foreign = [held[0]]
    return foreign


def refuse_outputs_folder(out: Path) -> None:
    """Before a check reads anything: `out` must be a folder that holds only a check's outputs, or not exist yet
    (ArtifactError, one line, otherwise: a link, a file, a path that cannot be reached, a folder of other files)."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:  # a loop of links on the way, a name too long, a NUL byte
        raise ArtifactError(
            f"cannot write the check outputs to {out} ({getattr(exc, 'strerror', None) or exc}); give --out a "
            "directory that can be created"
        ) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ArtifactError(
            f"cannot write the check outputs to {out}: it is not a directory"
            + (" (a symbolic link)" if stat.S_ISLNK(st.st_mode) else "")
            + "; give --out a new or empty directory"
        )
    try:
        foreign = foreign_entries(out)
    except OSError as exc:
        raise ArtifactError(f"cannot write the check outputs to {out} ({exc.strerror or exc})") from None
    if foreign:
        raise ArtifactError(
            f"refusing to replace {out}: it holds {foreign[0]}, which is not an output of check; give "
            "--out a new or empty directory"
        )


def staging(out: Path) -> Path:
    """A new folder beside `out` to write the outputs into (`out` itself must be a folder, or not exist yet)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ArtifactError(f"cannot write the check outputs to {out}: it is not a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.new-"))
    except OSError as exc:
        raise ArtifactError(f"cannot write the check outputs to {out} ({exc.strerror})") from None


def publish(new: Path, out: Path) -> None:
    """Put the folder `new` in the place of `out`: out is moved aside, new renamed to out, the old one removed (a
    rename is atomic: out is at every moment the previous outputs, whole, or the new ones, or briefly absent).
    Refuses an `out` that holds anything but a check's outputs (`foreign_entries`; never what a list in it names):
    it would be lost."""
    foreign = foreign_entries(out, new) if out.exists() else []
    if foreign:
        raise ArtifactError(
            f"refusing to replace {out}: it holds {foreign[0]}, which is not an output of check; give "
            "--out a new or empty directory"
        )
    if not out.exists():
        os.rename(new, out)
        return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
    os.rename(out, old / out.name)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(old / out.name, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def verdict_table(claims: list[Claim]) -> str:
    """Claim, status and observed value, one line per claim, left-aligned for a terminal."""
    rows = [("claim", "status", "observed")] + [
        (c.id + (" (hard)" if c.hard else ""), c.status, _clip(c.observed, 110)) for c in claims
    ]
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows)


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def exit_code(claims: list[Claim], problems: list[str]) -> int:
    """`claims.EXIT_CODES`: 1 hard failure or invalid runs, 4 another claim fails, 3 nothing tested, else 0."""
    from artifact.check.claims import FAIL, TESTED  # lazy: pandas and scipy after the worker has started

    if problems or any(c.hard and c.status == FAIL for c in claims):
        return 1
    if any(c.status == FAIL for c in claims):
        return 4
    if not any(c.status in TESTED for c in claims):
        return 3
    return 0


def run_check(
    results_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    expected_path: str | Path | None = None,
    quiet: bool = False,
    label: str | None = None,
) -> int:
    """Check the results under `results_dir`; returns the exit code (`claims.EXIT_CODES`). `label` names the results
    where `results_dir` is not their home (records unpacked from an evidence folder into a temporary directory: the
    folder's name); the report's header, check.json's `results_dir` and the printed summary use it.

    Input problems raise ArtifactError with one line. Records are validated up front (`check_records`); anything
    still unexpected in them is reported the same way, with the traceback only when ARTIFACT_DEBUG is set.
    """
    # no cyclic garbage collection while checking: at scale the records are millions of objects (none in a cycle:
    # they are freed by reference counting), which each of Python's full collections walks again (~1.5 CPU s of
    # ~12 at paper scale, bench/README.md); what the check leaves in cycles (figures, frames) is collected after it
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run_check(results_dir, out_dir, expected_path=expected_path, quiet=quiet, label=label)
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError, OSError) as exc:
        if os.environ.get("ARTIFACT_DEBUG"):
            raise
        raise ArtifactError(
            f"could not check {results_dir}: unexpected content in the records "
            f"({type(exc).__name__}: {exc}); set ARTIFACT_DEBUG=1 for the traceback"
        ) from None
    finally:
        if gc_enabled:
            gc.enable()


class Laps:
    """The wall and CPU seconds of each named step of one check since the step before (timings.json's `timings_s`
    holds the wall seconds; `./run.sh bench` prints both: bench/bench_check.py), and each figure's (`figures`:
    drawn in a worker at scale, while the steps go on, `artifact.check.worker`)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.figures: dict[str, tuple[float, float]] = {}  # name -> (wall, CPU seconds), where it was drawn
        self._last = (time.perf_counter(), time.process_time())

    def __call__(self, name: str) -> None:
        now = (time.perf_counter(), time.process_time())
        self.wall[name] = self.wall.get(name, 0.0) + now[0] - self._last[0]
        self.cpu[name] = self.cpu.get(name, 0.0) + now[1] - self._last[1]
        self._last = now


# What check's worker imports as it starts: only what loading a run needs (`load_run`), so that it begins loading
# runs from the front of the list while this process imports pandas, scipy and the analyses. The figure functions'
# modules (matplotlib and pandas, ~1.5 s) it imports once its share of the runs is loaded (a job queued behind the
# loading jobs: `worker.preload`), while this process runs the paper's tables: it is then ready to draw when the
# first figure is asked for.
WORKER_MODULES = ("artifact.check.load", "numpy", "pyarrow.csv")
FIGURE_MODULES = (
    "matplotlib.backends.backend_agg",
    "matplotlib.figure",
    "artifact.report.render",
    "artifact.check.beyond",
)


def _import_analyses() -> None:
    """pandas and the analyses, imported on their own (a step of check's timings); scipy.stats (~0.2 s) right after
    (`_import_tests`). Both while the worker loads runs: the runs it loads meanwhile are runs this process does not
    load, so the loading shares the import's time between the two processes, where an import after the loading
    would be this process's alone."""
    # lazy: pandas after the worker has started


def _import_tests() -> None:
    """scipy.stats: the tests of the analyses beyond the paper (imported on its own: a step of check's timings)."""
    import scipy.stats  # noqa: F401 -- lazy: after the worker has started


def _run_check(
    results_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    expected_path: str | Path | None = None,
    quiet: bool = False,
    label: str | None = None,
) -> int:
    lap = Laps()
    timings = lap.wall
    root = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else root / CHECK_DIR
    # every path and setting decided before anything is read or written: one line (exit 2) otherwise
    problem = root_problem(root)
    if problem:
        raise ArtifactError(problem)
    refuse_outputs_folder(out)
    if decoded.wanted():
        decoded.bound()  # the cache's bound: a value it cannot honour is said now
    # what the check may read of the results: one listing, which the run finder and the replay key both take
    listed = entries(root, skip=out)
    # the same results judged by the same checker before: its outputs again (artifact.check.replay); an evidence
    # folder's records (`label`) lie in a new temporary directory every time
    previous, pending = replay.lookup(root, out, expected_path, listed) if label is None else (None, None)
    if previous is not None:
        return _replay(previous, out, quiet, lap)
    runs = find_results(root, listed)
    # at scale a worker process loads part of the runs and then draws the figures while this process imports the
    # analyses, loads the other runs and runs the analyses (artifact.check.worker)
    # where every run is in the checker's cache (records.decoded) this process reads them all, and the worker only
    # draws
    cached = [run.in_cache() for run in runs]
    copies = all(cached)
    worker = Worker(want_worker(records_bytes(runs)), modules=FIGURE_MODULES if copies else WORKER_MODULES)
    new = None

    def imports() -> None:
        _import_analyses()
        lap("imports: pandas, analyses")
        _import_tests()
        lap("imports: scipy.stats")

    try:
        validate_results(
            runs,
            worker,
            meanwhile=imports,
            then=() if copies else (preload, *FIGURE_MODULES),
            cached=cached,
        )
        lap("load+validate")
        # lazy: pandas and scipy after the worker has started
        from artifact.analysis.tables import build_tables

        # lazy: pandas and scipy after the worker has started
        from artifact.check.claims import annotate_with_paper, evaluate_claims
        from artifact.check import facts  # lazy: numpy and the analyses after the worker has started
        from artifact.check.admission import admitted  # lazy: pandas after the worker has started

        facts.check(runs)  # labels against facts (exit 2 on a contradiction); copies and the like made INVALID
        evidence = admitted(runs)  # the one admission gate: every analysis below reads these runs only
        lap("facts")
        tables = build_tables(runs, root)
        wtables = workload_tables(evidence)
        lap("tables")
        claims = evaluate_claims(tables, wtables, root=root, expected_path=expected_path)
        annotate_with_paper(tables, expected_path, wtables)
        lap("claims")
        code = exit_code(claims, tables.problems)

        new = staging(out)
        summary = _write_outputs(
            new, root, runs, evidence, tables, wtables, claims, code, lap, Drawing(worker), label or str(root)
        )
        # what differs on every check goes to timings.json, never into check.json (a re-check of committed evidence
        # leaves check.json byte-identical; evidence/*/check/timings.json is git-ignored)
        laps = {k: round(v, 3) for k, v in timings.items()}
        laps.update({f"figure {k}": round(w, 3) for k, (w, _) in lap.figures.items()})
        # this process's CPU seconds since it started, imports included (its worker's are on the other core)
        # whether the checker's own record cache was on stays in check.json; how many runs it gave and took differs
        # from one check to the next and goes to timings.json with the laps
        cache = record_cache(runs)
        summary["record_cache"] = {"enabled": cache["enabled"], "counts": TIMINGS}
        volatile = {
            "timings_s": laps,
            "cpu_s": {"checking process": round(time.process_time(), 3)},
            "record_cache": cache,
        }
        (new / "check.json").write_text(
            json.dumps(_json_safe(summary), indent=2, ensure_ascii=False) + "\n", encoding="utf-8", errors=TEXT_ERRORS
        )
        (new / TIMINGS).write_text(json.dumps(volatile, indent=2) + "\n", encoding="utf-8")
        # every admitted pair's first divergences beside the verdicts (first-divergence.json and .txt)
        from artifact.report import divergences  # lazy: only a check that got this far writes them

        _, diverged = divergences.write(evidence, new)
        printed = _summary(Path(label) if label else root, out, runs, tables, claims, code, diverged)
        publish(new, out)
    except OSError as exc:
        if new is None:
            raise
        kept = f"the previous outputs in {out} are left as they were" if out.exists() else f"{out} was not created"
        raise ArtifactError(
            f"cannot write the check outputs to {exc.filename or out} ({exc.strerror or exc}); {kept}"
        ) from None
    finally:
        # at once: after a check every job's result has been taken (its teardown would only be waited for); leaving
        # on an error, what it has not done yet is not wanted
        worker.close(kill=True)
        if new is not None:
            shutil.rmtree(new, ignore_errors=True)
    lap("write: check.json, publish")
    # read by bench/bench_check.py
    run_check.last_timings, run_check.last_cpu, run_check.last_figures = (  # type: ignore[attr-defined]  # function attributes bench/bench_check.py reads
        dict(lap.wall),
        dict(lap.cpu),
        dict(lap.figures),
    )
    # published: from here on nothing may fail (check.json's exit code is the process's)
    if not quiet:
        say(printed)
    # kept for a later check of the same results (artifact.check.replay), where everything check read is in the
    # results' listing (a run's server log lies in its plan directory: above a run directory checked on its own)
    if pending is not None:
        replay.keep(pending, code, printed, out, _requests_sha256(root, runs), _read_files(runs))
    return code


def _requests_sha256(root: Path, runs: list[Run]) -> dict[str, str]:
    """Each run's requests.jsonl (relative to the results) -> the sha256 of its bytes as check read them."""
    base = resolved(root)
    return {os.path.relpath(resolved(run.path / REQUESTS), base): run._sha256 for run in runs if run._sha256}


def _read_files(runs: list[Run]) -> list[Path]:
    """Every file check reads of the results, where it exists or not: each run's record files and the server log
    its manifest names (under the run's plan directory)."""
    out = [run.path / name for run in runs for name in RECORD_FILES]
    return out + [run.path.parent / log for run in runs if isinstance(log := run.manifest.get("server_log"), str)]


def say(text: str) -> None:
    """Print `text` whatever the terminal's encoding can show (a name that is not UTF-8 as its escape); a closed
    output (`check ... | head`) is not an error: the outputs are published and the exit code decided."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        print(text.encode(encoding, "backslashreplace").decode(encoding, "replace"), flush=True)
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):  # nothing more to write there, at exit either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _replay(entry: replay.Entry, out: Path, quiet: bool, lap: Laps) -> int:
    """Write a kept check's outputs into `out` (as a check writes them: `publish`), print its summary and say it
    was replayed; its exit code (artifact.check.replay)."""
    new = staging(out)
    try:
        for name, blob in entry.outputs.items():
            if name != Path(name).name or name not in output_names():  # the first divergences are among them
                raise ArtifactError(
                    f"the checker's cache entry {replay.entry_name(entry)} names an output "
                    f"{name!r} a check does not write; remove the entry"
                )
            (new / name).write_bytes(blob)
        lap("replay")
        volatile = {
            replay.REPLAYED: replay.entry_name(entry),
            "timings_s": {k: round(v, 3) for k, v in lap.wall.items()},
            "cpu_s": {"checking process": round(time.process_time(), 3)},
        }
        (new / TIMINGS).write_text(json.dumps(volatile, indent=2) + "\n", encoding="utf-8")
        publish(new, out)
    except OSError as exc:
        kept = f"the previous outputs in {out} are left as they were" if out.exists() else f"{out} was not created"
        raise ArtifactError(
            f"cannot write the check outputs to {exc.filename or out} ({exc.strerror or exc}); {kept}"
        ) from None
    finally:
        shutil.rmtree(new, ignore_errors=True)
    if not quiet:
        say(
            f"{entry.printed}\n(replayed: these results and this checker are byte for byte those of a check made "
            f"before; its outputs come from the checker's cache. {replay.ENV}=0 checks them again)"
        )
    return entry.exit_code


def _write_outputs(
    out: Path,
    root: Path,
    runs: list[Run],
    evidence: list[Run],
    tables: Tables,
    wtables: dict[str, Any],
    claims: list[Claim],
    code: int,
    lap: Laps,
    drawing: Drawing,
    label: str,
) -> dict[str, Any]:
    """Write every output but check.json into `out`; returns check.json's content (without its timings). `runs`:
    every run found (listed); `evidence`: the admitted ones (`admission.admitted`), which the analyses read."""
    from artifact.check.beyond import write_beyond  # lazy: pandas and scipy after the worker has started
    from artifact.check.claims import BAND_RULE, CLAIM_RULES, EXIT_CODES, FAIL
    from artifact.report.render import PAPER_FIGURES, compile_templates, draw_figures, write_report

    problems = tables.problems
    hard_fail = [c.id for c in claims if c.hard and c.status == FAIL]
    files = write_csvs(out, tables, wtables, claims)
    lap("csv")
    draw_figures(tables, out, drawing)

    # results beyond the paper (they never change the exit code); waits for every figure asked for
    def templates() -> None:
        compile_templates()
        lap("report: templates")

    beyond = write_beyond(evidence, out, lap, drawing, meanwhile=templates)
    drawn = drawing.results()
    lap.figures.update({name: (wall, cpu) for name, (_, wall, cpu) in drawn.items()})
    figures = {name: path for name in PAPER_FIGURES if (path := drawn.get(name, (None,))[0]) is not None}
    files += list(figures)
    files += beyond.files

    report = write_report(
        out / "report.html",
        root=root,
        runs=runs,
        tables=tables,
        workload_tables=wtables,
        claims=claims,
        problems=problems,
        exit_code=code,
        exit_meaning=EXIT_CODES[code],
        band_rule=BAND_RULE,
        figures=figures,
        warnings=tables.warnings,
        beyond=beyond,
        label=label,
    )
    files.append(report.name)
    lap("report")
    return {
        "results_dir": label,
        "exit_code": code,
        "exit_meaning": EXIT_CODES[code],
        "exit_codes": EXIT_CODES,
        "hard_failures": hard_fail,
        "failures": [c.id for c in claims if c.status == FAIL],
        "invalid": problems,
        "unisolated_runs": tables.unisolated_runs,
        "run_warnings": tables.warnings,
        "runs": len(runs),
        "claims": [c.as_dict() for c in claims],
        "claim_rules": CLAIM_RULES,
        "beyond": beyond.as_dict(),
        "files": files,
    }


def _summary(
    root: Path,
    out: Path,
    runs: list[Run],
    tables: Tables,
    claims: list[Claim],
    code: int,
    diverged: list[dict[str, Any]],
) -> str:
    """What check prints: the verdicts, the invalid and unisolated runs, where the outputs are, and how many
    episodes first diverged where (first-divergence.txt)."""
    # lazy: pandas and scipy after the worker has started
    from artifact.check.claims import EXIT_CODES, FAIL, INCONCLUSIVE, INVALID, OUT

    lines: list[str] = []
    say = lines.append

    problems = tables.problems
    hard_fail = [c.id for c in claims if c.hard and c.status == FAIL]
    names = ", ".join(workloads.by_workload(runs))
    say(
        f"check: {len(runs)} runs ({len(tables.groups)} configuration-plan(s) with paired ON/OFF runs; "
        f"workloads: {names or 'none known'}) under {root}"
    )
    say(verdict_table(claims))
    for c in claims:
        for d in c.details:
            if d.status in (FAIL, OUT, INCONCLUSIVE, INVALID):
                why = f" ({_clip(d.evidence[0], 160)})" if d.evidence and d.status != OUT else ""
                say(f"  {d.status} {d.claim} {d.scope}: {_clip(d.observed, 160)}{why}")
    for p in problems:
        say(f"INVALID: {p}")
    for label in tables.unisolated_runs:
        for w in tables.warnings[label]:
            say(f"WARNING (not network-isolated): {w}")
    if tables.user_server:
        from artifact.analysis.tables import USER_SERVER_UNOBSERVED  # lazy: loaded with the tables

        say(
            f"NOTE: {len(tables.user_server)} run(s) against a server the artifact did not start; not observable: "
            f"{USER_SERVER_UNOBSERVED}"
        )
    if hard_fail:
        say(f"hard claim(s) failed: {', '.join(hard_fail)}")
    say(f"exit code {code}: {EXIT_CODES[code]}")
    say(f"report: {out / 'report.html'}")
    say(f"verdicts: {out / 'check.json'}")
    n = sum(len(e["episodes"]) for e in diverged)
    say(f"first divergences: {n} episode(s) in {len(diverged)} comparison(s): {out / 'first-divergence.txt'}")
    return "\n".join(lines)


run_check.last_timings, run_check.last_cpu, run_check.last_figures = {}, {}, {}  # type: ignore[attr-defined]  # read by bench/bench_check.py
