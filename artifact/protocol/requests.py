"""The request path shared by every workload: one greedy completion, recorded as it happens.

Each request's record (the `requests.jsonl` contract) is written whether the request succeeds or fails. A request
the engine cannot serve (a prompt that does not fit the context) raises RequestError after it is recorded; every
other failure (the server gone, HTTP 5xx, a malformed response, a record that cannot be written) raises
ArtifactError, which ends the run as incomplete, never as an episode outcome.
"""

from __future__ import annotations

import hashlib
from typing import Callable

from artifact.config import Config
from artifact.engines.base import EngineSession, RequestError
from artifact.errors import ArtifactError

Write = Callable[[dict], None]


def new_record(episode_id: str, turn: int, step: int, request_index: int, prompt: str) -> dict:
    return {
        "episode_id": episode_id,
        "turn": turn,
        "step": step,
        "request_index": request_index,
        "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
        "prompt_tokens": None,
        "output_tokens": [],
        "output_text": "",
        "top_logprobs": [],
        "cache_n": 0,
        "prompt_n": 0,
        "prompt_ms": 0.0,
        "predicted_ms": 0.0,
        "stop_type": None,
        "n_predict": 0,
        "error": None,
    }


def _write(write: Write, record: dict) -> None:
    try:
        write(record)
    except OSError as exc:  # a full disk or a vanished results directory: the run cannot be recorded
        raise ArtifactError(
            f"cannot write the request record ({exc.strerror or exc}); the run stays incomplete "
            "and is re-run on the next invocation"
        ) from None


def send(server: EngineSession, cfg: Config, prompt: str, cache_prompt: bool, record: dict, write: Write) -> dict:
    """Send one request, fill and write its record; returns the record (raises RequestError once recorded).

    The prompt is not tokenized separately first: the engine reports its length (and refuses a prompt that does not
    fit the context); generation stops at `n_predict` tokens or where the context is full, whichever comes first.
    One request per step keeps the harness's share of wall time small on a fast GPU (bench/bench_harness.py)."""
    record["n_predict"] = cfg.workload.n_predict
    try:
        done = server.complete(prompt, cfg.workload.n_predict, cache_prompt)
    except RequestError as exc:
        record["error"] = str(exc)
        record["prompt_tokens"] = exc.prompt_tokens
        _write(write, record)
        raise
    record.update(
        prompt_tokens=done.prompt_tokens,
        output_tokens=done.tokens,
        output_text=done.text,
        top_logprobs=done.top_logprobs,
        cache_n=done.cache_n,
        prompt_n=done.prompt_n,
        prompt_ms=done.prompt_ms,
        predicted_ms=done.predicted_ms,
        stop_type=done.stop_type,
    )
    if done.extra:
        record["engine_extra"] = done.extra
    _write(write, record)
    return record
