"""Reading vLLM's answers: a /v1/completions response held to vLLM's exact form (`parse_choice`: token ids as
"token_id:N", top-2 log-probabilities, the stop type, usage), its /metrics counters (`parse_metrics`,
`cache_config_info`), and the completion record with its cache exposure measured from both (`completion`)."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from artifact.engines.base import TOP_N, Completion
from artifact.errors import ArtifactError

METRICS = {
    "queries": "vllm:prefix_cache_queries_total",
    "hits": "vllm:prefix_cache_hits_total",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "prefill_n": "vllm:request_prefill_time_seconds_count",
    "decode_s": "vllm:request_decode_time_seconds_sum",
    "decode_n": "vllm:request_decode_time_seconds_count",
}
TOKEN_ID = re.compile(r"token_id:(-?\d+)$")


def parse_metrics(text: str) -> dict:
    """The counters the adapter reads, summed over label sets; a missing one is None."""
    wanted = {v: k for k, v in METRICS.items()}
    found: dict = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = wanted.get(sample.name)
                if key is not None:
                    found[key] = found.get(key, 0.0) + sample.value
    except ValueError:
        raise ArtifactError("vLLM /metrics is not Prometheus text: the response is malformed") from None
    return {k: found.get(k) for k in METRICS}


def cache_config_info(text: str) -> dict:
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                return dict(sample.labels)
    return {}


def _delta(after: dict, before: dict, key: str):
    return None if after.get(key) is None or before.get(key) is None else after[key] - before[key]


def get_field(data, key: str, kind, where: str):
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ArtifactError(f"vLLM answered without a valid '{key}' in {where}: the response is malformed")
    return value


def _token_id(key: str) -> int:
    m = TOKEN_ID.match(key) if isinstance(key, str) else None
    if m is None:
        raise ArtifactError(f"vLLM returned token {key!r}, not 'token_id:N' (return_tokens_as_token_ids ignored?)")
    return int(m.group(1))


def parse_choice(body: dict) -> tuple[list[int], str, list, str | None, dict]:
    """Generated token ids, text, top-2 log-probabilities, stop type and usage of a /v1/completions response."""
    choices = get_field(body, "choices", list, "the completion")
    if len(choices) != 1:
        raise ArtifactError(f"vLLM answered with {len(choices)} choices instead of 1: the response is malformed")
    choice = choices[0]
    logprobs = get_field(choice, "logprobs", dict, "the choice")
    tokens = [_token_id(t) for t in get_field(logprobs, "tokens", list, "logprobs")]
    ids = choice.get("token_ids")
    if ids is not None and ids != tokens:
        raise ArtifactError("vLLM's token_ids disagree with its logprobs tokens: the response is malformed")
    tops = get_field(logprobs, "top_logprobs", list, "logprobs")
    if len(tops) != len(tokens):
        raise ArtifactError("vLLM answered with log-probabilities that do not match its tokens: malformed")
    top = []
    for pos in tops:
        if not isinstance(pos, dict):
            raise ArtifactError("vLLM answered with malformed top_logprobs")
        ranked = sorted(([_token_id(k), float(v)] for k, v in pos.items()), key=lambda x: -x[1])
        top.append(ranked[:TOP_N])
    finish, stop_reason = choice.get("finish_reason"), choice.get("stop_reason")
    if finish == "length":
        stop_type = "limit"
    elif finish == "stop":
        stop_type = "word" if isinstance(stop_reason, str) else "eos"
    else:
        raise ArtifactError(f"vLLM finished a request with finish_reason {finish!r} (aborted?); see its log")
    usage = get_field(body, "usage", dict, "the completion")
    return tokens, get_field(choice, "text", str, "the choice"), top, stop_type, usage


def completion(tokens, text, top, stop_type, usage, before, after, wall_ms, batch_size: int) -> Completion:
    """One answer in engine-neutral form, its cache exposure the larger of usage's cached tokens and the /metrics
    prefix-cache hits between `before` and `after` (requests are serial); `batch_size` is --max-num-batched-tokens."""
    prompt_tokens = get_field(usage, "prompt_tokens", int, "usage")
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise ArtifactError("vLLM answered with a malformed usage.prompt_tokens_details")
    usage_cached = (details or {}).get("cached_tokens")
    if usage_cached is not None and not isinstance(usage_cached, int):
        raise ArtifactError("vLLM answered with a non-integer usage.prompt_tokens_details.cached_tokens")
    usage_n = usage_cached or 0  # null means 0: every server runs with --enable-prompt-tokens-details
    hits, queries = _delta(after, before, "hits"), _delta(after, before, "queries")
    metrics_n = int(round(hits)) if hits is not None else None
    cache_n = max(usage_n, metrics_n if metrics_n is not None else 0)
    computed = prompt_tokens - cache_n
    prefill_n, decode_n = _delta(after, before, "prefill_n"), _delta(after, before, "decode_n")
    prefill_s, decode_s = _delta(after, before, "prefill_s"), _delta(after, before, "decode_s")
    return Completion(
        tokens=tokens,
        text=text,
        top_logprobs=top,
        prompt_tokens=prompt_tokens,
        cache_n=cache_n,
        prompt_n=computed,
        prompt_ms=prefill_s * 1000 if prefill_n == 1 and prefill_s is not None else None,
        predicted_ms=decode_s * 1000 if decode_n == 1 and decode_s is not None else None,
        stop_type=stop_type,
        extra={
            "usage_cached_tokens": usage_cached,
            "usage_null_means_zero": True,
            "metrics_prefix_cache_hits": metrics_n,
            "metrics_prefix_cache_queries": int(round(queries)) if queries is not None else None,
            "cache_sources_agree": metrics_n == usage_n,
            "cache_n_source": "max(usage cached_tokens (null or 0 on a miss) as 0, /metrics prefix_cache_hits delta)",
            "chunked_prefill": computed > batch_size,
            "completion_tokens": usage.get("completion_tokens"),
            "wall_ms": round(wall_ms, 1),
        },
    )
