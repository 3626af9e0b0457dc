"""Synthetic run records written through the real RunWriter, for tests of everything that reads results."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from artifact.provenance import fingerprint
from artifact.records.store import RunWriter, load_run

MODEL = {"family": "testlm", "name": "TestLM-1B", "quant": "Q4_1", "sha256": "ab" * 32, "source": "path:x.gguf"}
ISOLATED = {"network": "loopback-only", "interfaces": ["lo"], "secrets_removed_from_env": []}


def pairing_inputs(model: dict, cache_ram_mib: int, engine: str = "llama.cpp", **changes) -> dict:
    """What the protocol hashes into a run's pairing_fingerprint (issue 7): equal for every run of a configuration
    and plan, whatever the arm; `changes` replace entries (e.g. threads=4) to make a run that may not be paired.
    Like the protocol's, they name the engine (its kind under "engine") and the model's sha256."""
    return {"engine": {"engine": engine, "binary_sha256": "ee" * 32}, "model_sha256": model["sha256"],
            "server_args": ["-c", "4096", "-np", "1", "--cache-ram", str(cache_ram_mib), "--seed", "42"],
            "request": {"temperature": 0.0, "seed": 42, "n_probs": 2}, "threads": 2,
            "bfcl": {"version": "2026.3.23", "dataset_sha256": "bf" * 32},
            "workload": {"name": "bfcl_multi_turn_base", "prompt_variant": "python", "max_steps_per_turn": 5},
            **changes}


def fingerprint_of(inputs: dict) -> str:
    """The digest the protocol records (artifact.protocol.sessions.fingerprints) and the checker recomputes."""
    return fingerprint(inputs)


def write_bfcl_run(root: Path, arm: str, run: int, episodes: dict, *, config: str = "cfg", plan: str = "main",
                   engine: str = "llama.cpp", model: dict | None = None, cache_n=None, valid: set | None = None,
                   texts: dict | None = None, logprobs: dict | None = None, complete: bool = True,
                   cache_ram_mib: int = 8192, lifecycle: str = "shared", prompts: dict | None = None,
                   inputs: dict | None = None, isolation: dict | None = ISOLATED, manifest: dict | None = None,
                   errors: dict | None = None, steps: dict | None = None, cache_ns: dict | None = None):
    """A BFCL run: episode `eid` made one request per token list in `episodes[eid]`.

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
    inputs = inputs if inputs is not None else pairing_inputs(model or MODEL, cache_ram_mib, engine)
    extra = {"pairing_inputs": inputs, "pairing_fingerprint": fingerprint_of(inputs),
             **({"isolation": isolation} if isolation is not None else {}), **(manifest or {})}
    w = RunWriter(d, {k: v for k, v in {
        "config": config, "plan": plan, "arm": arm, "run": run, "session": arm if lifecycle == "shared" else
        f"{arm}-run{run}", "episodes": list(episodes), "lifecycle": lifecycle, "engine": engine,
        "engine_build": "b10435-test", "model": model or MODEL, "workload": "bfcl_multi_turn_base",
        "plan_data": {"name": plan, "cache_ram_mib": cache_ram_mib, "lifecycle": lifecycle},
        "prompt_variant": "python", "server_cmd": ["llama-server", "-m", "x.gguf", "--cache-ram", str(cache_ram_mib)],
        "host": {"cpu": "Test CPU", "cpu_count": 2, "gpus": [], "os": "Linux-test", "python": "3.11"},
        "packages": {"key": {"numpy": "2.2.6"}}, "fingerprint": "x", **extra,
    }.items() if v is not None})
    for eid, outputs in episodes.items():
        for i, toks in enumerate(outputs):
            if cache_n == "null":
                cn = None
            elif cache_n in (None, "warm"):
                cn = 60 if (arm == "on" and (i or cache_n == "warm")) else 0
            else:
                cn = cache_n if i else 0
            cn = (cache_ns or {}).get((eid, i), cn)
            w.request({"episode_id": eid, "turn": 0, "step": i, "request_index": i,
                       "prompt_sha256": hashlib.sha256((prompts or {}).get((eid, i), f"{eid}/{i}").encode()).hexdigest(), "prompt_tokens": 100,
                       "output_tokens": toks, "output_text": (texts or {}).get((eid, i), f"text {toks}"),
                       "top_logprobs": (logprobs or {}).get((eid, i), [[[t, -0.1], [t + 1, -2.0]] for t in toks]),
                       "cache_n": cn, "prompt_n": 100 - (cn or 0), "prompt_ms": 10.0, "predicted_ms": 5.0,
                       "stop_type": "eos", "error": (errors or {}).get((eid, i))})
        ok = eid in (valid or set())
        w.episode({"episode_id": eid, "verdict": "valid" if ok else "state_mismatch", "valid": ok,
                   "n_requests": len(outputs), "error": None,
                   **({"steps": steps[eid]} if steps and eid in steps else {})})
    if complete:
        w.finish(wall_s=1.0)
    else:
        w.close()
    return load_run(d)


SHA = "ab" * 32  # a well-formed prompt_sha256 for hand-written records


def write_raw_run(run_dir: Path, manifest: dict, requests: list, episodes: list | None = None,
                  complete: bool = True) -> Path:
    """A run written as files, bypassing RunWriter (whose schema refuses malformed records): for tests of what the
    readers do with records the artifact itself would never write."""
    run_dir.mkdir(parents=True, exist_ok=True)
    m = {"status": "complete" if complete else "incomplete",
         **({"finished_at": "2026-01-01T00:00:00+00:00"} if complete else {}), **manifest}
    (run_dir / "manifest.json").write_text(json.dumps(m))
    (run_dir / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    (run_dir / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes or []))
    return run_dir


# --- a plan's four runs and a quantization series, shared by the tests of tables, claims, report and evidence --

def main_plan(root: Path, off: dict, on1: dict, on2: dict, **kw) -> list:
    return [write_bfcl_run(root, "off", 1, off, **kw), write_bfcl_run(root, "off", 2, off, **kw),
            write_bfcl_run(root, "on", 1, on1, **kw), write_bfcl_run(root, "on", 2, on2, **kw)]


OFF = {f"e{i}": [[1, 2, 3, 4, 5], [6, 7, 8]] for i in range(4)}
# ON run 1: e0 diverges at request 1, token 2; e2 at request 0, token 4.  ON run 2: as ON run 1, and e3 at (0, 0).
ON1 = {**OFF, "e0": [[1, 2, 3, 4, 5], [6, 7, 9]], "e2": [[1, 2, 3, 4, 0], [6, 7, 8]]}
ON2 = {**ON1, "e3": [[9, 2, 3, 4, 5], [6, 7, 8]]}


def trend_runs(root: Path, ks: dict, n: int = 80, model: dict | None = None, engine: str = "llama.cpp",
               manifest: dict | None = None):
    """For each quant: OFF run 1 and ON run 1 with the first k of n one-request episodes diverging (`manifest`: extra
    manifest fields of every run)."""
    runs = []
    for quant, k in ks.items():
        m = {**(model or MODEL), "quant": quant}
        off = {f"e{i}": [[1, 2]] for i in range(n)}
        on = {e: ([[1, 3]] if i < k else [[1, 2]]) for i, e in enumerate(off)}
        cfg = f"t-{quant}"
        runs += [write_bfcl_run(root, "off", 1, off, config=cfg, model=m, engine=engine, manifest=manifest),
                 write_bfcl_run(root, "on", 1, on, config=cfg, model=m, engine=engine, manifest=manifest)]
    return runs
