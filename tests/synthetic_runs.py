"""Synthetic run records written through the real RunWriter, for tests of everything that reads results."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from artifact.provenance import fingerprint
from artifact.records.store import RunWriter, load_run

MODEL = {"family": "testlm", "name": "TestLM-1B", "quant": "Q4_1", "sha256": "ab" * 32, "source": "path:x.gguf"}
ISOLATED = {"network": "loopback-only", "interfaces": ["lo"], "secrets_removed_from_env": []}


VLLM_FLAGS = {"on": "--enable-prefix-caching", "off": "--no-enable-prefix-caching"}


def engine_identity(engine: str, model: dict, cache_ram_mib: int) -> dict:
    """The engine's part of the pairing inputs, shaped as the adapters' `identity()`: llama.cpp's binary sha256 and
    server arguments (port and model as placeholders), vLLM's version and `serve` arguments (the arm's flag as a
    placeholder); `server_command` is the command line each run records."""
    if engine == "endpoint":  # a server the user started: what it reports of itself, no command line, no binary
        return {
            "engine": engine,
            "servers": {"off": {"models": ["testlm"]}, "on": {"models": ["testlm"]}},
            "model_id": "testlm",
            "cache_control": "per server",
            "request_fields": {"temperature": 0.0},
            "unknown": ["server_cmd", "binary", "weights_sha256"],
        }
    if engine == "vllm":
        return {
            "engine": engine,
            "vllm": "0.11.0",
            "build": "cpu",
            "server_args": [
                "serve",
                "<model dir>",
                "--port",
                "<port>",
                "--seed",
                "42",
                "<arm: " + " | ".join(VLLM_FLAGS.values()) + ">",
            ],
        }
    return {
        "engine": engine,
        "binary_sha256": "ee" * 32,
        "server_args": [
            "-m",
            f"<model sha256 {model.get('sha256') or model['files'][0]['sha256']}>",
            "--cache-ram",
            str(cache_ram_mib),
        ],
    }


def server_command(inputs: dict, arm: str) -> list[str] | None:
    """The command line a run's manifest records: its engine identity's server_args with the placeholders filled
    (None for a server the artifact did not start)."""
    ident = inputs.get("engine") if isinstance(inputs.get("engine"), dict) else {}
    if ident.get("engine") == "endpoint":
        return None  # not known: the manifest has no server_cmd
    if ident.get("engine") == "vllm":
        fill = {"<model dir>": "/models/testlm", "<port>": "8000"}
        return ["vllm"] + [
            fill.get(a, VLLM_FLAGS.get(arm, a) if a.startswith("<arm") else a) for a in ident.get("server_args", [])
        ]
    args = ident.get("server_args") or ["-m", "<model>", "--cache-ram", "8192"]
    return ["llama-server"] + ["x.gguf" if a.startswith("<model") else a for a in args]


def timings(*key) -> tuple[float, float]:
    """A request's server timings (prompt_ms, predicted_ms), different for every run and request as a real
    server's are (the checker takes runs with identical timings on every request for copies)."""
    h = int(hashlib.sha256("/".join(map(str, key)).encode()).hexdigest()[:12], 16)
    return 10.0 + (h % 100_000) / 1000, 5.0 + (h // 100_000 % 100_000) / 1000


def pairing_inputs(model: dict, cache_ram_mib: int, engine: str = "llama.cpp", **changes) -> dict:
    """What the protocol hashes into a run's pairing_fingerprint: equal for every run of a configuration
    and plan, whatever the arm; `changes` replace entries (e.g. threads=4) to make a run that may not be paired.
    Like the protocol's, they name the engine (its kind under "engine", its identity) and the model's sha256."""
    return {
        "engine": engine_identity(engine, model, cache_ram_mib),
        "model_sha256": model.get("sha256"),
        "server_args": ["-c", "4096", "-np", "1", "--cache-ram", str(cache_ram_mib), "--seed", "42"],
        "request": {"temperature": 0.0, "seed": 42, "n_probs": 2},
        "threads": 2,
        "bfcl": {"version": "2026.3.23", "dataset_sha256": "bf" * 32},
        "workload": {"name": "bfcl_multi_turn_base", "prompt_variant": "python", "max_steps_per_turn": 5},
        **changes,
    }


def plan_cache_ram(plan: str) -> int:
    """The host prompt cache (MiB) a plan of configs/plans.toml runs with (8192, llama.cpp's default, otherwise)."""
    from artifact.catalog import load_plans

    known = load_plans().get(plan)
    return int(known.engine_settings.get("llama_cpp", {}).get("cache_ram_mib", 8192)) if known else 8192


def fingerprint_of(inputs: dict) -> str:
    """The digest the protocol records (artifact.protocol.sessions.fingerprints) and the checker recomputes."""
    return fingerprint(inputs)


def write_bfcl_run(
    root: Path,
    arm: str,
    run: int,
    episodes: dict,
    *,
    config: str = "cfg",
    plan: str = "main",
    engine: str = "llama.cpp",
    model: dict | None = None,
    cache_n=None,
    valid: set | None = None,
    texts: dict | None = None,
    logprobs: dict | None = None,
    complete: bool = True,
    cache_ram_mib: int | None = None,
    lifecycle: str = "shared",
    prompts: dict | None = None,
    inputs: dict | None = None,
    isolation: dict | None = ISOLATED,
    manifest: dict | None = None,
    errors: dict | None = None,
    steps: dict | None = None,
    cache_ns: dict | None = None,
):
    """A BFCL run: episode `eid` made one request per token list in `episodes[eid]`.

    cache_ram_mib: the host prompt cache on the command line (default: the plan's in configs/plans.toml, else 8192).
    cache_n: None -> 0 for OFF and 60 (of 100 prompt tokens) for ON requests after the first of an episode; "warm"
    -> 0 for OFF and 60 for every ON request (a server whose cache already holds the shared system prompt: one-request
    episodes are then served cached tokens, as RQ2 and RQ4 require of an ON run); an int -> that value for every
    request after the first; "null" -> JSON null (an engine that does not report it).
    texts[(eid, i)] / logprobs[(eid, i)] / prompts[(eid, i)] give a request's output_text / top_logprobs / prompt.
    inputs: the pairing_inputs (default `pairing_inputs(model, cache_ram_mib)`, equal for every arm and run); the
    manifest's pairing_fingerprint is their digest. isolation: the manifest's isolation record (None: left out).
    manifest: extra manifest fields (a value None removes the field). errors[(eid, i)]: that request's error.
    cache_ns[(eid, i)]: that request's cache_n (over the rule above).
    steps[eid]: the episode record's trajectory (per request: {"calls": [...] or None, "observations": [...]}).
    """
    d = root / config / plan / f"{arm}-run{run}"
    if cache_ram_mib is None:  # the plan's own host prompt cache (configs/plans.toml), as a real run records it
        cache_ram_mib = plan_cache_ram(plan)
    if inputs is None:
        inputs = pairing_inputs(model or MODEL, cache_ram_mib, engine)
        ident = ((manifest or {}).get("server") or {}).get("identity")
        if engine == "endpoint" and isinstance(ident, dict):  # paired by the identity its session recorded, as a run is
            inputs["engine"]["servers"] = {"off": ident, "on": ident}
    extra = {
        "pairing_inputs": inputs,
        "pairing_fingerprint": fingerprint_of(inputs),
        **({"isolation": isolation} if isolation is not None else {}),
        **(manifest or {}),
    }
    w = RunWriter(
        d,
        {
            k: v
            for k, v in {
                "config": config,
                "plan": plan,
                "arm": arm,
                "run": run,
                "session": arm if lifecycle == "shared" else f"{arm}-run{run}",
                "episodes": list(episodes),
                "lifecycle": lifecycle,
                "engine": engine,
                "engine_build": "b10435-test",
                "model": model or MODEL,
                "workload": "bfcl_multi_turn_base",
                "plan_data": {"name": plan, "cache_ram_mib": cache_ram_mib, "lifecycle": lifecycle},
                "prompt_variant": "python",
                "server_cmd": server_command(inputs, arm),
                "host": {"cpu": "Test CPU", "cpu_count": 2, "gpus": [], "os": "Linux-test", "python": "3.11"},
                "packages": {"key": {"numpy": "2.2.6"}},
                "fingerprint": "x",
                # weights pinned file by file (hf: sources) are recorded as the configuration's files, as real runs do
                **({"config_data": {"model": model}} if model and "files" in model else {}),
                **extra,
            }.items()
            if v is not None
        },
    )
    for eid, outputs in episodes.items():
        for i, toks in enumerate(outputs):
            if cache_n == "null":
                cn = None
            elif cache_n in (None, "warm"):
                cn = 60 if (arm == "on" and (i or cache_n == "warm")) else 0
            else:
                cn = cache_n if i else 0
            cn = (cache_ns or {}).get((eid, i), cn)
            w.request(
                {
                    "episode_id": eid,
                    "turn": 0,
                    "step": i,
                    "request_index": i,
                    "prompt_sha256": hashlib.sha256((prompts or {}).get((eid, i), f"{eid}/{i}").encode()).hexdigest(),
                    "prompt_tokens": 100,
                    "output_tokens": toks,
                    "output_text": (texts or {}).get((eid, i), f"text {toks}"),
                    "top_logprobs": (logprobs or {}).get((eid, i), [[[t, -0.1], [t + 1, -2.5]] for t in toks]),
                    "cache_n": cn,
                    "prompt_n": 100 - (cn or 0),
                    **dict(zip(("prompt_ms", "predicted_ms"), timings(config, plan, arm, run, eid, i))),
                    "stop_type": "eos",
                    "error": (errors or {}).get((eid, i)),
                }
            )
        ok = eid in (valid or set())
        w.episode(
            {
                "episode_id": eid,
                "verdict": "valid" if ok else "state_mismatch",
                "valid": ok,
                "n_requests": len(outputs),
                "error": None,
                **({"steps": steps[eid]} if steps and eid in steps else {}),
            }
        )
    load = (manifest or {}).get("tenants")
    if isinstance(load, dict) and isinstance(load.get("spec"), dict):
        write_tenants(d, load, [e for e, outputs in episodes.items() for _ in outputs])
    if complete:
        w.finish(wall_s=1.0)
    else:
        w.close()
    return load_run(d)


def write_tenants(run_dir: Path, load: dict, units: list[str]) -> None:
    """The run's tenants.jsonl as artifact/protocol/background_tenants.py writes it, made to agree with the manifest's
    `tenants` (`load`: its spec's count of tenants, `sent` requests and failures, `measured` requests and how many a
    tenant request overlapped, `units`: each unit's tenant prompts): the first tenant request spans the overlapped
    measured requests, the others come after every measured one."""
    count = load["spec"]["count"]
    pools = {u["unit"]: u["prompts_sha256"] for u in load.get("units", [])}
    sent, meas = load.get("sent", {}), load.get("measured", {})
    n_meas, overlapped = meas.get("requests", len(units)), meas.get("overlapped", 0)
    n_sent, failed = sent.get("requests", count), sent.get("failed", 0)
    rows = []
    for k in range(n_sent if count else 0):
        start, end = (
            (0.5, 10.0 * (overlapped - 1) + 1.0)
            if k == 0 and overlapped
            else (10.0 * (n_meas + k), 10.0 * (n_meas + k) + 1.0)
        )
        unit = units[0] if units else "e0"
        rows.append(
            {
                "kind": "tenant",
                "tenant": k % count,
                "unit": unit,
                "request": k,
                "prompt": k % 4,
                "prompt_sha256": pools[unit][k % 4]
                if unit in pools
                else hashlib.sha256(f"tenant/{k}".encode()).hexdigest(),
                "t_start": start,
                "t_end": end,
                "error": "HTTP 500" if k >= n_sent - failed else None,
                "slot": 1,
                "prompt_tokens": 100,
                "cache_n": 90,
                "prompt_n": 10,
                "predicted_n": 32,
                "prompt_ms": 5.0,
                "predicted_ms": 50.0,
            }
        )
    for i in range(n_meas):
        rows.append(
            {
                "kind": "measured",
                "unit": units[i] if i < len(units) else "e0",
                "t_start": 10.0 * i,
                "t_end": 10.0 * i + 5.0,
                "tenants_in_flight_at_start": 0,
                "tenant_requests_overlapping": int(i < overlapped),
                "overlap_s": 4.0 if i < overlapped else 0.0,
            }
        )
    (run_dir / "tenants.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


SHA = "ab" * 32  # a well-formed prompt_sha256 for hand-written records


def write_raw_run(
    run_dir: Path, manifest: dict, requests: list, episodes: list | None = None, complete: bool = True
) -> Path:
    """A run written as files, bypassing RunWriter (whose schema refuses malformed records): for tests of what the
    readers do with records the artifact itself would never write."""
    run_dir.mkdir(parents=True, exist_ok=True)
    m = {
        "status": "complete" if complete else "incomplete",
        **({"finished_at": "2026-01-01T00:00:00+00:00"} if complete else {}),
        **manifest,
    }
    (run_dir / "manifest.json").write_text(json.dumps(m))
    (run_dir / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    (run_dir / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes or []))
    return run_dir


# --- a plan's four runs and a quantization series, shared by the tests of tables, claims, report and evidence --


def main_plan(root: Path, off: dict, on1: dict, on2: dict, **kw) -> list:
    return [
        write_bfcl_run(root, "off", 1, off, **kw),
        write_bfcl_run(root, "off", 2, off, **kw),
        write_bfcl_run(root, "on", 1, on1, **kw),
        write_bfcl_run(root, "on", 2, on2, **kw),
    ]


OFF = {f"e{i}": [[1, 2, 3, 4, 5], [6, 7, 8]] for i in range(4)}
# ON run 1: e0 diverges at request 1, token 2; e2 at request 0, token 4.  ON run 2: as ON run 1, and e3 at (0, 0).
ON1 = {**OFF, "e0": [[1, 2, 3, 4, 5], [6, 7, 9]], "e2": [[1, 2, 3, 4, 0], [6, 7, 8]]}
ON2 = {**ON1, "e3": [[9, 2, 3, 4, 5], [6, 7, 8]]}


SERIES_RECIPE = "smollm2-135m-bfcl-agent"  # a recipe whose pinned levels make one series (F16, Q8_0, Q4_K_M, Q3_K_M)


def paper_model(config: str, **over) -> dict:
    """The [model] table of configs/paper/CONFIG.toml (the paper's weights, pinned file by file): runs with it are
    that paper configuration by their weights' digests (`models.lineage.pinned_model`); `over` edits labels."""
    from artifact.config import CONFIG_DIR, read_toml

    # model.sha256 is "" for a source pinned file by file, as the protocol records it (artifact.config.Model)
    return {"sha256": "", **read_toml(CONFIG_DIR / "paper" / f"{config}.toml")["model"], **over}


def series_model(model: dict, quant: str, recipe: str = SERIES_RECIPE) -> dict:
    """`model` at level `quant` with weights whose lineage the checker knows (artifact.models.lineage): the recipe's
    product for that level, its pinned sha256. The display name and family stay `model`'s: they are only shown."""
    from artifact.models.derive import load_recipe

    return {
        **model,
        "quant": quant,
        "sha256": load_recipe(recipe)["products"][quant],
        "source": f"derived:{recipe}/{quant}",
    }


def trend_runs(
    root: Path,
    ks: dict,
    n: int = 80,
    model: dict | None = None,
    engine: str = "llama.cpp",
    manifest: dict | None = None,
):
    """For each quant: OFF run 1 and ON run 1 with the first k of n one-request episodes diverging (`manifest`: extra
    manifest fields of every run). The levels are one series by their weights (`series_model`), whatever `model`'s
    name says."""
    runs = []
    for quant, k in ks.items():
        # a paper model's levels are its configurations' weights (configs/paper/<stem>-<level>.toml)
        m = (
            paper_model(f"{model['paper']}-{quant.lower()}")
            if model and "paper" in model
            else series_model(model or MODEL, quant)
        )
        off = {f"e{i}": [[1, 2]] for i in range(n)}
        on = {e: ([[1, 3]] if i < k else [[1, 2]]) for i, e in enumerate(off)}
        cfg = f"t-{quant}"
        runs += [
            write_bfcl_run(root, "off", 1, off, config=cfg, model=m, engine=engine, manifest=manifest),
            write_bfcl_run(root, "on", 1, on, config=cfg, model=m, engine=engine, manifest=manifest),
        ]
    return runs
