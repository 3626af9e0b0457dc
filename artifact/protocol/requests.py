"""The request path shared by every workload: one greedy /completion, recorded as it happens.

Each request's record (the `requests.jsonl` contract) is written whether the request succeeds or fails; a failed
request (e.g. a prompt that does not fit the context) raises RequestError after it is recorded.
"""

from __future__ import annotations

import hashlib
from typing import Callable

from artifact.config import Config
from artifact.engines.llama_server import LlamaServer, RequestError

Write = Callable[[dict], None]


def new_record(episode_id: str, turn: int, step: int, request_index: int, prompt: str) -> dict:
    return {
        "episode_id": episode_id, "turn": turn, "step": step, "request_index": request_index,
        "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
        "prompt_tokens": None, "output_tokens": [], "output_text": "", "top_logprobs": [],
        "cache_n": 0, "prompt_n": 0, "prompt_ms": 0.0, "predicted_ms": 0.0, "stop_type": None,
        "n_predict": 0, "error": None,
    }


def send(server: LlamaServer, cfg: Config, prompt: str, cache_prompt: bool, record: dict, write: Write) -> dict:
    """Send one request, fill and write its record; returns the record (raises RequestError once recorded)."""
    ctx = cfg.server.ctx_size
    record["prompt_tokens"] = n_prompt = server.count_tokens(prompt)
    room = ctx - n_prompt - 2
    try:
        if room < 1:
            raise RequestError(f"prompt of {n_prompt} tokens leaves no room in a {ctx}-token context")
        record["n_predict"] = n_predict = min(cfg.workload.n_predict, room)
        resp = server.complete(prompt, n_predict, cache_prompt)
    except RequestError as exc:
        record["error"] = str(exc)
        write(record)
        raise
    t = resp["timings"]
    record.update(
        prompt_tokens=resp.get("tokens_evaluated", n_prompt),
        output_tokens=resp["tokens"], output_text=resp["content"],
        top_logprobs=[[[p["id"], p["logprob"]] for p in pos["top_logprobs"]]
                      for pos in resp.get("completion_probabilities", [])],
        cache_n=t["cache_n"], prompt_n=t["prompt_n"],
        prompt_ms=t["prompt_ms"], predicted_ms=t["predicted_ms"], stop_type=resp.get("stop_type"),
    )
    write(record)
    return record
