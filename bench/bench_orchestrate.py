"""Benchmark what `./run.sh all` adds to the protocol's own time (target: < 1 %).

Runs the CI smoke configuration (configs/ci/docker-smoke.toml: the CPU demo with 1 episode, 1 turn) twice into fresh
results directories: natively (`python -m artifact run`, the protocol alone) and through `./run.sh all --cpu` (image
reuse check, container start with --network none, log streaming and progress, manifest checks; the final `check`
is timed separately since `./run.sh run` has no such step). Needs a Docker engine and the CPU image (built first,
not timed: a one-time cost). Prints the walls, the per-job overhead in seconds and as a share of the protocol's time,
and what that overhead is for a paper job (hours, from configs/paper/all.toml).

    python bench/bench_orchestrate.py [--base-image local/bookworm:base] [--ca-bundle FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return time.monotonic() - t0, r.stdout + r.stderr


def protocol_seconds(results: Path) -> float:
    return sum(json.loads(p.read_text())["wall_s"] for p in results.rglob("manifest.json"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-image", default="local/bookworm:base")
    ap.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    args = ap.parse_args()
    import docker

    from artifact.orchestrate.images import ensure_image, llamacpp_spec
    from artifact.orchestrate.matrix import load_jobs

    client = docker.from_env()
    ca = Path(args.ca_bundle) if Path(args.ca_bundle).is_file() else None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.monotonic()
        ensure_image(client, llamacpp_spec(cpu=True, base=args.base_image), tmp / "build", ca_bundle=ca)
        print(f"image ready in {time.monotonic() - t0:.1f} s (not counted)")
        native, _ = timed([sys.executable, "-m", "artifact", "run", "configs/ci/docker-smoke.toml",
                           "--results", str(tmp / "native")])
        ca_arg = ["--ca-bundle", str(ca)] if ca else []
        via_all, out = timed([sys.executable, "-m", "artifact", "all", "--cpu", "--base-image", args.base_image,
                              *ca_arg, "--matrix", "configs/ci/all.toml", "--results", str(tmp / "all"),
                              "--progress-every", "30"])
        check, _ = timed([sys.executable, "-m", "artifact", "check", str(tmp / "all"), "--out", str(tmp / "c2")])
        job = re.search(r"done after (\d+):(\d+):(\d+)", out)
        job_s = int(job[1]) * 3600 + int(job[2]) * 60 + int(job[3])
        p_native, p_all = protocol_seconds(tmp / "native"), protocol_seconds(tmp / "all")
    overhead = via_all - check - native
    print(f"native `run`: {native:.1f} s wall (runs' own wall_s {p_native:.1f} s)")
    print(f"`all --cpu`:  {via_all:.1f} s wall, of which the job's container {job_s} s and check ~{check:.1f} s "
          f"(runs' own wall_s {p_all:.1f} s)")
    print(f"orchestration overhead: {overhead:+.1f} s per job = {100 * overhead / native:+.1f} % of this tiny "
          f"protocol ({native:.0f} s); the runs' own time differs by {p_all - p_native:+.1f} s between the two")
    hours = min(j.hours for j in load_jobs())
    print(f"on the shortest paper job ({hours} h, estimate) the same fixed overhead is "
          f"{100 * max(overhead, 0) / (hours * 3600):.3f} %  (target < 1 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
