"""The server lifecycle shared by every engine adapter: a child process bound to 127.0.0.1 on a free port, started
with an allowlisted environment and a private, empty configuration/home folder, its full command line and log
recorded, readiness polled with a timeout, and a clean stop (SIGTERM, then SIGKILL). The child dies with us
(PR_SET_PDEATHSIG), so no server is left orphaned if the protocol is killed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from artifact import provenance
from artifact.engines.openai_client import OpenAIClient
from artifact.errors import ArtifactError

# The only variables a server inherits from us: nothing else (no LLAMA_ARG_*, no GGML_*/VLLM_* knob, no secret) can
# change its behaviour unseen. Adapters add their own fixed variables, which the manifest records.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes some servers write even into a log file (vLLM)


def _die_with_parent() -> None:  # runs in the child before exec (Linux)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path, extra: dict | None = None) -> dict:
    """The allowlisted environment with a private, empty HOME and XDG_CONFIG_HOME (no user config file applies)."""
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        TMPDIR=str(home / "tmp"),
    )
    env.update(extra or {})
    return env


class ServerProcess:
    """One server child process; `name` is used in messages ("llama-server", "vLLM")."""

    def __init__(self, name: str, log_path: Path, startup_timeout_s: float, request_timeout_s: float):
        self.name = name
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.port = 0
        self.cmd: list[str] = []
        self.env: dict = {}
        self.proc: subprocess.Popen | None = None
        self.client: OpenAIClient | None = None  # HTTP to the server once it is spawned
        self.home: Path | None = None
        # whether CUDA MPS served this server, as the MPS control daemon says once the server is up (its CUDA
        # context exists by then): provenance.mps_served, recorded in the manifest as `gpu_mps`
        self.mps: dict = {}

    def spawn(self, build_cmd, extra_env: dict | None = None, health: str = "/health") -> None:
        """Start `build_cmd(port)` and wait until `health` answers 200."""
        self.port = free_port()
        self.cmd = build_cmd(self.port)
        self.home = Path(tempfile.mkdtemp(prefix="artifact-server-home-"))
        for sub in ("config", "cache", "tmp"):
            (self.home / sub).mkdir()
        self.env = server_env(self.home, extra_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.cmd)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    self.cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                )
            except OSError as exc:
                self.stop()
                raise ArtifactError(f"cannot start {self.name} ({exc.strerror}): {self.cmd[0]}") from None
        self.client = OpenAIClient(f"http://127.0.0.1:{self.port}", self.request_timeout_s, self.name, self._gone)
        self._wait_healthy(health)
        self.mps = provenance.mps_served(provenance.process_group(self.proc.pid))

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(ANSI.sub("", line).strip() for line in text[-lines:])

    def _wait_healthy(self, health: str) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                tail = self.log_tail()
                self.stop()
                raise ArtifactError(
                    f"{self.name} exited during start-up (exit code {code}): {tail[-400:]} (full log: {self.log_path})"
                )
            try:
                if self.client.http.get(health, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ArtifactError(f"{self.name} not ready after {self.startup_timeout_s:.0f} s; see {self.log_path}")

    def _gone(self, exc: Exception) -> str:
        code = self.proc.poll() if self.proc else None
        return f"{self.name} stopped answering ({type(exc).__name__}; exit code {code}); see {self.log_path}"

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One HTTP request; a server that is gone or stops answering is fatal for the run (ArtifactError)."""
        return self.client.request(method, path, **kwargs)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.proc is not None:
            # The server leads its own process group (start_new_session): signal the group, so that an engine's
            # worker processes (vLLM's EngineCore) go with it instead of outliving it as orphans.
            if self.proc.poll() is None:
                _signal_group(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    _signal_group(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            _signal_group(self.proc.pid, signal.SIGKILL)  # whatever of the group is left
        self.proc = None
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ServerSession:
    """The lifecycle every engine session shares: `start()` on entering a `with` block, `stop()` (of its
    ServerProcess `proc`) on leaving it. Subclasses implement `start()`."""

    proc: ServerProcess

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        self.proc.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
