"""What a client can observe of an OpenAI-compatible server it did not start: its identity (`server_identity`), and
per /v1/completions response the generated token ids, their top-2 log-probabilities and the prompt tokens served
from cache (`parse_completion`).

Every observation names its source, because servers report different subsets:
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

import hashlib
import re

from prometheus_client.parser import text_string_to_metric_families

from artifact.engines.base import TOP_N, Completion
from artifact.errors import ArtifactError

TOKEN_ID = re.compile(r"token_id:(-?\d+)$")
CONTEXT_ERRORS = ("exceed_context_size", "context length", "maximum context", "max_model_len", "context window")
# /v1/models entry fields that identify the model; `created` and `object` are left out (vLLM's `created` is the time
# of the request)
MODEL_FIELDS = ("id", "owned_by", "root", "parent", "max_model_len", "meta")
PROPS_FIELDS = ("build_info", "model_path", "model_alias", "model_ftype", "total_slots", "modalities")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def one_line(text, limit: int = 120) -> str:
    """A server's text (an HTML page, a traceback) as one short line for an error message."""
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def server_identity(get, where: str = "the server") -> dict:
    """What the server says it is, from `get(path) -> (status, headers, body or None)`: /v1/models (without the
    volatile fields), its `server` response header, and /version, /props (selected fields) and the Prometheus
    `*_info` families on /metrics where the server has them. Raises ArtifactError (one line, naming `where`) if
    /v1/models does not answer a model list."""
    status, headers, body = get("/v1/models")
    data = body.get("data") if isinstance(body, dict) else None
    if status != 200 or not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        kind = (headers.get("content-type") or "no content type").split(";")[0]
        what = "JSON without a model list" if body is not None else kind
        raise ArtifactError(
            f"{where} answered GET /v1/models with HTTP {status} ({what}): not an OpenAI-compatible "
            "server, or the wrong URL (give the server's base URL, e.g. http://127.0.0.1:8080)"
        )
    ident: dict = {
        "models": [{k: m[k] for k in MODEL_FIELDS if k in m} for m in data],
        "server_header": headers.get("server"),
    }
    status, _, body = get("/version")
    if status == 200 and isinstance(body, dict):
        ident["version"] = body
    status, _, body = get("/props")
    if status == 200 and isinstance(body, dict):
        props = {k: body[k] for k in PROPS_FIELDS if k in body}
        dgs = body.get("default_generation_settings")
        if isinstance(dgs, dict) and "n_ctx" in dgs:
            props["n_ctx"] = dgs["n_ctx"]
        if isinstance(body.get("chat_template"), str):
            props["chat_template_sha256"] = hashlib.sha256(body["chat_template"].encode()).hexdigest()
        ident["props"] = props
    status, _, text = get("/metrics")
    if status == 200 and isinstance(text, str):
        info = metric_info(text)
        if info:
            ident["metrics_info"] = info
    return ident


# llama.cpp's file-type names (llama_model_ftype_name, "/v1/models" meta.ftype and /props model_ftype) -> the
# quantization labels configurations use
FTYPE_SUFFIX = {" - MEDIUM": "_M", " - SMALL": "_S", " - LARGE": "_L", " - EXTRA SMALL": "_XS", " - EXTRA LARGE": "_XL"}


def quant_label(ftype) -> str | None:
    """A llama.cpp file-type name as a quantization label ("Q4_K - Medium" -> "Q4_K_M", "all F32" -> "F32")."""
    if not isinstance(ftype, str) or not ftype.strip():
        return None
    s = ftype.strip().upper()
    s = s.removeprefix("MOSTLY ").removeprefix("ALL ").removesuffix(" (GUESSED)").strip()
    for long, short in FTYPE_SUFFIX.items():
        if s.endswith(long):
            s = s[: -len(long)] + short
    return s.replace(" ", "_")


def reported_model(ident: dict, model_id: str | None) -> dict:
    """What the server reports of the model it serves (llama-server: /v1/models meta and /props; vLLM reports no
    parameter count or file type): n_params, ftype, its quantization label, size, n_ctx_train, n_ctx, build. Keys
    the server does not report are absent."""
    out: dict = {}
    models = ident.get("models") or []
    entry = next((m for m in models if m.get("id") == model_id), models[0] if len(models) == 1 else {})
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    props = ident.get("props") or {}
    for key in ("n_params", "size", "n_ctx_train"):
        if _is_int(meta.get(key)):
            out[key] = meta[key]
    ftype = meta.get("ftype") or props.get("model_ftype")
    if isinstance(ftype, str) and ftype:
        out["ftype"] = ftype
        out["quant"] = quant_label(ftype)
    n_ctx = props.get("n_ctx") if _is_int(props.get("n_ctx")) else meta.get("n_ctx")
    if not _is_int(n_ctx):
        n_ctx = entry.get("max_model_len")
    if _is_int(n_ctx):
        out["n_ctx"] = n_ctx
    build = build_string(ident)
    if build != "not reported by the server":
        out["build"] = build.split(" (")[0]
    return out


SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*([BM])(?![a-zA-Z])")


def declared_params(name: str) -> float | None:
    """The parameter count a model name declares ("Llama-3.1-8B" -> 8e9, "SmolLM2-135M-Instruct" -> 1.35e8), or None
    where it names none or several different ones."""
    sizes = {float(n) * (1e9 if unit == "B" else 1e6) for n, unit in SIZE.findall(name or "")}
    return sizes.pop() if len(sizes) == 1 else None


def server_family(ident: dict | None) -> str | None:
    """The family of server it is, in its own word: the `owned_by` its /v1/models gives every model (vLLM "vllm",
    llama-server "llamacpp"), lower-cased; None where it gives none or several (never guessed from the rest)."""
    owners = {m.get("owned_by") for m in (ident or {}).get("models") or [] if isinstance(m, dict)}
    if len(owners) != 1:
        return None
    owner = owners.pop()
    if not isinstance(owner, str) or not owner.strip():
        return None
    return owner.strip().lower()


def build_string(ident: dict) -> str:
    """The server's own build or version string, as it reports it (never guessed)."""
    props, version = ident.get("props") or {}, ident.get("version") or {}
    if props.get("build_info"):
        return f"{props['build_info']} (/props build_info, as the server reports it)"
    if isinstance(version, dict) and version.get("version"):
        return f"{version['version']} (/version, as the server reports it)"
    if ident.get("server_header"):
        return f"{ident['server_header']} (Server header; no version reported)"
    return "not reported by the server"


def metric_info(text: str) -> dict:
    """Labels of the `*_info` families of a Prometheus text (a server's own declaration of its configuration, e.g.
    vLLM's cache_config_info with enable_prefix_caching)."""
    out = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_info"):
                for sample in family.samples:
                    out[family.name] = dict(sample.labels)
                    break
    except ValueError:
        return {}
    return out


def counter(text: str, name: str) -> float | None:
    """The value of a Prometheus counter (samples summed over label sets); None if it is not there."""
    total, found = 0.0, False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    total, found = total + sample.value, True
    except ValueError:
        return None
    return total if found else None


def _token_id(key) -> int | None:
    m = TOKEN_ID.match(key) if isinstance(key, str) else None
    return int(m.group(1)) if m else None


def token_ids(body: dict, choice: dict, completion_tokens: int | None) -> tuple[list[int], str]:
    """The generated token ids and where they came from (module docstring); ArtifactError if the server gives none."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(_is_int(t) for t in ids):
        return ids, "choices[0].token_ids"
    verbose = body.get("__verbose")
    if (
        isinstance(verbose, dict)
        and isinstance(verbose.get("tokens"), list)
        and all(_is_int(t) for t in verbose["tokens"])
    ):
        if verbose["tokens"] or not completion_tokens:
            return verbose["tokens"], "__verbose.tokens"
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
        if (
            isinstance(content, list)
            and all(isinstance(e, dict) and _is_int(e.get("id")) for e in content)
            and len(content) == completion_tokens
        ):
            return [e["id"] for e in content], "logprobs.content[].id"
        tokens = logprobs.get("tokens")
        if isinstance(tokens, list) and tokens:
            parsed = [_token_id(t) for t in tokens]
            if all(t is not None for t in parsed):
                return parsed, "logprobs.tokens (token_id:N)"
    raise ArtifactError(
        "the server's /v1/completions response carries no generated token ids (choices[0].token_ids, "
        "logprobs with ids): the records compare token ids, so this server cannot be used"
    )


def _ranked(pairs) -> list:
    return sorted(([int(t), float(lp)] for t, lp in pairs), key=lambda x: -x[1])[:TOP_N]


def top_logprobs(choice: dict, tokens: list[int]) -> tuple[list, str | None]:
    """Top-2 [[token id, logprob], ...] per generated position (null where the server gave none), and the source."""
    logprobs = choice.get("logprobs")
    top: list = [None] * len(tokens)
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


def check_greedy(tokens: list[int], top: list) -> None:
    """Greedy decoding emits the most likely token at every position: a server that ignored the greedy request
    fields is refused rather than recorded."""
    for i, (tok, at) in enumerate(zip(tokens, top)):
        if at and not any(t == tok and lp == at[0][1] for t, lp in at):
            raise ArtifactError(
                f"the server did not decode greedily (generated token {i} is {tok}, its most likely "
                f"token {at[0][0]}): it ignores temperature 0 / top_k 1 or applies its own sampling"
            )


def cached_tokens(body: dict, usage: dict, metric_delta: float | None) -> tuple[int | None, dict]:
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
    values = [v for v in seen.values() if _is_int(v)]
    return (max(values) if values else None), seen


def finish(choice: dict) -> str:
    reason = choice.get("finish_reason")
    if reason == "length":
        return "limit"
    if reason == "stop":
        return "word" if isinstance(choice.get("stop_reason"), str) else "eos"
    raise ArtifactError(f"the server finished a request with finish_reason {reason!r} (aborted?)")


def parse_completion(body, metric_delta: float | None, wall_ms: float) -> Completion:
    """A /v1/completions response in engine-neutral form; anything malformed is fatal (ArtifactError)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ArtifactError("the server answered without exactly one choice: the response is malformed")
    choice = choices[0]
    usage = body.get("usage")
    if not isinstance(usage, dict) or not _is_int(usage.get("prompt_tokens")):
        raise ArtifactError("the server answered without usage.prompt_tokens: the response is malformed")
    text = choice.get("text")
    if not isinstance(text, str):
        raise ArtifactError("the server answered without a choice text: the response is malformed")
    completion_tokens = usage.get("completion_tokens") if _is_int(usage.get("completion_tokens")) else None
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


def error_message(status: int, body, text: str) -> tuple[str, bool, int | None]:
    """(message, whether it is a context overflow, the prompt length where the server says it) of an error answer."""
    err = body.get("error", body) if isinstance(body, dict) else {}
    if isinstance(err, dict):
        message = str(err.get("message") or text[:300])
        kind = str(err.get("type") or "")
        n = err.get("n_prompt_tokens")
    else:
        message, kind, n = str(err)[:300], "", None
    overflow = status == 400 and any(s in (kind + " " + message).lower() for s in CONTEXT_ERRORS)
    return message[:300], overflow, n if _is_int(n) else None
