"""Benchmark `./run.sh check` on synthetic paper-scale results.

Writes, through the real RunWriter into a temporary directory, 10 configurations (the paper's Tab. 2 set: four
Qwen2.5-7B levels, three Llama-3.1-8B levels, Qwen2.5-14B Q4_K_M and two vLLM 16-bit configurations) x 4 runs
(plan main: OFF run 1+2, ON run 1+2) x 80 episodes x 7-13 requests (about 10), each request with 10-80 generated
tokens, their top-2 log-probabilities (as a softmax gives them; the ON arm's slightly perturbed, as cached requests'
are) and text, as the protocol records them. Then times `run_check` on it (the timing excludes writing the synthetic
results) and prints the breakdown per step: loading and validating the records, the paper's tables and claims, each
analysis beyond the paper, each figure, the report and the writing of the outputs, in wall and CPU seconds (CPU
seconds compare better on a shared machine). Target: `./run.sh check` as a fresh process (imports included)
<= 2.5 s on the 2-core CI machine (TARGET_S); measure when the machine is quiet (the load average is printed with
the numbers).

    python bench/bench_check.py [--repeat 3] [--keep DIR] [--profile] [--figure bench/check_timing.png]

It also times `python -m artifact check DIR` in fresh interpreters (what `./run.sh check DIR` costs, imports and its
worker process included: artifact.check.worker): the median is the number the target is about; beside it, the CPU
seconds of all its processes and of the checking process alone. Three fresh-process lines: the first time
check sees the results (the checker's own cache empty: every requests.jsonl decoded and validated, then cached,
artifact.records.decoded, and the check kept, artifact.check.replay; target TARGET_S); with that cache warm (the
same results and checker: the check replayed; WARM_TARGET_S); and with the cache warm but replays off (the check run
on the cached records: no target, what a check of results that changed in part comes near). Each is also printed
as a ratio to the floor measured in the same run: a fresh interpreter that only decodes every record file (manifests,
requests.jsonl, episodes.jsonl) with msgspec's JSON decoder (`floor_process`). The bench's cache is a folder of its
own (ARTIFACT_RECORD_CACHE), never the user's. bench/README.md keeps the current figures.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import math
import os
import pstats
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from artifact.check import replay  # noqa: E402 -- after sys.path
from artifact.check.run import TIMINGS, run_check  # noqa: E402 -- after sys.path
from artifact.provenance import fingerprint  # noqa: E402 -- after sys.path
from artifact.records import decoded  # noqa: E402 -- after sys.path
from artifact.records.store import RunWriter  # noqa: E402 -- after sys.path

EPISODES = 80
TARGET_S = 2.5  # a fresh `check` process at paper scale, imports included, the first time it sees the results
WARM_TARGET_S = 1.5  # the same with the checker's own cache warm (the check replayed)
# (config, engine, family, model name, quant, ON-vs-OFF rate, ON-rerun rate): rates near the paper's Tab. 2 values
CONFIGS = (
    ("qwen2.5-7b-f16", "llama.cpp", "qwen2.5", "Qwen2.5-7B-Instruct", "F16", 0.362, 0.200),
    ("qwen2.5-7b-q8_0", "llama.cpp", "qwen2.5", "Qwen2.5-7B-Instruct", "Q8_0", 0.55, 0.30),
    ("qwen2.5-7b-q4_k_m", "llama.cpp", "qwen2.5", "Qwen2.5-7B-Instruct", "Q4_K_M", 0.75, 0.388),
    ("qwen2.5-7b-q3_k_m", "llama.cpp", "qwen2.5", "Qwen2.5-7B-Instruct", "Q3_K_M", 0.78, 0.40),
    ("llama-3.1-8b-q8_0", "llama.cpp", "llama3.1", "Meta-Llama-3.1-8B-Instruct", "Q8_0", 0.55, 0.25),
    ("llama-3.1-8b-q4_k_m", "llama.cpp", "llama3.1", "Meta-Llama-3.1-8B-Instruct", "Q4_K_M", 0.70, 0.35),
    ("llama-3.1-8b-q3_k_m", "llama.cpp", "llama3.1", "Meta-Llama-3.1-8B-Instruct", "Q3_K_M", 0.688, 0.40),
    ("qwen2.5-14b-q4_k_m", "llama.cpp", "qwen2.5", "Qwen2.5-14B-Instruct", "Q4_K_M", 0.912, 0.775),
    ("vllm-qwen2.5-7b-bf16", "vllm", "qwen2.5", "Qwen2.5-7B-Instruct", "BF16", 0.625, 0.088),
    ("vllm-llama-3.1-8b-bf16", "vllm", "llama3.1", "Meta-Llama-3.1-8B-Instruct", "BF16", 0.60, 0.275),
)


def _top2(t: int, perturb: float = 0.0) -> list[list]:
    """The top-2 entries of emitted token t: probabilities p1 >= p2 with p1 + p2 < 1, as a softmax gives them;
    margins log(p1 / p2) from 0.36 to 6.2 nats; `perturb` changes p2 by that fraction (a cached request's numeric
    difference: on the H200 almost every position at risk has one)."""
    p1 = 0.5 + (t % 50) / 100
    return [[t, math.log(p1)], [t + 1, math.log((1 - p1) * (0.2 + (t % 3) / 4) * (1 + perturb))]]


def _episode(rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(32000) for _ in range(rng.randint(10, 80))] for _ in range(rng.randint(7, 13))]


def _diverge(rng: random.Random, ep: list[list[int]]) -> list[list[int]]:
    """The same episode up to a random request and token, then different tokens (and later requests)."""
    i = min(rng.choice((0, 0, 1, 1, 2, 3, 4)), len(ep) - 1)
    t = rng.randrange(min(len(ep[i]), 20))
    head = ep[:i] + [ep[i][:t] + [ep[i][t] + 1] + ep[i][t + 1 :]]
    return head + [
        [rng.randrange(32000) for _ in range(rng.randint(10, 80))] for _ in range(rng.randint(7, 13) - i - 1)
    ]


def write_run(root: Path, cfg: tuple, arm: str, k: int, episodes: dict[str, list[list[int]]], rng: random.Random):
    name, engine, family, model, quant = cfg[:5]
    d = root / name / "main" / f"{arm}-run{k}"
    vllm = engine == "vllm"
    sha = hashlib.sha256(name.encode()).hexdigest()
    # equal for every run of a configuration (the checker pairs only runs with equal fingerprints, and recomputes it)
    # the engine part shaped as the adapters' identity() (what the checker holds a manifest's engine label against)
    ident = (
        {
            "engine": engine,
            "vllm": "0.11.0",
            "server_args": [
                "serve",
                "<model dir>",
                "--port",
                "<port>",
                "<arm: --enable-prefix-caching | --no-enable-prefix-caching>",
            ],
        }
        if vllm
        else {
            "engine": engine,
            "binary_sha256": "ee" * 32,
            "server_args": ["-m", f"<model sha256 {sha}>", "-c", "32768", "-np", "1", "--cache-ram", "8192"],
        }
    )
    inputs = {"model_sha256": sha, "engine": ident, "units": list(episodes)}
    cmd = (
        [
            "vllm",
            "serve",
            f"/models/{name}",
            "--port",
            "8000",
            "--enable-prefix-caching" if arm == "on" else "--no-enable-prefix-caching",
        ]
        if vllm
        else ["llama-server", "-m", f"models/{name}.gguf", "-c", "32768", "-np", "1", "--cache-ram", "8192"]
    )
    w = RunWriter(
        d,
        {
            "config": name,
            "plan": "main",
            "arm": arm,
            "run": k,
            "session": arm,
            "lifecycle": "shared",
            "engine": engine,
            "engine_build": "vllm 0.11.0" if vllm else "b10435-9e40df63",
            "model": {
                "family": family,
                "name": model,
                "quant": quant,
                "sha256": sha,
                "source": f"path:models/{name}.gguf",
            },
            "plan_data": {
                "name": "main",
                "arms": ["off", "on"],
                "runs": 2,
                "lifecycle": "shared",
                "cache_ram_mib": 8192,
            },
            "workload": "bfcl_multi_turn_base",
            "prompt_variant": "default",
            "episodes": list(episodes),
            "server_cmd": cmd,
            "host": {"cpu": "synthetic", "cpu_count": 16, "gpus": [{"name": "NVIDIA RTX 4090", "driver": "560"}]},
            "packages": {"key": {"numpy": "2.2.6"}},
            "fingerprint": "bench",
            "pairing_inputs": inputs,
            "pairing_fingerprint": fingerprint(inputs),
            "isolation": {"network": "loopback-only", "interfaces": ["lo"], "secrets_removed_from_env": []},
        },
    )
    for eid, reqs in episodes.items():
        prompt = 3000
        prompt_sha = hashlib.sha256(eid.encode()).hexdigest()  # an episode's first prompt is its own, in every run
        for i, toks in enumerate(reqs):
            cached = 0 if arm == "off" else (prompt - 50 if i else 2500)
            w.request(
                {
                    "episode_id": eid,
                    "turn": i // 3,
                    "step": i % 3,
                    "request_index": i,
                    "prompt_sha256": prompt_sha,
                    "prompt_tokens": prompt,
                    "output_tokens": toks,
                    "output_text": " ".join(f"t{t}" for t in toks),
                    "top_logprobs": [_top2(t, ((7 * t + i) % 13 - 6) / 1000 if arm == "on" else 0.0) for t in toks],
                    # a real server's timings differ on every request and run (identical ones mark a copied run)
                    "cache_n": cached,
                    "prompt_n": prompt - cached,
                    "prompt_ms": round(rng.uniform(80.0, 120.0), 3),
                    "predicted_ms": round(20.0 * len(toks) * rng.uniform(0.9, 1.1), 3),
                    "stop_type": "eos",
                    "error": None,
                    **(
                        {"engine_extra": {"usage_cached_tokens": cached, "metrics_prefix_cache_hits": cached}}
                        if vllm
                        else {}
                    ),
                }
            )
            prompt += len(toks) + 120
            # the next prompt: the one before and what came back
            prompt_sha = hashlib.sha256(f"{prompt_sha}/{toks}".encode()).hexdigest()
        valid = rng.random() < 0.1  # BFCL's verdict, and `valid` saying the same (the checker holds them together)
        w.episode(
            {
                "episode_id": eid,
                "verdict": "valid" if valid else "state_mismatch",
                "valid": valid,
                "n_requests": len(reqs),
                "error": None,
            }
        )
    w.finish(wall_s=600.0)


def write_results(root: Path, seed: int = 42) -> int:
    rng = random.Random(seed)
    n_requests = 0
    for cfg in CONFIGS:
        p_onoff, p_rerun = cfg[5], cfg[6]
        off = {f"multi_turn_base_{i}": _episode(rng) for i in range(EPISODES)}
        on1 = {e: (_diverge(rng, r) if rng.random() < p_onoff else r) for e, r in off.items()}
        on2 = {e: (_diverge(rng, r) if rng.random() < p_rerun else r) for e, r in on1.items()}
        for arm, k, eps in (("off", 1, off), ("off", 2, off), ("on", 1, on1), ("on", 2, on2)):
            write_run(root, cfg, arm, k, eps, rng)
            n_requests += sum(len(r) for r in eps.values())
    return n_requests


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def breakdown(walls: list[dict[str, float]], cpus: list[dict[str, float]]) -> list[tuple[str, float, float]]:
    """(step, median wall seconds, median CPU seconds) over the repeats, in check's order of steps."""
    return [(name, _median([w[name] for w in walls]), _median([c[name] for c in cpus])) for name in walls[0]]


def fresh_process(root: Path, cache: Path | None = None, replays: bool = True) -> tuple[float, float, float]:
    """Wall and CPU seconds (user + system) of `python -m artifact check DIR` (what `./run.sh check DIR` runs, less
    the shell's set-up check), imports (pandas, scipy, pyarrow, msgspec, matplotlib) included, its worker process
    included; and the CPU seconds of the checking process alone (`cpu_s` in check/timings.json, where check keeps
    what differs on every check). `cache`: the checker's record cache directory (ARTIFACT_RECORD_CACHE; None: the
    cache off); `replays`: whether a check the cache holds is replayed (artifact.check.replay; ARTIFACT_CHECK_REPLAY).
    Python keeps its compiled modules as it does
    by default (PYTHONDONTWRITEBYTECODE is dropped: `main` runs one untimed check first, so that no timed run
    compiles the artifact's modules)."""
    shutil.rmtree(root / "check", ignore_errors=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONDONTWRITEBYTECODE", decoded.ENV, decoded.DIR_ENV, replay.ENV)
    }
    env.update({decoded.DIR_ENV: str(cache)} if cache is not None else {decoded.ENV: "0"})
    env.update({} if replays else {replay.ENV: "0"})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "artifact", "check", str(root)],
        cwd=REPO,
        check=False,
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        own = json.loads((root / "check" / TIMINGS).read_text())["cpu_s"]["checking process"]
    except (OSError, ValueError, KeyError):
        own = math.nan
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), own


# The floor: a fresh interpreter that imports msgspec and decodes every record file of the results (untyped, one
# Python object per JSON value), nothing else: no validation, no analysis, no output.
FLOOR = """
import sys
from pathlib import Path
import msgspec
dec = msgspec.json.Decoder()
n = 0
for mf in sorted(Path(sys.argv[1]).rglob("manifest.json")):
    dec.decode(mf.read_bytes())
    for name in ("requests.jsonl", "episodes.jsonl"):
        f = mf.parent / name
        if f.is_file():
            n += len(dec.decode_lines(f.read_bytes()))
print(n)
"""


def floor_process(root: Path) -> float:
    """Wall seconds of a fresh interpreter that only decodes every record file with a fast JSON decoder (`FLOOR`)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR, str(root)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def save_figure(steps: list[tuple[str, float, float]], cold: float, path: Path) -> None:
    """Stacked bar of run_check's steps (median wall over repeats) and a bar for a fresh process, against the
    target."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 3.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    left = 0.0
    for name, wall, _ in steps:
        ax.barh([1], [wall], left=left, label=f"{name} {wall:.2f} s")
        left += wall
    ax.barh([0], [cold], color="grey", label=f"fresh process {cold:.2f} s (median)")
    ax.axvline(TARGET_S, color="red", linestyle="--", label=f"target {TARGET_S} s (fresh process)")
    ax.set_yticks([0, 1], ["fresh process\n(imports included)", f"run_check\n(in process) {left:.2f} s"])
    ax.set_xlabel("seconds")
    ax.set_title(
        f"check on synthetic paper-scale results ({len(CONFIGS)} configs x 4 runs x {EPISODES} episodes)", fontsize=9
    )
    ax.legend(fontsize=5, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.savefig(path, format="png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="write the synthetic results here and keep them")
    ap.add_argument("--profile", action="store_true", help="print the top functions of one profiled run")
    ap.add_argument("--figure", type=Path, default=None, help="also draw the breakdown as a PNG here")
    args = ap.parse_args(argv)

    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-check-"))
    cache = Path(tempfile.mkdtemp(prefix="bench-record-cache-"))  # the checker's record cache: the bench's own
    os.environ[decoded.DIR_ENV] = str(cache)
    os.environ.pop(decoded.ENV, None)
    os.environ[replay.ENV] = "0"  # the in-process runs check the same results again: each is to run the check
    try:
        t = time.perf_counter()
        if not any(root.rglob("manifest.json")):
            n = write_results(root)
            print(
                f"wrote {len(CONFIGS)} configurations x 4 runs x {EPISODES} episodes, {n} requests, "
                f"{sum(f.stat().st_size for f in root.rglob('*.jsonl')) / 2**20:.0f} MiB in "
                f"{time.perf_counter() - t:.1f} s ({root})"
            )
        print(
            f"machine: {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}, load average "
            f"{os.getloadavg()[0]:.2f} (1 min)"
        )
        totals, walls, cpus, figures = [], [], [], []
        for i in range(args.repeat):
            shutil.rmtree(root / "check", ignore_errors=True)
            t = time.perf_counter()
            code = run_check(root, quiet=True)
            totals.append(time.perf_counter() - t)
            walls.append(dict(run_check.last_timings))
            cpus.append(dict(run_check.last_cpu))
            figures.append(dict(run_check.last_figures))
            print(f"run {i + 1}: {totals[-1]:.2f} s wall, {sum(cpus[-1].values()):.2f} s CPU (exit code {code})")
        steps = breakdown(walls, cpus)
        print(
            f"run_check in process, per step (median of {len(totals)} runs; the first run of a process also "
            "pays matplotlib's one-time set-up):"
        )
        print(f"  {'step':<34} {'wall s':>7} {'CPU s':>7}")
        for name, wall, cpu in steps:
            print(f"  {name:<34} {wall:7.3f} {cpu:7.3f}")
        print(f"  {'total':<34} {sum(s[1] for s in steps):7.3f} {sum(s[2] for s in steps):7.3f}")
        if figures[-1]:
            print(
                "figures, each drawn while the steps go on (in the worker process at this scale; the step "
                "'figures' is the wait for them):"
            )
            for name in figures[-1]:
                print(
                    f"  {name:<34} {_median([f[name][0] for f in figures]):7.3f} "
                    f"{_median([f[name][1] for f in figures]):7.3f}"
                )
        print(
            f"run_check: best {min(totals):.2f} s, mean {sum(totals) / len(totals):.2f} s over {len(totals)} runs "
            "(in process)"
        )
        fresh_process(root)  # untimed: Python compiles and keeps the modules a fresh check imports
        floors, fresh, warm, records = [], [], [], []
        for _ in range(args.repeat):  # interleaved: the machine's speed drifts
            floors.append(floor_process(root))
            shutil.rmtree(cache, ignore_errors=True)
            fresh.append(fresh_process(root, cache))  # the first time: nothing cached
            warm.append(fresh_process(root, cache))  # the cache the run before wrote: the check replayed
            records.append(fresh_process(root, cache, replays=False))  # the same, the check run on cached records
        floor = _median(floors)
        print(
            f"floor (a fresh interpreter decoding every record file with msgspec, nothing else): median {floor:.2f} "
            f"s wall (runs: {', '.join(f'{f:.2f}' for f in floors)})"
        )
        for name, got, target in (
            ("first time (checker's cache empty)", fresh, TARGET_S),
            ("checker's cache warm (the check replayed)", warm, WARM_TARGET_S),
            ("checker's cache warm, replays off (the check run on cached records)", records, None),
        ):
            wall, cpu, own = (_median([f[i] for f in got]) for i in range(3))
            print(
                f"fresh process, {name}: median {wall:.2f} s wall = {wall / floor:.1f} x the floor, {cpu:.2f} s "
                f"CPU, of which the checking process {own:.2f} s and its worker {cpu - own:.2f} s (runs: "
                f"{', '.join(f'{f[0]:.2f}' for f in got)}); "
                + (f"target <= {target} s: {'met' if wall <= target else 'NOT met'}; " if target else "")
                + f"load average {os.getloadavg()[0]:.2f}"
            )
        cold = _median([f[0] for f in fresh])
        if args.profile:
            shutil.rmtree(root / "check", ignore_errors=True)
            prof = cProfile.Profile()
            prof.runcall(run_check, root, quiet=True)
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
            print(s.getvalue())
        if args.figure:
            save_figure(steps, cold, args.figure)
            print(f"figure: {args.figure}")
        return 0 if cold <= TARGET_S and _median([f[0] for f in warm]) <= WARM_TARGET_S else 1
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
