"""A submission's state: each job's from the results directory and its task record, with squeue's and (where
accounting is on) sacct's view; `--status` prints it, the check job (`--slurm-finish`) turns it into the final table
and runs check."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from artifact.catalog import load_plan
from artifact.errors import ArtifactError
from artifact.orchestrate.common import conclude
from artifact.orchestrate.fanout import DONE, FAILED, SKIPPED, Outcome, Progress, check_manifests, hms, runs_per_session
from artifact.orchestrate.matrix import Job
from artifact.orchestrate.slurm.spec import SUBMISSIONS, entry_job, read_record, read_spec, submissions


def plan_problem(results: Path, key: str) -> str | None:
    """None when every run of the configuration x plan `key` is complete under `results`, else why not."""
    pdir = results / key
    return check_manifests(pdir, None) if pdir.is_dir() else "not started"


def complete(results: Path, job: Job) -> bool:
    return plan_problem(results, job.key) is None


def queue_states(job_id: str | None) -> dict:
    """Array task index (or "job" for a plain job) -> (state, node or reason) as squeue lists them now."""
    if not job_id or not shutil.which("squeue"):
        return {}
    try:
        r = subprocess.run(
            ["squeue", "-h", "-r", "-j", str(job_id), "-o", "%K|%T|%N|%R"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        k, state, node, reason = (line.split("|") + ["", "", "", ""])[:4]
        out[int(k) if k.strip().isdigit() else "job"] = (state.lower(), node or reason.strip("()"))
    return out


def accounting(ids: list[str]) -> tuple[dict, str | None]:
    """sacct's view: JobID (e.g. 12_3) -> (state, exit code, elapsed); or why there is none."""
    ids = [i for i in ids if i]
    if not ids or not shutil.which("sacct"):
        return {}, "sacct not on PATH"
    try:
        r = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobID,State,ExitCode,Elapsed"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {}, f"sacct failed ({exc})"
    if r.returncode != 0:
        return {}, "sacct: " + ((r.stderr or r.stdout).strip().splitlines() or ["failed"])[0]
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 4:
            out[parts[0]] = (parts[1].split()[0].lower(), parts[2], parts[3])
    return out, None


def last_progress(results: Path, job_key: str, record: dict) -> str:
    """Where a running task is, from its newest log through the fan-out's own Progress reader."""
    config, plan = job_key.rsplit("/", 1)
    logs = sorted((results / config / plan / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return ""
    total, per_session = runs_per_session(load_plan(plan))
    p = Progress(
        SimpleNamespace(key=job_key),
        total,
        started=time.monotonic() - (time.time() - record.get("started_epoch", time.time())),
    )
    for line in logs[-1].read_text(errors="replace").splitlines():
        p.feed(line, per_session)
    return p.summary()


def task_states(sub: Path, spec: dict, live: bool) -> list[dict]:
    """Per job of the submission: its state from the results directory and its task record, and with `live` what
    squeue (and sacct, where accounting is on) say."""
    results = Path(spec["results"])
    queue = queue_states(spec.get("array_job_id")) if live else {}
    acct, _ = accounting([spec.get("array_job_id")]) if live else ({}, None)
    rows = []
    for e in spec["jobs"]:
        i, key = e["index"], e["key"]
        rec = read_record(sub, i) if i in spec["array"] else None
        is_complete = plan_problem(results, key) is None
        q = queue.get(i)
        a = acct.get(f"{spec.get('array_job_id')}_{i}")
        node, secs, note = (rec or {}).get("node", ""), (rec or {}).get("seconds"), (rec or {}).get("note", "")
        if key in spec["skipped"]:
            state, note = SKIPPED, spec["skipped"][key]
        elif i not in spec["array"]:
            state, note = DONE, "complete before this submission"
        elif q:
            state = q[0]
            if state == "pending":
                note = q[1]
            elif state == "running" and rec:
                node = q[1] or node
                secs = time.time() - rec.get("started_epoch", time.time())
                note = last_progress(results, key, rec)
        elif rec and rec["state"] == "running":
            state = "stopped"
            note = "ended without its record (killed, cancelled or the node failed): resubmitting resumes" + (
                f"; sacct: {a[0]} {a[1]}" if a else ""
            )
        elif rec:
            state = rec["state"]
        elif is_complete:
            state = DONE
        else:
            state = a[0] if a else "no record"
            note = (
                "the task never started, or its node cannot see the results directory (it must be on a file "
                f"system every node mounts); Slurm's output: {sub}/logs/"
            )
        if state == DONE and not is_complete:
            state, note = FAILED, plan_problem(results, key)
        rows.append({"index": i, "key": key, "state": state, "node": node, "seconds": secs, "note": note or ""})
    return rows


def latest(results: Path) -> Path:
    subs = submissions(results)
    if not subs:
        raise ArtifactError(
            f"no Slurm submission under {results / SUBMISSIONS} (./run.sh all --slurm --results {results} submits one)"
        )
    return subs[-1]


def status(results: Path) -> int:
    sub = latest(results)
    spec = read_spec(sub)
    rows = task_states(sub, spec, live=True)
    print(
        f"== ./run.sh all --slurm --status: submission {sub.name} ({spec['mode']}), array job "
        f"{spec.get('array_job_id')}, check job {spec.get('check_job_id')}"
    )
    table = [("task", "configuration / plan", "state", "node", "time", "note")]
    for r in rows:
        table.append(
            (
                str(r["index"]) if r["index"] in spec["array"] else "-",
                r["key"],
                r["state"],
                r["node"] or "-",
                hms(r["seconds"]) if r["seconds"] else "-",
                r["note"],
            )
        )
    widths = [max(len(t[i]) for t in table) for i in range(5)]
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t[:5], widths)) + "  " + t[5])
    check = queue_states(spec.get("check_job_id")).get("job")
    _, why = accounting([spec.get("array_job_id")])
    counts = {s: sum(r["state"] == s for r in rows) for s in dict.fromkeys(r["state"] for r in rows)}
    print(
        ", ".join(f"{n} {s}" for s, n in counts.items())
        + f"; check job {spec.get('check_job_id')}: "
        + (f"{check[0]} ({check[1]})" if check else "not queued (ended, or never submitted)")
        + (f"; {why}" if why else "")
    )
    if (results / "check" / "check.json").is_file():
        print(f"check: {results / 'check' / 'report.html'}")
    return 0


def finish(args) -> int:
    """The check job: the final table from the task records, then check and the report (the exit code of `all`)."""
    if not args.submission:
        raise ArtifactError("--slurm-finish needs --submission DIR (the batch script passes it)")
    sub = Path(args.submission)
    spec = read_spec(sub)
    t0 = time.monotonic() - (time.time() - spec.get("created_epoch", time.time()))  # the total since submission
    jobs, outcomes = [], []
    for r, e in zip(task_states(sub, spec, live=False), spec["jobs"]):
        job = entry_job(e)
        jobs.append(job)
        status_ = r["state"] if r["state"] in (DONE, SKIPPED) else FAILED
        note = r["note"] if r["state"] in (DONE, SKIPPED, FAILED) else f"{r['state']}: {r['note']}".strip(": ")
        outcomes.append(Outcome(job, status_, r["node"], r["seconds"] or 0.0, note))
    print(f"submission {sub.name}: array job {spec.get('array_job_id')}")
    return conclude(outcomes, jobs, Path(spec["results"]), t0)
