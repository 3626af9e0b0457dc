"""A results directory's provenance in one file: per run the engine build and binary hash, GPU, driver, flags,
model hash, key package versions, wall and server time. Used for evidence/*/manifest-summary.json.

    .venv/bin/python scripts/manifest-summary.py RESULTS_DIR > manifest-summary.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from artifact.records.store import find_runs


def summary(results: Path) -> dict:
    runs = []
    for run in find_runs(results):
        m = run.manifest
        server_s = sum((r.get("prompt_ms") or 0) + (r.get("predicted_ms") or 0) for r in run.requests) / 1000
        runs.append(
            {
                "run": run.label,
                "status": m["status"],
                "episodes": len(m["episodes"]),
                "requests": len(run.requests),
                "wall_s": m.get("wall_s"),
                "server_compute_s": round(server_s, 3),
                "cached_prompt_tokens": sum(r.get("cache_n") or 0 for r in run.requests),
                "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in run.requests),
                "engine_build": m.get("engine_build"),
                "binary_sha256": (m.get("binary") or {}).get("sha256"),
                "binary_files_sha256": (m.get("binary") or {}).get("files_sha256"),
                "cmake_args": (m.get("engine_build_flags") or {}).get("cmake_args"),
                "server_cmd": m.get("server_cmd"),
                "cache_condition": m.get("cache_condition"),
                "model": m.get("model"),
                "gpus": (m.get("host") or {}).get("gpus"),
                "cpu": (m.get("host") or {}).get("cpu"),
                "python": (m.get("host") or {}).get("python"),
                "packages": (m.get("packages") or {}).get("key"),
                "isolation": (m.get("isolation") or {}).get("network"),
                "pairing_fingerprint": m.get("pairing_fingerprint"),
                "started_at": m.get("started_at"),
                "finished_at": m.get("finished_at"),
            }
        )
    return {"results": str(results), "runs": runs}


if __name__ == "__main__":
    json.dump(summary(Path(sys.argv[1])), sys.stdout, indent=1)
    sys.stdout.write("\n")
