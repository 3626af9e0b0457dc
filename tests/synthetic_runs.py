"""Synthetic run records written through the real RunWriter, for tests of everything that reads results."""

from __future__ import annotations

import hashlib
from pathlib import Path

from artifact.records.store import RunWriter, load_run

MODEL = {"family": "testlm", "name": "TestLM-1B", "quant": "Q4_1", "sha256": "ab" * 32, "source": "path:x.gguf"}


def write_bfcl_run(root: Path, arm: str, run: int, episodes: dict, *, config: str = "cfg", plan: str = "main",
                   engine: str = "llama.cpp", model: dict | None = None, cache_n=None, valid: set | None = None,
                   texts: dict | None = None, logprobs: dict | None = None, complete: bool = True,
                   cache_ram_mib: int = 8192, lifecycle: str = "shared", prompts: dict | None = None):
    """A BFCL run: episode `eid` made one request per token list in `episodes[eid]`.

    cache_n: None -> 0 for OFF and 60 (of 100 prompt tokens) for ON requests after the first of an episode; an int
    -> that value for every request after the first; "null" -> JSON null (an engine that does not report it).
    texts[(eid, i)] / logprobs[(eid, i)] / prompts[(eid, i)] give a request's output_text / top_logprobs / prompt.
    """
    d = root / config / plan / f"{arm}-run{run}"
    w = RunWriter(d, {
        "config": config, "plan": plan, "arm": arm, "run": run, "session": arm if lifecycle == "shared" else
        f"{arm}-run{run}", "episodes": list(episodes), "lifecycle": lifecycle, "engine": engine,
        "engine_build": "b10435-test", "model": model or MODEL, "workload": "bfcl_multi_turn_base",
        "plan_data": {"name": plan, "cache_ram_mib": cache_ram_mib, "lifecycle": lifecycle},
        "prompt_variant": "python", "server_cmd": ["llama-server", "-m", "x.gguf", "--cache-ram", str(cache_ram_mib)],
        "host": {"cpu": "Test CPU", "cpu_count": 2, "gpus": [], "os": "Linux-test", "python": "3.11"},
        "packages": {"key": {"numpy": "2.2.6"}}, "fingerprint": "x",
    })
    for eid, outputs in episodes.items():
        for i, toks in enumerate(outputs):
            if cache_n == "null":
                cn = None
            elif cache_n is None:
                cn = 60 if (arm == "on" and i) else 0
            else:
                cn = cache_n if i else 0
            w.request({"episode_id": eid, "turn": 0, "step": i, "request_index": i,
                       "prompt_sha256": hashlib.sha256((prompts or {}).get((eid, i), f"{eid}/{i}").encode()).hexdigest(), "prompt_tokens": 100,
                       "output_tokens": toks, "output_text": (texts or {}).get((eid, i), f"text {toks}"),
                       "top_logprobs": (logprobs or {}).get((eid, i), [[[t, -0.1], [t + 1, -2.0]] for t in toks]),
                       "cache_n": cn, "prompt_n": 100 - (cn or 0), "prompt_ms": 10.0, "predicted_ms": 5.0,
                       "stop_type": "eos", "error": None})
        ok = eid in (valid or set())
        w.episode({"episode_id": eid, "verdict": "valid" if ok else "state_mismatch", "valid": ok,
                   "n_requests": len(outputs), "error": None})
    if complete:
        w.finish(wall_s=1.0)
    else:
        w.close()
    return load_run(d)
