"""`./run.sh all`: prerequisites, weights, images, the fan-out over GPUs, the final table, then check and the report.

Three ways to run the same matrix: in pinned containers on one Docker host (the default, this module), natively on
the host's GPUs without containers (`--native`, native.py), or as a Slurm job array (`--slurm`, slurm/).

Exit code: 0 every job ran and check passed; 1 check judged a hard claim FAILED or a run invalid; 3 at least one
configuration x plan FAILED (its line says why; the others ran); 2 bad input or a missing prerequisite (one line);
130 interrupted. Jobs whose engine this version cannot run are listed as skipped and do not change the exit code.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from artifact.engines.base import DEFAULT_CUDA_ARCHS
from artifact.models import hub as weights
from artifact.errors import ArtifactError
from artifact.orchestrate import engines, host, images, native, slurm
from artifact.orchestrate.common import (conclude, cpu_slots, gpu_slots, print_gpu_time, print_plan, say,
                                         split_runnable)
from artifact.orchestrate.fanout import Fanout, Slot
from artifact.orchestrate.matrix import DEFAULT_MATRIX, Job, load_jobs
from artifact.fetch import fetch


def dry_run(jobs: list[Job], args) -> int:
    """The plan, without Docker: jobs, images, weights and disk, an estimate of GPU time."""
    def image(j):
        spec = engines.image_spec(j.engine, args)
        return f"{spec.repository}:{spec.pin_tag}" if spec else "-"

    runnable = print_plan(jobs, args, "./run.sh all --dry-run", ("image", image),
                          lambda j: engines.unavailable(j, "container"))
    n = len(args.gpus.split(",")) if args.gpus else 1
    print_gpu_time(runnable, [Slot(f"gpu{i}") for i in range(n)], "GPU")
    if not args.gpus:
        print("(--gpus 0,1,... for more GPUs)")
    specs = {s.repository: s for s in (engines.image_spec(j.engine, args) for j in jobs) if s}
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


def check_args(args) -> None:
    if args.episodes is not None and args.episodes < 1:
        raise ArtifactError("--episodes must be >= 1")
    if args.parallel < 1:
        raise ArtifactError("--parallel must be >= 1")
    slurm_only = [f for f, v in (("--status", args.status), ("--container", args.container != "native"),
                                 ("--image", args.image),
                                 *((f"--{k.replace('_', '-')}", getattr(args, k)) for k in
                                   ("partition", "account", "gres", "time", "qos", "sbatch_line")))
                  if v]
    if slurm_only and not args.slurm:
        raise ArtifactError(f"{slurm_only[0]} is an option of --slurm")
    native_only = [f for f, v in (("--llama-source", args.llama_source), ("--no-build", args.no_build)) if v]
    if native_only and not (args.native or (args.slurm and args.container == "native")):
        raise ArtifactError(f"{native_only[0]} is an option of --native (and of --slurm's native tasks)")
    if args.jobs_per_gpu < 1:
        raise ArtifactError("--jobs-per-gpu must be >= 1")
    sharing = [f for f, v in (("--jobs-per-gpu", args.jobs_per_gpu != 1),
                              ("--gpu-sharing", args.gpu_sharing != "auto")) if v]
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
    runnable, outcomes = split_runnable(jobs, slots, lambda j: engines.unavailable(j, "container"))
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    if runnable and not args.no_fetch:
        fetch([j.cfg for j in runnable])
    built, expect = {}, {}
    ca = Path(args.ca_bundle) if args.ca_bundle else None
    for engine in dict.fromkeys(j.engine for j in runnable):
        spec = engines.image_spec(engine, args)
        built[engine] = images.ensure_image(client, spec, results / "logs", ca_bundle=ca, rebuild=args.rebuild)
        expect[engine] = spec.expect_build_info
    if runnable and not args.cpu:
        host.probe_gpu_runtime(client, next(iter(built.values())).id, slots[0].device_ids[0])
    from huggingface_hub import constants

    fan = Fanout(client, built, expect, results, weights.weights_root(), Path(constants.HF_HUB_CACHE),
                 episodes=args.episodes, progress_every=args.progress_every,
                 shm_size={e: engines.image_spec(e, args).shm_size for e in built})
    say(f"running {len(runnable)} jobs on {len(slots)} slot(s): {', '.join(s.label for s in slots)}")
    outcomes += fan.run(runnable, slots)
    return conclude(outcomes, jobs, results, t0)


def add_parser(sub) -> None:
    sp = sub.add_parser("all", help="the paper's configurations over the host's GPUs (containers, --native or "
                        "--slurm)")
    sp.add_argument("--dry-run", action="store_true", help="print the plan (jobs, images, weights, disk, GPU time; "
                    "with --slurm the batch scripts); needs no Docker, GPU or Slurm, submits nothing")
    sp.add_argument("--configs", default=None, help="comma-separated subset of configurations (default: all)")
    sp.add_argument("--gpus", default=None, help="GPU indices to use, e.g. 0,2 (default: every GPU)")
    sp.add_argument("--cpu", action="store_true", help="the CPU variant: no GPU, --parallel jobs at once")
    sp.add_argument("--parallel", type=int, default=1, help="jobs at once with --cpu (default 1)")
    sp.add_argument("--matrix", default=str(DEFAULT_MATRIX), help="the run matrix (default configs/paper/all.toml)")
    sp.add_argument("--results", default=None, help="results directory (default: results/)")
    sp.add_argument("--episodes", type=int, default=None, help="episodes per run (default: each configuration's)")
    sp.add_argument("--no-fetch", action="store_true", help="do not download weights (they must be present)")
    sp.add_argument("--progress-every", type=float, default=60.0, help="seconds between progress tables")
    g = sp.add_argument_group("containers (the default; Docker and the NVIDIA Container Toolkit)")
    g.add_argument("--base-image", default=None, help="base image for the build and runtime stages (default: "
                   "nvidia/cuda 12.6.3 devel/runtime on Ubuntu 24.04; with --cpu debian:bookworm-slim)")
    g.add_argument("--cuda-archs", default=DEFAULT_CUDA_ARCHS, help="CMAKE_CUDA_ARCHITECTURES for the "
                   "engines' CUDA images and --native builds (default: %(default)s = sm_89 + sm_90 native, sm_90 PTX)")
    g.add_argument("--ca-bundle", default=None, help="a CA bundle for pip/git inside the image builds (behind an "
                   "intercepting proxy); build stage only, never in the images")
    g.add_argument("--rebuild", action="store_true", help="build the images even when their tags exist")
    g = sp.add_argument_group("native (--native: the host's GPUs without containers; ARTIFACT.md section 7b)")
    g.add_argument("--native", action="store_true", help="run each job as a process on this host, one per GPU "
                   "(CUDA_VISIBLE_DEVICES), each engine's native build (llama-server with CUDA) in its own environment")
    g.add_argument("--llama-source", default=None, metavar="DIR", help="a llama.cpp git checkout to build (the "
                   "paper's b10434 = commit 7e4c0a9); default: the sdist's b10435")
    g.add_argument("--no-build", action="store_true", help="use the llama-server already installed in the "
                   "environment (labelled by its build record) instead of building it")
    g.add_argument("--jobs-per-gpu", type=int, default=1, metavar="N", help="jobs at once on each GPU (default 1), "
                   "each within 1/N of its memory: through CUDA MPS where the host has it, else in time slices")
    g.add_argument("--gpu-sharing", choices=("auto", "mps", "time-slices"), default="auto", help="with "
                   "--jobs-per-gpu N > 1: CUDA MPS if the host has it (auto, default), MPS or fail (mps), or the "
                   "driver's time slices (time-slices)")
    g = sp.add_argument_group("Slurm (--slurm: a job array through sbatch; ARTIFACT.md section 7c)")
    g.add_argument("--slurm", action="store_true", help="submit one array task per configuration x plan and a "
                   "dependent check job; resubmitting resumes")
    g.add_argument("--status", action="store_true", help="with --slurm: each task's state from the results "
                   "directory (and squeue/sacct)")
    g.add_argument("--container", choices=("native", "apptainer", "docker"), default="native",
                   help="what each task runs: the native path (default), the image through Apptainer/Singularity "
                   "(--image FILE.sif) or through Docker")
    g.add_argument("--image", default=None, help="with --container apptainer: the SIF image (built from the "
                   "artifact's Docker image)")
    for opt, what in (("partition", "partition"), ("account", "account to charge"), ("qos", "quality of service"),
                      ("time", "time limit per task, e.g. 4:00:00"),
                      ("gres", "generic resources per task (default gpu:1; 'none' for none; none with --cpu)")):
        g.add_argument(f"--{opt}", default=None, help=f"sbatch --{opt}: {what}")
    g.add_argument("--sbatch-line", action="append", default=[], metavar="OPTION",
                   help="an extra #SBATCH line for every job, e.g. --sbatch-line=--cpus-per-task=8 (repeatable)")
    sp.add_argument("--slurm-task", type=int, default=None, help=argparse.SUPPRESS)  # the batch script's entry
    sp.add_argument("--slurm-finish", action="store_true", help=argparse.SUPPRESS)  # the check job's entry
    sp.add_argument("--submission", default=None, help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_all)
