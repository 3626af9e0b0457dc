"""The endpoint engine's settings (`[engine.settings]`, `--engine-setting KEY=VALUE`), the request fields it sends
and what it observes of the servers the user runs (adapter.py says how the arms are given)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


from artifact.config import choice
from artifact.engines.base import GREEDY, TOP_N

KIND = "endpoint"
REQUEST_FIELDS = {
    # OpenAI's own fields
    "temperature": GREEDY["temperature"],
    "top_p": GREEDY["top_p"],
    "seed": GREEDY["seed"],
    "logprobs": TOP_N,
    "stream": False,
    # greedy beyond OpenAI's fields, in the names the common servers read (a server ignores those it lacks)
    "top_k": GREEDY["top_k"],
    "min_p": GREEDY["min_p"],
    "repetition_penalty": GREEDY["repeat_penalty"],
    "repeat_penalty": GREEDY["repeat_penalty"],
    "samplers": ["top_k"],
    "post_sampling_probs": False,
    # the generated token ids (vLLM: return_token_ids, return_tokens_as_token_ids; llama-server: return_tokens and
    # verbose, whose __verbose field carries them whole)
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "return_tokens": True,
    "verbose": True,
}
CONTROLS = ("cache_prompt", "cache_salt")
UNKNOWN = "not observable: a server the artifact did not start (its API does not say)"


@dataclass(frozen=True)
class Settings:
    url_on: str = ""  # one server per arm, as the user started them: prefix caching on, and off
    url_off: str = ""
    url: str = ""  # or one server for both arms (where given, url_on and url_off do not apply) ...
    cache_control: str = choice("none", *CONTROLS, default="none")  # ... with a per-request cache control
    model: str = ""  # the model id requested; "" = the only one /v1/models lists
    # a Prometheus counter of cached prompt tokens on the server's /metrics, read before and after every request
    # (requests are serial); "" = read none
    metrics_counter: str = "vllm:prefix_cache_hits_total"
    allow_remote: bool = False  # a URL that is not loopback: refused unless set (and then only without isolation)
    extra_request: dict = field(default_factory=dict)  # more request fields (the server's own; recorded)


def arm_urls(s: Settings) -> dict[str, str]:
    """arm -> the base URL that serves it."""
    if s.url:
        return {"off": s.url, "on": s.url}
    return {"off": s.url_off, "on": s.url_on}


def control_fields(s: Settings, cache_prompt: bool, session_salt: str = "") -> dict:
    """The per-request cache control (none with one server per arm), and the session's own salt on requests that
    use the cache (cold_start: no block cached before the session can match them)."""
    if s.cache_control == "cache_prompt":
        return {"cache_prompt": cache_prompt}
    if s.cache_control == "cache_salt" and not cache_prompt:
        return {"cache_salt": uuid.uuid4().hex}  # a new salt: no cached block can match
    return {"cache_salt": session_salt} if session_salt and cache_prompt else {}


def observes(s: Settings, metrics: bool | None = None) -> dict:
    """What this engine observes of its servers (engines.base.OBSERVES)."""
    sources = ["timings.cache_n", "usage.prompt_tokens_details.cached_tokens"]
    if s.metrics_counter and metrics is not False:
        sources.append(f"/metrics {s.metrics_counter}" + (" (if the server has it)" if metrics is None else ""))
    control = (
        f"per request ({s.cache_control}), by the artifact"
        if s.url
        else "per server, declared by the user (url_on, url_off): not set or verified by the artifact"
    )
    return {
        "server_cmd": False,
        "binary": False,
        "weights_sha256": False,
        "cache_use": "as the server reports it: " + ", ".join(sources) + "; null where it reports none",
        "cache_control": control,
        "logprobs": True,
        "exclusive": False,
    }


def role(s: Settings, url: str) -> str:
    """Which setting gave `url`, for error messages: "url_on, the ON arm", "url_off, the OFF arm", "url, both arms"."""
    if s.url:
        return "url, both arms"
    return (
        " and ".join(f"url_{a}, the {a.upper()} arm" for a in ("on", "off") if getattr(s, f"url_{a}") == url) or "url"
    )


def describe(s: Settings, arm: str) -> str:
    if s.url:
        off = {"cache_prompt": "cache_prompt false", "cache_salt": "a new cache_salt on every request"}
        on = {"cache_prompt": "cache_prompt true", "cache_salt": "no cache_salt"}
        return (
            f"one server run by its user ({s.url}), the cache switched per request: OFF {off[s.cache_control]}, "
            f"ON {on[s.cache_control]}"
        )
    url = s.url_on if arm == "on" else s.url_off
    return f"the {arm.upper()} arm's server run by its user ({url}): prefix caching {arm} as declared, not set here"
