"""First contact, timed as a new user meets it: `./run.sh demo` from a clean clone with empty caches, and CI's
`.ci/run` from a fresh machine. Writes what it measured into bench/first-contact.json, which README's time column
quotes (tests/test_docs_numbers.py holds the two together).

    python bench/first_contact.py demo [--out FILE]   clone HEAD into a temporary folder, run ./run.sh demo there
                                                      with an empty HOME (no pip cache, no build cache, no record
                                                      cache), record its printed time per step and its wall time
    python bench/first_contact.py ci LOG [--out FILE] record a .ci/run log's phases and total (run it on a fresh
                                                      machine: a clean clone, empty HOME and pip cache, no Docker
                                                      images, no Slurm)

Targets: the demo <= 10 min and .ci/run <= 45 min on 2 cores (DEMO_TARGET_S, CI_TARGET_S).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "first-contact.json"
DEMO_TARGET_S = 600
CI_TARGET_S = 45 * 60
STEP_LINE = re.compile(r"^  (.+?)\s+([0-9.]+) s$")
BUILD_STEP = "set-up: llama-server build"  # artifact.cli.SETUP_STEPS
CI_LINE = re.compile(r"^ci: (.+?) (?:took|in) ([0-9]+) s")


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _machine() -> dict:
    return {"cpu_cores": os.cpu_count(), "load_average_1min_before": round(os.getloadavg()[0], 2)}


def demo_steps(output: str) -> dict[str, float]:
    """The demo's printed time table (artifact.cli.time_table): step -> seconds."""
    lines = output.splitlines()
    try:
        start = max(i for i, line in enumerate(lines) if line.startswith("time on this machine"))
    except ValueError:
        return {}
    steps = {}
    for line in lines[start + 1 :]:
        m = STEP_LINE.match(line)
        if not m:
            break
        steps[m.group(1)] = float(m.group(2))
    return steps


def measure_demo() -> dict:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="first-contact-") as tmp:
        clone, home = Path(tmp) / "clone", Path(tmp) / "home"
        home.mkdir()
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ARTIFACT_", "PIP_", "XDG_", "VIRTUAL_ENV", "PYTHONPATH"))
        }
        env.update(HOME=str(home), PYTHON=env.get("PYTHON", shutil.which("python3") or sys.executable))
        machine = _machine()
        t = time.monotonic()
        proc = subprocess.run(["./run.sh", "demo"], cwd=clone, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"error: ./run.sh demo exited {proc.returncode} (output above)")
    return {
        "commit": commit,
        "wall_s": round(wall, 1),
        "steps_s": demo_steps(proc.stdout),
        "target_s": DEMO_TARGET_S,
        "met": wall <= DEMO_TARGET_S,
        **machine,
    }


def ci_phases(log: str) -> dict[str, float]:
    """`.ci/run`'s own lines `ci: <phase> took|in <N> s`: phase -> seconds (`./run.sh test` named `run.sh test`:
    the docs quote a key by its path, whose parts are separated by "/")."""
    return {m.group(1).replace("./", ""): float(m.group(2)) for line in log.splitlines() if (m := CI_LINE.match(line))}


def with_minutes(record: dict) -> dict:
    """Each part's wall time and target in minutes too (what README's time column quotes)."""
    for part in record.values():
        part["wall_min"], part["target_min"] = round(part["wall_s"] / 60, 1), round(part["target_s"] / 60)
        build = part.get("steps_s", {}).get(BUILD_STEP)
        if build is not None:
            part["build_min"] = round(build / 60, 1)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("demo", "ci"))
    ap.add_argument("log", nargs="?", type=Path, help="ci: the .ci/run log")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--commit", help="ci: the commit the log is of")
    args = ap.parse_args(argv)
    record = _load(args.out)
    if args.what == "demo":
        record["demo"] = measure_demo()
    else:
        if args.log is None:
            ap.error("ci needs the .ci/run log")
        phases = ci_phases(args.log.read_text(errors="replace"))
        if "total" not in phases:
            raise SystemExit(f"error: {args.log} has no 'ci: total took N s' line (a complete .ci/run log?)")
        record["ci"] = {
            "commit": args.commit,
            "wall_s": phases["total"],
            "phases_s": phases,
            "target_s": CI_TARGET_S,
            "met": phases["total"] <= CI_TARGET_S,
        }
    args.out.write_text(json.dumps(with_minutes(record), indent=2) + "\n")
    print(json.dumps(record[args.what], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
