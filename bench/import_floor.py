"""What a fresh `check` pays before it reads a record: the interpreter and the imports of the libraries it is built
on (numpy, pyarrow, msgspec, pandas, scipy.stats, matplotlib, jinja2), each measured in fresh interpreters, and
the artifact's own modules on top. With bench/load_floor.py (the records' decoding floor) it bounds check's time
from below (bench/README.md; the measurements in its git history).

    python bench/import_floor.py [--repeat 5]

Prints, per import set, the median wall and CPU seconds (user + system) of `python -c "import ..."` over the
repeats, and the bare interpreter's. Measure on a quiet machine (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (label, modules): cumulative sets, each the one before plus what check's processes import next
SETS = (
    ("bare interpreter", ()),
    ("numpy", ("numpy",)),
    ("+ pyarrow.csv, msgspec (the loader's)", ("numpy", "pyarrow.csv", "msgspec")),
    ("+ pandas", ("numpy", "pyarrow.csv", "msgspec", "pandas")),
    ("+ scipy.stats", ("numpy", "pyarrow.csv", "msgspec", "pandas", "scipy.stats")),
    ("+ jinja2", ("numpy", "pyarrow.csv", "msgspec", "pandas", "scipy.stats", "jinja2")),
    (
        "+ matplotlib (Figure, Agg)",
        (
            "numpy",
            "pyarrow.csv",
            "msgspec",
            "pandas",
            "scipy.stats",
            "jinja2",
            "matplotlib.figure",
            "matplotlib.backends.backend_agg",
        ),
    ),
    ("matplotlib alone (Figure, Agg)", ("matplotlib.figure", "matplotlib.backends.backend_agg")),
    ("scipy.stats alone", ("scipy.stats",)),
    ("pandas alone", ("pandas",)),
    ("check's worker as it starts (artifact.check.run.WORKER_MODULES)", ("@worker",)),
    ("check's process: artifact.check.run + its analyses (_import_analyses)", ("@check",)),
)


def _code(modules: tuple[str, ...]) -> str:
    if modules == ("@worker",):
        return "import importlib, artifact.check.run as r\nfor m in r.WORKER_MODULES: importlib.import_module(m)"
    if modules == ("@check",):
        return "import artifact.check.run as r; r._import_analyses()"
    return "\n".join(f"import {m}" for m in modules) or "pass"


def measure(modules: tuple[str, ...]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", _code(modules)], cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    print(
        f"machine: {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}, load average "
        f"{os.getloadavg()[0]:.2f} (1 min); median of {args.repeat} fresh interpreters"
    )
    print(f"  {'imports':<72} {'wall s':>7} {'CPU s':>7}")
    for label, modules in SETS:
        measure(modules)  # warm the page cache and the .pyc files
        runs = sorted(measure(modules) for _ in range(args.repeat))
        mid = runs[len(runs) // 2]
        print(f"  {label:<72} {mid[0]:7.3f} {mid[1]:7.3f}")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
