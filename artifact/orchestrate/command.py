"""`./run.sh all`: prerequisites, weights, images, the fan-out over GPUs, the final table, then check and the report.

Exit code: 0 every job ran and check passed; 1 check judged a hard claim FAILED or a run invalid; 3 at least one
configuration x plan FAILED (its line says why; the others ran); 2 bad input or a missing prerequisite (one line);
130 interrupted. Jobs whose engine this version cannot run are listed as skipped and do not change the exit code.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from artifact.models import hub as weights
from artifact.errors import ArtifactError
from artifact.orchestrate import host, images
from artifact.orchestrate.fanout import DONE, FAILED, INTERRUPTED, SKIPPED, TOO_BIG, Fanout, Outcome, Slot, hms
from artifact.orchestrate.matrix import DEFAULT_MATRIX, Job, load_jobs

EXIT_JOB_FAILED = 3


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def image_spec(engine: str, args) -> images.ImageSpec:
    if engine == "vllm":
        return images.vllm_spec()
    return images.llamacpp_spec(cpu=args.cpu, base=args.base_image, cuda_archs=args.cuda_archs)


def weights_bytes(job: Job) -> tuple[int, int, int]:
    """(bytes pinned, bytes present on disk, files whose size is unknown until fetched)."""
    m = job.cfg.model
    if not weights.is_hf(m):
        return 0, 0, 0
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
    """Wall time of longest-first list scheduling of `hours` on `n` machines."""
    load = [0.0] * max(n, 1)
    for h in sorted(hours, reverse=True):
        load[load.index(min(load))] += h
    return max(load)


def dry_run(jobs: list[Job], args) -> int:
    """The plan, without Docker: jobs, images, weights and disk, an estimate of GPU time."""
    rows, seen_models, totals = [], set(), [0, 0, 0]
    for j in jobs:
        spec = image_spec(j.engine, args)
        why = images.engine_available(j.engine)
        total, present, unknown = weights_bytes(j)
        key = weights.lock_key(j.cfg.model) + str(j.cfg.model.files) if weights.is_hf(j.cfg.model) else j.cfg.name
        if key not in seen_models:
            seen_models.add(key)
            totals = [totals[0] + total, totals[1] + present, totals[2] + unknown]
        files = len(j.cfg.model.files) or 1
        wtext = (f"{gb(total)}{'+?' if unknown else ''} in {files} file{'s' * (files > 1)}"
                 + (", present" if total and present >= total else "")) if weights.is_hf(j.cfg.model) \
            else j.cfg.model.source.split(":")[0] + " (no download)"
        rows.append((j.cfg.name, j.plan, j.engine, f"{spec.repository}:{spec.pin_tag}", wtext,
                     f"{j.gpu_mem_gib:g}", f"{j.hours:g}", f"skipped: {why}" if why else ""))
    heads = ("configuration", "plan", "engine", "image", "weights", "GPU GiB", "est. h", "")
    widths = [max(len(str(r[i])) for r in rows + [heads]) for i in range(len(heads))]
    print(f"./run.sh all --dry-run: {len(jobs)} configuration x plan jobs over "
          f"{len(dict.fromkeys(j.cfg.name for j in jobs))} configurations ({args.matrix})")
    for r in [heads] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
    root = weights.weights_root()
    print(f"weights: {gb(totals[0])} pinned"
          + (f" (+ {totals[2]} files sized by the Hub at fetch)" if totals[2] else "")
          + f", {gb(totals[1])} present under {root}, {gb(max(totals[0] - totals[1], 0))} to download; "
            f"{gb(free_bytes(root))} free there")
    runnable = [j for j in jobs if not images.engine_available(j.engine)]
    gpu_h = sum(j.hours for j in runnable)
    n = len(args.gpus.split(",")) if args.gpus else 1
    print(f"GPU time (estimate, RTX 4090 class): {gpu_h:.1f} h for the {len(runnable)} runnable jobs; "
          f"wall ~{schedule_hours([j.hours for j in runnable], n):.1f} h on {n} GPU{'s' * (n > 1)}"
          + ("" if args.gpus else " (--gpus 0,1,... for more)"))
    print("images: " + ", ".join(f"{s.repository}:{s.pin_tag} ({s.dockerfile})"
                                 for s in {image_spec(j.engine, args).repository: image_spec(j.engine, args)
                                           for j in jobs}.values()))
    return 0


def slots_for(args, client) -> list[Slot]:
    if args.cpu:
        return [Slot(f"cpu{i}") for i in range(args.parallel)]
    local = client.images.list()
    if local:  # fail fast, before any download or build, when Docker cannot hand out GPUs
        probe_any_gpu(client, local[0].id)
    gpus = host.select_gpus(host.host_gpus(), args.gpus)
    say("GPUs: " + "; ".join(f"{g.index} {g.name} {g.memory_gib:.0f} GiB (driver {g.driver})" for g in gpus))
    return [Slot(f"gpu{g.index}", (str(g.index),), g.memory_gib) for g in gpus]


def probe_any_gpu(client, image: str) -> None:
    import docker

    container = None
    try:
        container = client.containers.create(image, entrypoint=["true"], network_mode="none", device_requests=[
            docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])])
        container.start()
        container.wait(timeout=120)
    except docker.errors.APIError as exc:
        if host.is_gpu_runtime_error(exc):
            raise host.gpu_runtime_error(exc) from None
    finally:
        if container is not None:
            container.remove(force=True)


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


def cmd_all(args) -> int:
    jobs = load_jobs(Path(args.matrix), [c for c in (args.configs or "").split(",") if c] or None)
    if args.episodes is not None and args.episodes < 1:
        raise ArtifactError("--episodes must be >= 1")
    if args.dry_run:
        return dry_run(jobs, args)
    if args.parallel < 1:
        raise ArtifactError("--parallel must be >= 1")
    t0 = time.monotonic()
    client = host.docker_client()
    slots = slots_for(args, client)
    outcomes, runnable = [], []
    biggest = max((s.memory_gib for s in slots if s.memory_gib is not None), default=None)
    for j in jobs:
        why = images.engine_available(j.engine)
        if why:
            outcomes.append(Outcome(j, SKIPPED, note=why))
        elif biggest is not None and j.gpu_mem_gib > biggest:
            outcomes.append(Outcome(j, TOO_BIG, note=f"needs ~{j.gpu_mem_gib:g} GiB of GPU memory, the largest "
                                                     f"selected GPU has {biggest:.0f} GiB"))
        else:
            runnable.append(j)
    for o in outcomes:
        say(f"{o.job.key}: {o.status} ({o.note})")
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    if runnable and not args.no_fetch:
        from artifact.fetch import fetch

        fetch([j.cfg for j in runnable])
    built, expect = {}, {}
    ca = Path(args.ca_bundle) if args.ca_bundle else None
    for engine in dict.fromkeys(j.engine for j in runnable):
        spec = image_spec(engine, args)
        built[engine] = images.ensure_image(client, spec, results / "logs", ca_bundle=ca, rebuild=args.rebuild)
        expect[engine] = spec.expect_build_info
    if runnable and not args.cpu:
        host.probe_gpu_runtime(client, next(iter(built.values())).id, slots[0].device_ids[0])
    from huggingface_hub import constants

    fan = Fanout(client, built, expect, results, weights.weights_root(), Path(constants.HF_HUB_CACHE),
                 episodes=args.episodes, progress_every=args.progress_every,
                 shm_size={e: image_spec(e, args).shm_size for e in built})
    say(f"running {len(runnable)} jobs on {len(slots)} slot(s): {', '.join(s.label for s in slots)}")
    outcomes += fan.run(runnable, slots)
    print_table(outcomes, jobs)
    interrupted = any(o.status == INTERRUPTED for o in outcomes)
    failed = [o for o in outcomes if o.status in (FAILED, TOO_BIG)]
    print(f"{sum(o.status == DONE for o in outcomes)} done, {len(failed)} failed, "
          f"{sum(o.status == SKIPPED for o in outcomes)} skipped, in {hms(time.monotonic() - t0)}")
    if interrupted:
        return 130
    from artifact.check.run import run_check

    check_rc = run_check(results) if any(o.status == DONE for o in outcomes) else 0
    if failed:
        print(f"exit {EXIT_JOB_FAILED}: {len(failed)} configuration x plan job(s) did not complete: "
              + ", ".join(o.job.key for o in failed))
        return EXIT_JOB_FAILED
    return check_rc


def add_parser(sub) -> None:
    sp = sub.add_parser("all", help="the paper's configurations in pinned containers over the host's GPUs")
    sp.add_argument("--dry-run", action="store_true", help="print the plan (jobs, images, weights, disk, GPU time); "
                    "needs no Docker")
    sp.add_argument("--configs", default=None, help="comma-separated subset of configurations (default: all)")
    sp.add_argument("--gpus", default=None, help="GPU indices to use, e.g. 0,2 (default: every GPU)")
    sp.add_argument("--cpu", action="store_true", help="the CPU variant: no GPU, --parallel containers at once")
    sp.add_argument("--parallel", type=int, default=1, help="containers at once with --cpu (default 1)")
    sp.add_argument("--matrix", default=str(DEFAULT_MATRIX), help="the run matrix (default configs/paper/all.toml)")
    sp.add_argument("--results", default=None, help="results directory (default: results/)")
    sp.add_argument("--episodes", type=int, default=None, help="episodes per run (default: each configuration's)")
    sp.add_argument("--base-image", default=None, help="base image for the build and runtime stages (default: "
                    "nvidia/cuda 12.6.3 devel/runtime on Ubuntu 24.04; with --cpu debian:bookworm-slim)")
    sp.add_argument("--cuda-archs", default=images.DEFAULT_CUDA_ARCHS, help="CMAKE_CUDA_ARCHITECTURES for the "
                    "llama.cpp image (default: %(default)s = sm_89 + sm_90 native, sm_90 PTX)")
    sp.add_argument("--ca-bundle", default=None, help="a CA bundle for pip/git inside the image builds (behind an "
                    "intercepting proxy); build stage only, never in the images")
    sp.add_argument("--rebuild", action="store_true", help="build the images even when their tags exist")
    sp.add_argument("--no-fetch", action="store_true", help="do not download weights (they must be present)")
    sp.add_argument("--progress-every", type=float, default=60.0, help="seconds between progress tables")
    sp.set_defaults(func=cmd_all)
