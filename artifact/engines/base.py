"""The one small interface every serving engine satisfies; the protocol never asks which engine runs.

An engine session is one server process for one arm's runs (the protocol's unit of server lifecycle). It starts
bound to 127.0.0.1 with a clean environment, records its full command line and log, answers one greedy completion
at a time, and reports its provenance. `open_session` (in `artifact.engines`) picks the adapter by `engine.kind`.

Failure kinds, kept apart because they are scored differently:
  RequestError   the request itself cannot be served (a prompt that does not fit the context): recorded in the
                 request's `error` and, for BFCL, ends the episode as BFCL's own inference error;
  ArtifactError  anything else (the server died or stopped answering, HTTP 5xx, a malformed response, a full disk):
                 fatal for the run, which stays incomplete and is re-run whole on resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Greedy decoding stated explicitly (the same values on every engine; each adapter sends its own field names).
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 42}
TOP_N = 2  # log-probabilities recorded per generated position (top-2 margins)


class RequestError(Exception):
    """A request the server cannot serve (a prompt that does not fit the context); recorded in the request's
    `error` field, with the prompt length when the engine reports it."""

    def __init__(self, message: str, prompt_tokens: int | None = None):
        super().__init__(message)
        self.prompt_tokens = prompt_tokens


@dataclass
class Completion:
    """One greedy completion, in engine-neutral form (the fields of a request record)."""

    tokens: list[int]
    text: str
    top_logprobs: list[list[list]]  # per generated position: [[token id, logprob], ...] best first
    prompt_tokens: int
    cache_n: int | None  # prompt tokens served from cache; None = the engine did not report it
    prompt_n: int | None  # prompt tokens computed
    prompt_ms: float | None
    predicted_ms: float | None
    stop_type: str | None
    extra: dict = field(default_factory=dict)  # engine-specific evidence, recorded as `engine_extra`


class EngineSession(Protocol):
    kind: str
    cmd: list[str]
    log_path: Path

    def start(self) -> "EngineSession": ...

    def stop(self) -> None: ...

    def __enter__(self) -> "EngineSession": ...

    def __exit__(self, *exc) -> None: ...

    def count_tokens(self, prompt: str) -> int: ...

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool) -> Completion: ...

    def provenance(self) -> dict:
        """What the running server reports about itself (build, version, props), for the run manifest."""
        ...
