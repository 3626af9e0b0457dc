"""How close check's record loader is to the floor: ms per run of compiled JSON readers against the artifact's own
loader (decode, every schema rule, the top-2 arrays: `artifact.check.run.load_run`) on the same requests.jsonl files,
best of 3, one thread, gc off (bench/README.md); and the loader reading each run from the checker's own
record cache instead (artifact.records.decoded, outside the results; filled by a first load here, in a temporary
folder of its own).

    python bench/load_floor.py RESULTS_DIR [--runs 10]      (RESULTS_DIR: e.g. bench_check.py --keep DIR)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.json as pj

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artifact.check.run import find_results, load_run
from artifact.records import decoded


def _off(data: bytes, run) -> tuple:
    os.environ[decoded.ENV] = "0"
    try:
        return load_run(run.path, run.manifest)
    finally:
        os.environ.pop(decoded.ENV)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="load-floor-cache-")
    os.environ[decoded.DIR_ENV] = cache
    os.environ.pop(decoded.ENV, None)
    try:
        return _measure(args)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _measure(args) -> int:
    runs = find_results(args.results)[: args.runs]
    files = [r.path / "requests.jsonl" for r in runs]
    data = [f.read_bytes() for f in files]
    gc.disable()
    anything = msgspec.json.Decoder()
    raw = msgspec.json.Decoder(dict[str, msgspec.Raw])
    one_thread = pj.ReadOptions(use_threads=False, block_size=1 << 26)
    readers = {
        "one pass over the bytes (bytes.count)": lambda d, r: d.count(b"\n"),
        "msgspec, every field left raw (a JSON-validity pass)": lambda d, r: raw.decode_lines(d),
        "pyarrow.json read_json into typed columns": lambda d, r: pj.read_json(
            pa.py_buffer(d), read_options=one_thread
        ),
        "msgspec untyped decode_lines (Python objects)": lambda d, r: anything.decode_lines(d),
        "stdlib json.loads per line": lambda d, r: [json.loads(line) for line in d.splitlines()],
        "the artifact's loader (load_run: decode, schema rules, top-2 arrays; cache off)": _off,
        "the artifact's loader from the checker's cache (warm)": lambda d, r: load_run(r.path, r.manifest),
    }
    for r in runs:
        load_run(r.path, r.manifest)  # fills the cache
    print(f"{len(runs)} runs, {sum(map(len, data)) / len(data) / 2**20:.2f} MiB of requests.jsonl each")
    for name, read in readers.items():
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for d, r in zip(data, runs):
                read(d, r)
            best = min(best, time.perf_counter() - t)
        print(f"  {name:<70} {best / len(runs) * 1000:7.1f} ms per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
