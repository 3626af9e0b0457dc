"""First contact, timed as a new user meets it: `./run.sh demo` from a clean clone with empty caches, and CI's
`.ci/run` from a fresh machine. Writes what it measured into bench/first-contact.json, which README's time column
quotes (tests/test_docs_numbers.py holds the two together).

    python bench/first_contact.py demo [--keep DIR]  clone HEAD into a temporary folder, run ./run.sh demo there
                                                      with an empty HOME (no pip cache, no build cache, no record
                                                      cache), record its printed time per step and its wall time
    python bench/first_contact.py recheck [--out FILE] time `./run.sh check evidence/NAME` of every evidence folder,
                                                      each a fresh process with the record cache off
    python bench/first_contact.py ci LOG [--out FILE] record a .ci/run log's phases and total (run it on a fresh
                                                      machine: a clean clone, empty HOME and pip cache, no Docker
                                                      images, no Slurm)
    python bench/first_contact.py yardstick           print the machine-speed yardstick (.ci/run prints it at its
                                                      start and end: `ci: yardstick compile S s`)

A wall time says little without the speed of the machine that took it, at that moment: every record carries a
yardstick measured in the same run, so that a reader can scale it to their own machine. The yardstick is a fixed
compile (`yardstick_source()`, made by this file, compiled with `cc -O2` three times; the median, before and after the
timed run) and, for the demo, the decode and prompt rates of the demo's own llama-server (its cache-OFF requests'
tokens over the server's own `predicted_ms` and `prompt_ms`), with the CPU model, the compiler and the 1-minute load
average before and after.

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


YARD_LINE = re.compile(r"^ci: yardstick compile ([0-9.]+) s")


def yardstick_source(functions: int = 200) -> str:
    """A fixed C translation unit (the same bytes at every commit of this file): enough code that `cc -O2` takes
    seconds, none of it from the system's headers, so that only the compiler and the machine set the time."""
    body = [
        f"int f{i}(int *a, int n) {{ int s = {i}; for (int j = 0; j < n; j++) {{ s = s * 31 + a[j] * {i % 7 + 1};"
        f" if (s % {i % 5 + 2}) s ^= a[(j + {i}) % n]; }} return s; }}"
        for i in range(functions)
    ]
    return "\n".join(body) + "\nint main(void) { return 0; }\n"


def compile_seconds(repeats: int = 3) -> float | None:
    """The median wall time of `cc -O2 -c` on the yardstick source, or None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory(prefix="yardstick-") as tmp:
        src = Path(tmp) / "yardstick.c"
        src.write_text(yardstick_source())
        times = []
        for _ in range(repeats):
            t = time.monotonic()
            subprocess.run([cc, "-O2", "-c", str(src), "-o", str(Path(tmp) / "y.o")], check=True)
            times.append(time.monotonic() - t)
    return round(sorted(times)[len(times) // 2], 2)


def _first_line(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _first_line(["sysctl", "-n", "machdep.cpu.brand_string"])


def decode_rates(results: Path) -> dict:
    """The demo's own llama-server speed: its cache-OFF requests' generated tokens per second of `predicted_ms` and
    prompt tokens per second of `prompt_ms` (the server's own timings; OFF: every prompt token computed)."""
    tokens = predicted_ms = prompt = prompt_ms = 0.0
    for path in results.glob("*/*/off-run*/requests.jsonl"):
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if isinstance(r.get("predicted_ms"), (int, float)) and r.get("output_tokens"):
                tokens += len(r["output_tokens"])
                predicted_ms += r["predicted_ms"]
            if isinstance(r.get("prompt_ms"), (int, float)) and isinstance(r.get("prompt_n"), int):
                prompt += r["prompt_n"]
                prompt_ms += r["prompt_ms"]
    return {
        "decode_tokens_per_s": round(1000 * tokens / predicted_ms, 1) if predicted_ms else None,
        "prompt_tokens_per_s": round(1000 * prompt / prompt_ms, 1) if prompt_ms else None,
    }


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _machine() -> dict:
    return {
        "cpu_cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "compiler": _first_line([shutil.which("cc") or "cc", "--version"]),
        "load_average_1min_before": round(os.getloadavg()[0], 2),
    }


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


def measure_demo(keep: Path | None = None) -> dict:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="first-contact-") as tmp:
        clone, home = Path(tmp) / "clone", Path(tmp) / "home"
        home.mkdir()
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)  # this checkout's HEAD
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ARTIFACT_", "PIP_", "XDG_", "VIRTUAL_ENV", "PYTHONPATH"))
        }
        env.update(HOME=str(home), PYTHON=env.get("PYTHON", shutil.which("python3") or sys.executable))
        machine = _machine()
        compile_before = compile_seconds()
        t = time.monotonic()
        proc = subprocess.run(["./run.sh", "demo"], cwd=clone, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t
        load_after = round(os.getloadavg()[0], 2)
        rates = decode_rates(clone / "results")
        compile_after = compile_seconds()
        if keep is not None:  # the demo's records and its printed output, for a reader to re-check
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copytree(clone / "results", keep / "results", ignore=shutil.ignore_patterns("check*", "*.msgpack"))
            # the temporary folder's path is this machine's own: shown as "…", as check's report shows such paths
            (keep / "demo-output.txt").write_text(proc.stdout.replace(str(clone.parent), "…"))
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
        "load_average_1min_after": load_after,
        "yardstick": {"compile_s_before": compile_before, "compile_s_after": compile_after, **rates},
    }


def measure_recheck() -> dict:
    """Workflow 1 as a new reader meets it: `python -m artifact check evidence/NAME` of every evidence folder, each a
    fresh process with the checker's record cache off (nothing kept from an earlier check), its outputs into a
    temporary folder (the committed check/ untouched): seconds per folder, their sum and the slowest."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    folders = sorted(p.parent for p in (REPO / "evidence").glob("*/check"))
    env = {**os.environ, "ARTIFACT_RECORD_COPIES": "0"}
    machine = _machine()
    compile_before = compile_seconds()
    per: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="recheck-") as tmp:
        for folder in folders:
            t = time.monotonic()
            subprocess.run(
                [sys.executable, "-m", "artifact", "check", str(folder), "--out", str(Path(tmp) / folder.name)],
                cwd=REPO,
                env=env,
                capture_output=True,
                check=False,
            )
            per[folder.name] = round(time.monotonic() - t, 1)
    return {
        "commit": commit,
        "folders": len(per),
        "wall_s": round(sum(per.values()), 1),
        "slowest_s": max(per.values()),
        "per_folder_s": per,
        **machine,
        "load_average_1min_after": round(os.getloadavg()[0], 2),
        "yardstick": {"compile_s_before": compile_before, "compile_s_after": compile_seconds()},
    }


def ci_phases(log: str) -> dict[str, float]:
    """`.ci/run`'s own lines `ci: <phase> took|in <N> s`: phase -> seconds (`./run.sh test` named `run.sh test`:
    the docs quote a key by its path, whose parts are separated by "/")."""
    return {m.group(1).replace("./", ""): float(m.group(2)) for line in log.splitlines() if (m := CI_LINE.match(line))}


def with_minutes(record: dict) -> dict:
    """Each part's wall time and target in minutes too (what README's time column quotes)."""
    for part in record.values():
        part["wall_min"] = round(part["wall_s"] / 60, 1)
        if "target_s" in part:
            part["target_min"] = round(part["target_s"] / 60)
        build = part.get("steps_s", {}).get(BUILD_STEP)
        if build is not None:
            part["build_min"] = round(build / 60, 1)
        steps = part.get("steps_s", {})
        if steps:  # the steps a set-up machine runs again (not set-up, not the total): the demo once set up
            again = sum(v for k, v in steps.items() if not k.startswith("set-up:") and k != "total")
            part["set_up_wall_min"] = round(again / 60, 1)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("demo", "recheck", "ci", "yardstick"))
    ap.add_argument("log", nargs="?", type=Path, help="ci: the .ci/run log")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--commit", help="ci: the commit the log is of")
    ap.add_argument("--keep", type=Path, help="demo: copy its records and printed output into this folder")
    args = ap.parse_args(argv)
    if args.what == "yardstick":
        print(f"ci: yardstick compile {compile_seconds()} s ({_cpu_model()}; {os.cpu_count()} cores)")
        return 0
    record = _load(args.out)
    if args.what == "demo":
        record["demo"] = measure_demo(args.keep)
    elif args.what == "recheck":
        record["recheck"] = measure_recheck()
    else:
        if args.log is None:
            ap.error("ci needs the .ci/run log")
        phases = ci_phases(args.log.read_text(errors="replace"))
        if "total" not in phases:
            raise SystemExit(f"error: {args.log} has no 'ci: total took N s' line (a complete .ci/run log?)")
        yard = [
            float(m.group(1))
            for line in args.log.read_text(errors="replace").splitlines()
            if (m := YARD_LINE.match(line))
        ]
        record["ci"] = {
            "commit": args.commit,
            "wall_s": phases["total"],
            "phases_s": phases,
            "target_s": CI_TARGET_S,
            "met": phases["total"] <= CI_TARGET_S,
            "yardstick": {"compile_s_before": yard[0], "compile_s_after": yard[-1]} if yard else None,
        }
    args.out.write_text(json.dumps(with_minutes(record), indent=2) + "\n")
    print(json.dumps(record[args.what], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
