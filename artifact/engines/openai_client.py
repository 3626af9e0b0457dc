"""The one OpenAI-compatible HTTP client the engines share: a server's /v1/models, /v1/completions, /tokenize and
/metrics, every transport failure a one-line ArtifactError.

The vLLM engine talks through it to the `vllm serve` it starts (artifact/engines/server_process.py opens it on the
server's loopback port), the endpoint engine to a server the user runs; an engine for another server of the OpenAI
API (SGLang, TensorRT-LLM; docs/extending.md) uses it too. What a server's answer means (its token ids, cache
counts, log-probabilities) is each engine's own reading: the client carries requests and answers, and says in one
line what went wrong on the wire. It never takes a proxy from the environment (`trust_env=False`).

`parse_completion` reads a /v1/completions answer into a `Completion`, tolerant of the servers' dialects (the
endpoint engine's reading, and any engine's whose server speaks one of them; the vLLM engine holds its own server's
answers to vLLM's exact form instead). Every observation names its source, because servers report different subsets:
  token ids        `choices[0].token_ids` (vLLM, `return_token_ids`); `__verbose.tokens` (llama-server, `verbose` and
                   `return_tokens`); `logprobs.content[].id` (llama-server) when it holds one entry per generated token;
                   `logprobs.tokens` as "token_id:N" (vLLM, `return_tokens_as_token_ids`). None of them: the server is
                   refused (records are token ids).
  log-probabilities `logprobs.content[].top_logprobs` (id, logprob) or `logprobs.top_logprobs` ({"token_id:N": lp});
                   a position without an entry is null.
  cached tokens    `timings.cache_n` (llama-server), `usage.prompt_tokens_details.cached_tokens` (OpenAI's field; vLLM
                   fills it only for a hit and only when started with --enable-prompt-tokens-details, so its null is
                   ambiguous), and the per-request increase of a Prometheus counter on /metrics (by default vLLM's
                   `vllm:prefix_cache_hits_total`; requests are serial). `cache_n` is the largest of those reported,
                   null where none is: "not reported", never 0.
"""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx

from artifact.engines.base import TOP_N, Completion
from artifact.errors import ArtifactError

TOKEN_ID = re.compile(r"token_id:(-?\d+)$")

# words of an error answer that mean the prompt does not fit the context (vLLM, llama-server, SGLang, TGI)
CONTEXT_ERRORS = ("exceed_context_size", "context length", "maximum context", "max_model_len", "context window")


def split_url(url: str) -> tuple[str, str, int]:
    """(base URL without a trailing /v1, host, port) of a server URL; ArtifactError if it is not http(s)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ArtifactError(f"engine.settings: {url!r} is not an http:// or https:// URL")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ArtifactError(f"engine.settings: {url!r}: give the server's base URL (no query, fragment or credentials)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ArtifactError(f"engine.settings: {url!r} has an invalid port") from None
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    host = parts.hostname
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}{path}", host, port


def is_loopback(host: str) -> bool:
    """A loopback address or "localhost" (names are not resolved: any other name counts as remote)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def one_line(text: Any, limit: int = 120) -> str:
    """A server's text (an HTML page, a traceback) as one short line for an error message."""
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def error_message(status: int, body: Any, text: str) -> tuple[str, bool, int | None]:
    """(message, whether it is a context overflow, the prompt length where the server says it) of an error answer."""
    err = body.get("error", body) if isinstance(body, dict) else {}
    if isinstance(err, dict):
        message = str(err.get("message") or text[:300])
        kind = str(err.get("type") or "")
        n = err.get("n_prompt_tokens")
    else:
        message, kind, n = str(err)[:300], "", None
    overflow = status == 400 and any(s in (kind + " " + message).lower() for s in CONTEXT_ERRORS)
    return message[:300], overflow, n if isinstance(n, int) and not isinstance(n, bool) else None


@dataclass
class Answer:
    """A server's answer to POST /v1/completions: its status, JSON body, raw text and how long it took."""

    status: int
    body: Any
    text: str
    seconds: float


class OpenAIClient:
    """HTTP to one server of the OpenAI API. `who` names it in messages ("vLLM", "the server at URL"); `gone`, if
    given, says in one line why a server that stops answering is gone (a process the engine started: its exit code
    and log)."""

    def __init__(self, base: str, timeout: float, who: str = "", gone: Callable[[Exception], str] | None = None):
        self.base = base
        self.who = who or f"the server at {base}"
        self.gone = gone
        self.http = httpx.Client(base_url=base, timeout=timeout, trust_env=False)  # no proxy from the environment

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One HTTP request; a server that is gone or does not answer is fatal for the run (ArtifactError)."""
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            if self.gone is not None:
                raise ArtifactError(self.gone(exc)) from None
            raise ArtifactError(f"{self.who} does not answer ({type(exc).__name__}: {exc})") from None

    def get(self, path: str) -> tuple[int, httpx.Headers, Any]:
        """(status, headers, JSON body, or text for /metrics, or None)"""
        r = self.request("GET", path)
        if path == "/metrics":
            return r.status_code, r.headers, r.text if r.status_code == 200 else None
        try:
            return r.status_code, r.headers, r.json()
        except ValueError:
            return r.status_code, r.headers, None

    def json(self, method: str, path: str, where: str = "", **kwargs: Any) -> Any:
        """The JSON body of a 200 answer; anything else is a one-line error naming the server (`where`: e.g. its
        log)."""
        r = self.request(method, path, **kwargs)
        try:
            body = r.json()
        except ValueError:
            raise ArtifactError(
                f"{self.who} {path} answered HTTP {r.status_code} without JSON: {r.text[:200]}"
            ) from None
        if r.status_code != 200:
            raise ArtifactError(f"{self.who} {path} failed (HTTP {r.status_code}: {str(body)[:300]}){where}")
        return body

    def metrics_text(self) -> str | None:
        """The server's Prometheus text (GET /metrics), or None where it answers anything but 200."""
        r = self.request("GET", "/metrics")
        return r.text if r.status_code == 200 else None

    def complete(self, payload: dict[str, Any]) -> Answer:
        """POST /v1/completions, timed; an answer that is not JSON is a one-line error naming the server."""
        t0 = time.monotonic()
        r = self.request("POST", "/v1/completions", json=payload)
        seconds = time.monotonic() - t0
        try:
            body = r.json()
        except ValueError:
            raise ArtifactError(
                f"{self.who} answered POST /v1/completions with HTTP {r.status_code} without JSON: {one_line(r.text)}"
            ) from None
        return Answer(r.status_code, body, r.text, seconds)


# --- reading an answer ------------------------------------------------------------------------------------------


def is_int(v: Any) -> bool:
    """An int that is not a bool (JSON's integers)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _token_id(key: Any) -> int | None:
    m = TOKEN_ID.match(key) if isinstance(key, str) else None
    return int(m.group(1)) if m else None


def token_ids(body: dict[str, Any], choice: dict[str, Any], completion_tokens: int | None) -> tuple[list[int], str]:
    """The generated token ids and where they came from (module docstring); ArtifactError if the server gives none."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(is_int(t) for t in ids):
        return ids, "choices[0].token_ids"
    verbose = body.get("__verbose")
    if (
        isinstance(verbose, dict)
        and isinstance(verbose.get("tokens"), list)
        and all(is_int(t) for t in verbose["tokens"])
    ):
        if verbose["tokens"] or not completion_tokens:
            return verbose["tokens"], "__verbose.tokens"
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
        if (
            isinstance(content, list)
            and all(isinstance(e, dict) and is_int(e.get("id")) for e in content)
            and len(content) == completion_tokens
        ):
            return [e["id"] for e in content], "logprobs.content[].id"
        tokens = logprobs.get("tokens")
        if isinstance(tokens, list) and tokens:
            parsed = [_token_id(t) for t in tokens]
            ids = [t for t in parsed if t is not None]
            if len(ids) == len(parsed):
                return ids, "logprobs.tokens (token_id:N)"
    raise ArtifactError(
        "the server's /v1/completions response carries no generated token ids (choices[0].token_ids, "
        "logprobs with ids): the records compare token ids, so this server cannot be used"
    )


def _ranked(pairs: Any) -> list[list[Any]]:
    return sorted(([int(t), float(lp)] for t, lp in pairs), key=lambda x: -x[1])[:TOP_N]


def top_logprobs(choice: dict[str, Any], tokens: list[int]) -> tuple[list[Any], str | None]:
    """Top-2 [[token id, logprob], ...] per generated position (null where the server gave none), and the source."""
    logprobs = choice.get("logprobs")
    top: list[Any] = [None] * len(tokens)
    if not isinstance(logprobs, dict):
        return top, None
    content = logprobs.get("content")
    if isinstance(
        content, list
    ):  # llama-server: entries carry ids; a token held back inside a UTF-8 character has none
        j = 0
        for i, tok in enumerate(tokens):
            if j < len(content) and isinstance(content[j], dict) and content[j].get("id") == tok:
                cands = content[j].get("top_logprobs")
                if isinstance(cands, list):
                    try:
                        top[i] = _ranked((c["id"], c["logprob"]) for c in cands) or None
                    except (KeyError, TypeError, ValueError):
                        raise ArtifactError("the server answered malformed logprobs.content[].top_logprobs") from None
                j += 1
        return top, "logprobs.content[].top_logprobs"
    tops = logprobs.get("top_logprobs")
    if isinstance(tops, list) and len(tops) == len(tokens):  # the OpenAI legacy form, keyed by token
        for i, pos in enumerate(tops):
            if isinstance(pos, dict):
                pairs = [(_token_id(k), v) for k, v in pos.items()]
                if pairs and all(t is not None and isinstance(v, (int, float)) for t, v in pairs):
                    top[i] = _ranked(pairs)
        return top, "logprobs.top_logprobs (token_id:N)"
    return top, None


def check_greedy(tokens: list[int], top: list[Any]) -> None:
    """Greedy decoding emits the most likely token at every position: a server that ignored the greedy request
    fields is refused rather than recorded."""
    for i, (tok, at) in enumerate(zip(tokens, top)):
        if at and not any(t == tok and lp == at[0][1] for t, lp in at):
            raise ArtifactError(
                f"the server did not decode greedily (generated token {i} is {tok}, its most likely "
                f"token {at[0][0]}): it ignores temperature 0 / top_k 1 or applies its own sampling"
            )


def cached_tokens(
    body: dict[str, Any], usage: dict[str, Any], metric_delta: float | None
) -> tuple[int | None, dict[str, Any]]:
    """Prompt tokens served from cache, the largest of the sources that report it (None: none does), and each."""
    timings = body.get("timings")
    details = usage.get("prompt_tokens_details")
    seen = {
        "timings.cache_n": timings.get("cache_n") if isinstance(timings, dict) else None,
        "usage.prompt_tokens_details.cached_tokens": details.get("cached_tokens")
        if isinstance(details, dict)
        else None,
        "metrics": None if metric_delta is None else int(round(metric_delta)),
    }
    values = [v for v in seen.values() if isinstance(v, int) and not isinstance(v, bool)]
    return (max(values) if values else None), seen


def finish(choice: dict[str, Any]) -> str:
    reason = choice.get("finish_reason")
    if reason == "length":
        return "limit"
    if reason == "stop":
        return "word" if isinstance(choice.get("stop_reason"), str) else "eos"
    raise ArtifactError(f"the server finished a request with finish_reason {reason!r} (aborted?)")


def parse_completion(body: Any, metric_delta: float | None, wall_ms: float) -> Completion:
    """A /v1/completions response in engine-neutral form; anything malformed is fatal (ArtifactError)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ArtifactError("the server answered without exactly one choice: the response is malformed")
    choice = choices[0]
    usage = body.get("usage")
    if not isinstance(usage, dict) or not is_int(usage.get("prompt_tokens")):
        raise ArtifactError("the server answered without usage.prompt_tokens: the response is malformed")
    text = choice.get("text")
    if not isinstance(text, str):
        raise ArtifactError("the server answered without a choice text: the response is malformed")
    completion_tokens = usage.get("completion_tokens") if is_int(usage.get("completion_tokens")) else None
    tokens, ids_source = token_ids(body, choice, completion_tokens)
    top, top_source = top_logprobs(choice, tokens)
    check_greedy(tokens, top)
    prompt_tokens = usage["prompt_tokens"]
    cache_n, seen = cached_tokens(body, usage, metric_delta)
    if cache_n is not None and not 0 <= cache_n <= prompt_tokens:
        raise ArtifactError(f"the server reports {cache_n} cached of {prompt_tokens} prompt tokens: malformed")
    timings = body.get("timings") if isinstance(body.get("timings"), dict) else {}
    ms = {
        k: float(timings[k])
        if isinstance(timings.get(k), (int, float)) and not isinstance(timings.get(k), bool)
        else None
        for k in ("prompt_ms", "predicted_ms")
    }
    return Completion(
        tokens=tokens,
        text=text,
        top_logprobs=top,
        prompt_tokens=prompt_tokens,
        cache_n=cache_n,
        prompt_n=None if cache_n is None else prompt_tokens - cache_n,
        prompt_ms=ms["prompt_ms"],
        predicted_ms=ms["predicted_ms"],
        stop_type=finish(choice),
        extra={
            "cache_sources": seen,
            "token_ids_source": ids_source,
            "top_logprobs_source": top_source,
            "completion_tokens": completion_tokens,
            "system_fingerprint": body.get("system_fingerprint"),
            "wall_ms": round(wall_ms, 1),
        },
    )
