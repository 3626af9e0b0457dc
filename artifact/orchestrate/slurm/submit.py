"""The submission, on a login node (`./run.sh all --slurm`, `--dry-run`): the site options, the jobs still to run,
the set-up done once here (llama-server, weights, derived models, the Apptainer image's digest), then the job array
and the dependent check job through sbatch."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from artifact.config import REPO
from artifact.errors import ArtifactError
from artifact.fetch import fetch
from artifact.models import hub as weights
from artifact.models.hub import sha256_file
from artifact.orchestrate import engine_kinds, native
from artifact.orchestrate.common import say
from artifact.orchestrate.matrix import Job
from artifact.orchestrate.slurm.batch import (
    array_script,
    array_spec,
    check_script,
    filesystem,
    require_sbatch,
    sbatch,
    sbatch_options,
    shared_note,
)
from artifact.orchestrate.slurm.spec import SPEC, SUBMISSIONS, job_entry, read_spec, submissions, write_json
from artifact.orchestrate.slurm.status import complete, queue_states, status


def cmd_slurm(jobs: list[Job], args) -> int:
    results = Path(args.results).resolve()
    if args.status:
        return status(results)
    opts = sbatch_options(args)
    mode = args.container
    if mode == "apptainer" and not args.image and not args.dry_run:
        specs = [s for s in (engine_kinds.image_spec(j.engine, args) for j in jobs) if s]
        raise ArtifactError(
            "--container apptainer needs --image FILE.sif (apptainer build FILE.sif "
            f"docker-daemon://{specs[0].repository if specs else 'IMAGE'}:TAG; docs/gpu-hosts.md)"
        )
    if mode == "apptainer" and args.image and not Path(args.image).is_file() and not args.dry_run:
        raise ArtifactError(f"--image {args.image}: no such file")
    where = "container" if mode != "native" else "native"
    skipped = {j.key: why for j in jobs if (why := engine_kinds.unavailable(j, where, gpu=False))}
    done = {j.key for j in jobs if complete(results, j)}
    todo = [i for i, j in enumerate(jobs) if j.key not in skipped and j.key not in done]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    n = 1
    while (results / SUBMISSIONS / stamp).exists():  # two submissions within a second
        n += 1
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{n}"
    sub = results / SUBMISSIONS / stamp
    spec = {
        "version": 1,
        "stamp": stamp,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_epoch": time.time(),
        "submit_host": socket.gethostname(),
        "repo": str(REPO),
        "results": str(results),
        "venv": task_venv(args, mode),
        "mode": mode,
        "cpu": bool(args.cpu),
        "image": args.image,
        "image_id": None,
        "episodes": args.episodes,
        "progress_every": args.progress_every,
        "expect_build": None,
        "base_image": args.base_image,
        "cuda_archs": args.cuda_archs,
        "ca_bundle": str(Path(args.ca_bundle).resolve()) if args.ca_bundle else None,
        "weights": str(weights.weights_root().resolve()),
        "hf_hub_cache": hf_hub_cache(),
        "matrix": args.matrix,
        "jobs": [job_entry(i, j) for i, j in enumerate(jobs)],
        "array": todo,
        "skipped": skipped,
        "complete_before": sorted(done),
        "sbatch_options": opts,
        "array_job_id": None,
        "check_job_id": None,
    }
    if args.dry_run:
        return dry_run(jobs, spec, sub, opts)
    require_sbatch()
    for key, why in skipped.items():
        say(f"{key}: skipped ({why})")
    if not todo:
        print(
            f"all {len(jobs) - len(skipped)} runnable jobs are complete under {results}: nothing to submit "
            f"(./run.sh check {results})"
        )
        return 0
    previous = submissions(results)
    if previous:
        last = read_spec(previous[-1])
        if queue_states(last.get("array_job_id")):
            raise ArtifactError(
                f"the array job {last['array_job_id']} of the last submission ({previous[-1].name}) "
                "still has tasks queued or running: wait for it (./run.sh all --slurm --status) or "
                f"scancel {last['array_job_id']}, then submit again"
            )
    (sub / "logs").mkdir(parents=True, exist_ok=True)
    (sub / "tasks").mkdir()
    try:  # the site's options judged by sbatch itself before anything is set up or submitted
        (sub / "array.sbatch").write_text(array_script(sub, spec, opts))
        sbatch(["--test-only", str(sub / "array.sbatch")], "job array")
        note = shared_note(results)
        if note:
            say(f"note: {note}")
        spec.update(prepare([jobs[i] for i in todo], args, mode))
    except BaseException:
        shutil.rmtree(sub, ignore_errors=True)
        raise
    write_json(sub / SPEC, spec)
    (sub / "array.sbatch").write_text(array_script(sub, spec, opts))
    array_id = sbatch(["--parsable", str(sub / "array.sbatch")], "job array").split(";")[0].strip()
    (sub / "check.sbatch").write_text(check_script(sub, spec, opts, array_id))
    try:
        check_id = sbatch(["--parsable", str(sub / "check.sbatch")], "check job").split(";")[0].strip()
    except ArtifactError:
        subprocess.run(["scancel", array_id], capture_output=True, timeout=60)
        raise
    spec.update(array_job_id=array_id, check_job_id=check_id)
    write_json(sub / SPEC, spec)
    print(
        f"submitted array job {array_id}: {len(todo)} task(s) ({array_spec(todo)}; {len(done)} job(s) complete "
        f"before, {len(skipped)} skipped) and check job {check_id} (--dependency=afterany:{array_id})"
    )
    print(f"submission: {sub}\nstatus: ./run.sh all --slurm --status --results {results}")
    return 0


def task_venv(args, mode: str) -> str:
    """The environment the tasks run in: native GPU tasks the CUDA build's (run.sh runs the submission from it),
    else this one."""
    return str(native.native_venv()) if mode == "native" and not args.cpu else sys.prefix


def hf_hub_cache() -> str:
    from huggingface_hub import constants  # lazy for start-up time: huggingface_hub loads only for a submission

    return str(Path(constants.HF_HUB_CACHE).resolve())


def prepare(runnable: list[Job], args, mode: str) -> dict:
    """The set-up the tasks rely on, done here once: llama-server (native), weights, derived models; for Apptainer
    the image's digest."""
    out = {}
    if mode == "native":
        out["expect_build"] = engine_kinds.ensure_native_builds(args)  # engine kind -> label
    native.place_staged_weights()  # an offline stage's weights files, where fetch and the tasks look for them
    if not args.no_fetch:
        fetch([j.cfg for j in runnable])
    if mode != "docker":
        native.prepare_models(runnable, fetch=False)
    if mode == "apptainer":
        out["image"] = str(Path(args.image).resolve())
        out["image_id"] = "sha256:" + sha256_file(Path(out["image"]))
    return out


def dry_run(jobs: list[Job], spec: dict, sub: Path, opts: list[str]) -> int:
    todo = spec["array"]
    print(
        f"./run.sh all --slurm --dry-run: {len(jobs)} configuration x plan jobs ({spec['matrix']}); "
        f"{len(todo)} to submit as array tasks, {len(spec['complete_before'])} complete under {spec['results']}, "
        f"{len(spec['skipped'])} skipped"
    )
    rows = [("task", "configuration / plan", "est. h", "GPU GiB", "")]
    for e in spec["jobs"]:
        state = (
            ""
            if e["index"] in todo
            else "complete"
            if e["key"] in spec["complete_before"]
            else f"skipped: {spec['skipped'].get(e['key'], '')}"
        )
        rows.append(
            (
                str(e["index"]) if e["index"] in todo else "-",
                e["key"],
                f"{e['hours']:g}",
                f"{e['gpu_mem_gib']:g}",
                state,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4])
    hours = [e["hours"] for e in spec["jobs"] if e["index"] in todo]
    if hours:
        print(
            f"time per task (estimate, RTX 4090 class): {min(hours):g}-{max(hours):g} h, {sum(hours):.1f} h in "
            f"all; GPU memory per task up to {max(e['gpu_mem_gib'] for e in spec['jobs'] if e['index'] in todo):g}"
            " GiB (every task gets the same --gres: choose a GPU type that takes the largest)"
        )
    if not any(o.startswith("--time=") for o in opts):
        print(
            "--time not given: the partition's default time limit applies (a task cut off by it is re-run from its "
            "last complete session on resubmission)"
        )
    note = shared_note(Path(spec["results"]))
    print(
        f"results: {spec['results']} ({filesystem(Path(spec['results']))}); every node must see it"
        + (f"\nnote: {note}" if note else "")
    )
    if not todo:
        print("nothing to submit")
        return 0
    print(f"\n--- {sub}/array.sbatch")
    print(array_script(sub, spec, opts), end="")
    print(f"\n--- {sub}/check.sbatch")
    print(check_script(sub, spec, opts, "<array job id>"), end="")
    found = shutil.which("sbatch")
    print(
        f"\nwould run: sbatch --test-only array.sbatch; sbatch --parsable array.sbatch; sbatch --parsable "
        f"check.sbatch\nsbatch: {found or 'not found on PATH (needed to submit)'}; nothing submitted"
    )
    return 0
