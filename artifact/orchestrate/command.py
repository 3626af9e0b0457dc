"""`./run.sh all`: prerequisites, weights, images, the fan-out over GPUs, the final table, then check and the report.

Three ways to run the same matrix: in pinned containers on one Docker host (the default, this module), natively on
the host's GPUs without containers (`--native`, native.py), or as a Slurm job array (`--slurm`, slurm/).

Exit code: 0 every job ran and check passed; 1 check judged a hard claim FAILED or a run invalid; 3 at least one
configuration x plan FAILED (its line says why; the others ran); 2 bad input or a missing prerequisite (one line);
130 interrupted. Jobs whose engine this version cannot run are listed as skipped and do not change the exit code.
"""

from __future__ import annotations

import time
from pathlib import Path

from artifact.models import hub as weights
from artifact.errors import ArtifactError
from artifact.orchestrate import engine_kinds, host, images, native, slurm
from artifact.orchestrate.common import conclude, cpu_slots, gpu_slots, print_gpu_time, print_plan, say, split_runnable
from artifact.orchestrate.fanout import Fanout, Slot
from artifact.orchestrate.matrix import Job, load_jobs
from artifact.fetch import fetch


def dry_run(jobs: list[Job], args) -> int:
    """The plan, without Docker: jobs, images, weights and disk, an estimate of GPU time."""

    def image(j):
        spec = engine_kinds.image_spec(j.engine, args)
        return f"{spec.repository}:{spec.pin_tag}" if spec else "-"

    runnable = print_plan(
        jobs, args, "./run.sh all --dry-run", ("image", image), lambda j: engine_kinds.unavailable(j, "container")
    )
    n = len(args.gpus.split(",")) if args.gpus else 1
    print_gpu_time(runnable, [Slot(f"gpu{i}") for i in range(n)], "GPU")
    if not args.gpus:
        print("(--gpus 0,1,... for more GPUs)")
    specs = {s.repository: s for s in (engine_kinds.image_spec(j.engine, args) for j in jobs) if s}
    print("images: " + ", ".join(f"{s.repository}:{s.pin_tag} ({s.dockerfile})" for s in specs.values()))
    return 0


def slots_for(args, client) -> list[Slot]:
    if args.cpu:
        return cpu_slots(args.parallel)
    local = client.images.list()
    if local:  # fail fast, before any download or build, when Docker cannot hand out GPUs
        probe_any_gpu(client, local[0].id)
    return gpu_slots(args.gpus)


def probe_any_gpu(client, image: str) -> None:
    import docker

    container = None
    try:
        container = client.containers.create(
            image,
            entrypoint=["true"],
            network_mode="none",
            device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])],
        )
        container.start()
        container.wait(timeout=120)
    except docker.errors.APIError as exc:
        if host.is_gpu_runtime_error(exc):
            raise host.gpu_runtime_error(exc) from None
    finally:
        if container is not None:
            container.remove(force=True)


def check_args(args) -> None:
    if args.episodes is not None and args.episodes < 1:
        raise ArtifactError("--episodes must be >= 1")
    if args.parallel < 1:
        raise ArtifactError("--parallel must be >= 1")
    slurm_only = [
        f
        for f, v in (
            ("--status", args.status),
            ("--container", args.container != "native"),
            ("--image", args.image),
            *(
                (f"--{k.replace('_', '-')}", getattr(args, k))
                for k in ("partition", "account", "gres", "time", "qos", "sbatch_line")
            ),
        )
        if v
    ]
    if slurm_only and not args.slurm:
        raise ArtifactError(f"{slurm_only[0]} is an option of --slurm")
    native_only = [
        f
        for f, v in (
            ("--llama-source", args.llama_source),
            ("--llama-build", getattr(args, "llama_build", "b10434") != "b10434"),
            ("--no-build", args.no_build),
        )
        if v
    ]
    if native_only and not (args.native or (args.slurm and args.container == "native")):
        raise ArtifactError(f"{native_only[0]} is an option of --native (and of --slurm's native tasks)")
    if args.jobs_per_gpu < 1:
        raise ArtifactError("--jobs-per-gpu must be >= 1")
    sharing = [
        f for f, v in (("--jobs-per-gpu", args.jobs_per_gpu != 1), ("--gpu-sharing", args.gpu_sharing != "auto")) if v
    ]
    if sharing and not args.native:
        raise ArtifactError(f"{sharing[0]} is an option of --native (a Slurm task or a container has one GPU job)")
    if sharing and args.cpu:
        raise ArtifactError(f"{sharing[0]} is for GPUs; with --cpu, --parallel N sets the jobs at once")


def cmd_all(args) -> int:
    if args.slurm_task is not None or args.slurm_finish:
        return slurm.run_task(args) if args.slurm_task is not None else slurm.finish(args)
    check_args(args)
    jobs = load_jobs(Path(args.matrix), [c for c in (args.configs or "").split(",") if c] or None)
    if args.slurm:
        return slurm.cmd_slurm(jobs, args)
    if args.native:
        return native.cmd_native(jobs, args)
    if args.dry_run:
        return dry_run(jobs, args)
    t0 = time.monotonic()
    client = host.docker_client()
    slots = slots_for(args, client)
    runnable, outcomes = split_runnable(jobs, slots, lambda j: engine_kinds.unavailable(j, "container"))
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    if runnable and not args.no_fetch:
        fetch([j.cfg for j in runnable])
    built, expect = {}, {}
    ca = Path(args.ca_bundle) if args.ca_bundle else None
    for engine in dict.fromkeys(j.engine for j in runnable):
        spec = engine_kinds.image_spec(engine, args)
        built[engine] = images.ensure_image(client, spec, results / "logs", ca_bundle=ca, rebuild=args.rebuild)
        expect[engine] = spec.expect_build_info
    if runnable and not args.cpu:
        host.probe_gpu_runtime(client, next(iter(built.values())).id, slots[0].device_ids[0])
    from huggingface_hub import constants

    fan = Fanout(
        client,
        built,
        expect,
        results,
        weights.weights_root(),
        Path(constants.HF_HUB_CACHE),
        episodes=args.episodes,
        progress_every=args.progress_every,
        shm_size={e: engine_kinds.image_spec(e, args).shm_size for e in built},
    )
    say(f"running {len(runnable)} jobs on {len(slots)} slot(s): {', '.join(s.label for s in slots)}")
    outcomes += fan.run(runnable, slots)
    return conclude(outcomes, jobs, results, t0)
