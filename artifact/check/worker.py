"""A second process for check at scale: it loads and validates some of the runs and draws the figures while this
process loads the others and runs the analyses (the machine's other core; `./run.sh bench` times it).

`Worker.submit(fn, *args)` asks for `fn(*args)`: a module-level function of the artifact (loading one run, drawing
one figure) on arguments that pickle (paths, manifests, small tables). The `Job` it returns gives what `fn` returned
and the wall and CPU seconds it took (`Job.result()`), or raises what `fn` raised (as the same type and message:
the caller's one-line error handling applies). A job not started yet may be taken back (`Job.cancel()`) and run
here (`Job.run_here()`): check loads the runs from both ends of their list this way. A worker runs exactly the code
this process would run on the same data: the outputs do not depend on where a job ran.

Robust by construction: the worker is started before check imports pandas and the analyses, so that its own
start-up overlaps them. On Linux, in a process that runs no other thread and has not imported numpy or pyarrow yet
(a `check` command's), it is forked then (`start_method`): the worker inherits no lock and no state but the records'
reader, and skips an interpreter's start (~0.1 s); anywhere else it is a fresh interpreter (spawn: fork is not safe
on macOS, nor beside threads). It imports only what its jobs need, and ignores ^C (the caller stops it). A worker that cannot be
started or that dies (killed, out of memory) is replaced by this process: every job it had not returned runs here.
A job that returns nothing for TIMEOUT_S is an ArtifactError, never a hang. Without a worker (small results, one
core, ARTIFACT_CHECK_WORKER=0) every job runs here, in the order asked for.
"""

from __future__ import annotations

from typing import Any, Callable, cast
import contextlib
import gc
import importlib
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool

from artifact.errors import ArtifactError

WORKER_ENV = "ARTIFACT_CHECK_WORKER"  # "1": always a worker, "0": never; unset: by size (`want_worker`)
WORKER_MIN_BYTES = 16 << 20  # request records from which a worker pays for its start (~1 CPU s of imports)
_THREADED = ("numpy", "pyarrow")  # libraries that may start threads of their own (a BLAS, Arrow's pools)


def start_method() -> str:
    """ "fork" where forking is safe (see the module's docstring), else "spawn"."""
    safe = sys.platform == "linux" and threading.active_count() == 1 and not any(m in sys.modules for m in _THREADED)
    return "fork" if safe else "spawn"


TIMEOUT_S = 1800.0  # the most one job may take in the worker (a guard against a hang: a job takes about a second)


def want_worker(record_bytes: int) -> bool:
    """Whether check of results holding `record_bytes` of request records uses a worker (WORKER_ENV decides
    first)."""
    choice = os.environ.get(WORKER_ENV, "").strip()
    if choice in ("0", "1"):
        return choice == "1"
    return record_bytes >= WORKER_MIN_BYTES and (os.cpu_count() or 1) > 1


def _timed(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, float, float]:
    start = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - start[0], time.process_time() - start[1]


SPILL_BYTES = 1 << 20  # a job's result from this size on comes back through a file, not the pipe


class Spilled:
    """A worker job's result left in a file (`_timed_spilling`): a paper-scale run's records are ~4 MB pickled,
    which the pipe would carry 64 KiB at a time, each piece read by the caller's result thread while the caller
    loads its own share of the runs (the two contend for one interpreter lock); one read of a file costs ~1 ms."""

    def __init__(self, path: str):
        self.path = path

    def load(self) -> Any:
        try:
            with open(self.path, "rb") as fh:
                return pickle.load(fh)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _timed_spilling(fn: Callable[..., Any], args: tuple[Any, ...], spill_dir: str | None) -> tuple[Any, float, float]:
    """`_timed`, in the worker: a result of SPILL_BYTES or more pickled into a file in `spill_dir` (`Spilled`)."""
    out, wall, cpu = _timed(fn, args)
    blob = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
    if len(blob) < SPILL_BYTES:
        return out, wall, cpu
    fd, path = tempfile.mkstemp(dir=spill_dir, suffix=".pickle")
    with os.fdopen(fd, "wb") as fh:
        fh.write(blob)
    return Spilled(path), wall, cpu


def _start(modules: tuple[str, ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the caller's to handle: it stops the worker
    gc.disable()  # as in check (artifact.check.run.run_check): the runs' records hold no cycles; the worker lives
    # for one check and is killed at its end
    preload(*modules)


def preload(*modules: str) -> None:
    """Import `modules` (what the worker's jobs need, before the first: not timed as theirs); for matplotlib, also
    its font cache (the first figure's set-up)."""
    for name in modules:
        importlib.import_module(name)
    if any(name.startswith("matplotlib") for name in modules):
        from matplotlib import font_manager

        font_manager.findfont("DejaVu Sans")


class Job:
    """One `fn(*args)`, in the worker (`future`) or here."""

    def __init__(
        self, worker: Worker, fn: Callable[..., Any], args: tuple[Any, ...], future: Future[Any] | None = None
    ):
        self._worker, self.fn, self.args, self._future = worker, fn, args, future
        self._outcome: tuple[str, Any] | None = None  # ("ok", (value, wall, cpu)) or ("error", exception)

    @property
    def in_worker(self) -> bool:
        return self._future is not None

    def cancel(self) -> bool:
        """Take the job back from the worker if it has not started there (it then runs here: `run_here`)."""
        if self._future is not None and self._future.cancel():
            self._future = None
        return self._future is None

    def run_here(self) -> None:
        """Run the job in this process now (once), keeping what it returned or raised for `result`."""
        if self._outcome is None:
            self._future = None
            try:
                self._outcome = ("ok", _timed(self.fn, self.args))
            except Exception as exc:  # kept, raised again by result(): the caller's order
                self._outcome = ("error", exc)

    def result(self) -> tuple[Any, ...]:
        """(what fn returned, wall seconds, CPU seconds); raises what fn raised."""
        if self._outcome is None and self._future is not None:
            try:
                value, wall, cpu = self._future.result(timeout=TIMEOUT_S)
                self._outcome = ("ok", (value.load() if isinstance(value, Spilled) else value, wall, cpu))
            except (
                BrokenProcessPool,
                CancelledError,
                OSError,
            ):  # OSError: a spilled result could not be read  # the worker died: this process runs what it had not returned
                self._future = None
            except FutureTimeout:
                self._worker.close(kill=True)
                raise ArtifactError(
                    f"check's worker process returned nothing for {TIMEOUT_S:.0f} s "
                    f"({self.fn.__name__}); set {WORKER_ENV}=0 to do everything in the checking "
                    "process"
                ) from None
            except Exception as exc:  # what fn raised in the worker
                self._outcome = ("error", exc)
        if self._outcome is None:
            self.run_here()
        kind, value = cast("tuple[str, Any]", self._outcome)  # run_here() set it
        if kind == "error":
            raise value
        result: tuple[Any, ...] = value
        return result


class Worker:
    """One worker process (`enabled`; it imports `modules` as it starts), or none: every job then runs here when its
    result is asked for."""

    def __init__(self, enabled: bool = False, modules: tuple[str, ...] = ()):
        self._pool: ProcessPoolExecutor | None = None
        self._spill: str | None = None  # where the worker leaves its large results (`Spilled`)
        if enabled:
            try:
                self._spill = tempfile.mkdtemp(prefix="artifact-check-worker-")
                self._pool = ProcessPoolExecutor(
                    1,
                    mp_context=multiprocessing.get_context(start_method()),
                    initializer=_start,
                    initargs=(tuple(modules),),
                )
                self._pool.submit(int)  # starts the worker now
            except (OSError, ImportError, NotImplementedError, RuntimeError):  # no processes here: all in process
                self.close()

    @property
    def enabled(self) -> bool:
        return self._pool is not None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        future = None
        if self._pool is not None:
            try:
                future = self._pool.submit(_timed_spilling, fn, args, self._spill)
            except (BrokenProcessPool, RuntimeError):  # the worker died: the rest run here
                future = None
        return Job(self, fn, args, future)

    def close(self, kill: bool = False) -> None:
        """End the worker (at once, dropping the jobs not done yet, when `kill`: the caller is leaving on an
        error)."""
        pool, self._pool = self._pool, None
        spill, self._spill = self._spill, None
        try:
            if pool is None:
                return
            if kill:
                # concurrent.futures has no public way to stop a busy worker before Python 3.14's terminate_workers()
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.kill()
            pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if spill is not None:  # after the worker: nothing writes there any more
                shutil.rmtree(spill, ignore_errors=True)


class Drawing:
    """Figures asked for by name (`draw(name, figure function, *its inputs)`), drawn by `worker` as they are asked
    for, or here when `results` is called (without a worker)."""

    def __init__(self, worker: Worker | None = None):
        self._worker = worker if worker is not None else Worker()
        self._jobs: dict[str, Job] = {}

    def draw(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        self._jobs[name] = self._worker.submit(fn, *args)

    def results(self) -> dict[str, tuple[Any, ...]]:
        """name -> (what its figure function returned, wall seconds, CPU seconds), in the order asked for; waits
        for every figure asked for."""
        return {name: job.result() for name, job in self._jobs.items()}
