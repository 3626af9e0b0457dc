"""Shared test helpers: synthetic run records written through the real RunWriter."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from artifact.records.store import RunWriter, load_run


def write_run(root: Path, arm: str, run: int, episodes: dict, *, cache_n: int = 0, complete: bool = True,
              config: str = "synthetic", plan: str = "main", prompts: dict | None = None):
    """A run whose episode `eid` made one request per token list in `episodes[eid]`."""
    d = root / config / plan / f"{arm}-run{run}"
    w = RunWriter(d, {"config": config, "plan": plan, "arm": arm, "run": run, "episodes": list(episodes),
                      "lifecycle": "shared", "plan_data": {"cache_ram_mib": 0}, "prompt_variant": "default",
                      "engine_build": "b0-test", "fingerprint": "x"})
    for eid, outputs in episodes.items():
        for i, toks in enumerate(outputs):
            prompt = (prompts or {}).get((eid, i), f"{eid}/{i}")
            w.request({"episode_id": eid, "turn": 0, "step": i, "request_index": i,
                       "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(), "prompt_tokens": 100,
                       "output_tokens": toks, "output_text": "", "top_logprobs": [], "cache_n": cache_n if i else 0,
                       "prompt_n": 100 - (cache_n if i else 0), "prompt_ms": 10.0, "predicted_ms": 5.0,
                       "stop_type": "eos", "error": None})
        w.episode({"episode_id": eid, "verdict": "valid", "valid": True, "n_requests": len(outputs),
                   "error": None})
    if complete:
        w.finish(wall_s=1.0)
    else:
        w.close()
    return load_run(d)


@pytest.fixture
def make_run(tmp_path):
    return lambda *a, **k: write_run(tmp_path, *a, **k)
