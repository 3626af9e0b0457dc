"""Where the protocol's wall time goes, per request: the server's own compute (prompt_ms + predicted_ms), the HTTP
round trip around it (the server's tokenization, response building and transfer), and the harness's Python (BFCL's
prompt builder, decoder and executor, record writing). The client's part of the round trip (decoding the response
JSON, reading the completion out of it) is timed on its own; the rest of it is the server's work outside its
reported timings and the transfer.

    PYTHONPATH=. .venv/bin/python bench/bench_harness.py [CONFIG] [--episodes N] [--plan PLAN] [--results DIR]

Runs one configuration-plan for real (the real llama-server, the real BFCL loop) with timers wrapped around the
engine session's two calls, and prints a breakdown. Target: the harness adds <= 2 % of wall time on a
GPU, where the server is fast; on 2 CPU cores the server dominates anyway.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from artifact.catalog import load_config, load_plan
from artifact.engines.llama_cpp import adapter as llama_server
from artifact.protocol.runner import execute_plan, with_episodes
from artifact.records.store import load_run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config", nargs="?", default="demo-smollm2-agent-cpu")
    ap.add_argument("--plan", default="main")
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--results", default=None)
    ap.add_argument("--json", default=None, help="also write the breakdown as JSON here")
    args = ap.parse_args()

    timings: list[dict] = []
    cls = llama_server.LlamaServer
    real_complete = cls.complete

    inside = [False]  # the client timers below count only within a completion (not health or props calls)

    def complete(self, prompt, n_predict, cache_prompt):
        t0 = time.perf_counter()
        inside[0] = True
        try:
            done = real_complete(self, prompt, n_predict, cache_prompt)
        finally:
            inside[0] = False
        rt = 1000 * (time.perf_counter() - t0)
        timings.append({"complete_rt_ms": rt, "server_ms": done.prompt_ms + done.predicted_ms})
        return done

    cls.complete = complete

    # The client's share of the round trip: decoding the response JSON and reading the completion out of it.
    client_ms: list[float] = []
    real_json, real_parse = httpx.Response.json, llama_server.parse_completion

    def timed(fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                if inside[0]:
                    client_ms.append(1000 * (time.perf_counter() - t0))

        return wrapper

    httpx.Response.json, llama_server.parse_completion = timed(real_json), timed(real_parse)
    cfg = with_episodes(load_config(args.config), args.episodes)
    results = Path(args.results or tempfile.mkdtemp(prefix="bench-harness-"))
    t0 = time.perf_counter()
    run_dirs = execute_plan(cfg, load_plan(args.plan), results)
    total_s = time.perf_counter() - t0

    runs = [load_run(d) for d in run_dirs]
    wall_ms = 1000 * sum(r.manifest["wall_s"] for r in runs)
    n = len(timings)
    server = sum(t["server_ms"] for t in timings)
    http = sum(t["complete_rt_ms"] - t["server_ms"] for t in timings)
    python = wall_ms - server - http
    out = {
        "config": cfg.name,
        "plan": args.plan,
        "runs": len(runs),
        "requests": n,
        "wall_s": wall_ms / 1000,
        "server_compute_s": server / 1000,
        "per_request_ms": {
            "server_compute": server / n,
            "completion_round_trip_minus_server_compute": http / n,
            "of_which_client_json_and_parse": sum(client_ms) / n,
            "harness_python": python / n,
            "overhead_total": (wall_ms - server) / n,
        },
        "overhead_share_of_wall": (wall_ms - server) / wall_ms,
        "median_round_trip_minus_server_ms": statistics.median(t["complete_rt_ms"] - t["server_ms"] for t in timings),
        "total_s_incl_server_starts": total_s,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
