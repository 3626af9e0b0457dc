"""What a client can observe of an OpenAI-compatible server it did not start: its identity (`server_identity`: its
/v1/models entry, llama-server's /props, the build it names), the model it reports held against the one declared,
and the value of a Prometheus counter on its /metrics. Each /v1/completions answer is read by the shared client's
`parse_completion` (artifact/engines/openai_client.py), which names the source of every observation.
"""

from __future__ import annotations

import hashlib
import re

from prometheus_client.parser import text_string_to_metric_families

from artifact.engines.openai_client import is_int
from artifact.errors import ArtifactError

# /v1/models entry fields that identify the model; `created` and `object` are left out (vLLM's `created` is the time
# of the request)
MODEL_FIELDS = ("id", "owned_by", "root", "parent", "max_model_len", "meta")
PROPS_FIELDS = ("build_info", "model_path", "model_alias", "model_ftype", "total_slots", "modalities")


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
        if is_int(meta.get(key)):
            out[key] = meta[key]
    ftype = meta.get("ftype") or props.get("model_ftype")
    if isinstance(ftype, str) and ftype:
        out["ftype"] = ftype
        out["quant"] = quant_label(ftype)
    n_ctx = props.get("n_ctx") if is_int(props.get("n_ctx")) else meta.get("n_ctx")
    if not is_int(n_ctx):
        n_ctx = entry.get("max_model_len")
    if is_int(n_ctx):
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
