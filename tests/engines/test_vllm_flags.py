"""The adapter's `vllm serve` arguments, parsed by the installed vLLM's own parser (artifact/engines/vllm/flags.py, run
with vLLM's interpreter: no server). Here the real vLLM 0.11.0 CPU build (scripts/setup-vllm.sh); on the H200 the
same script checks vLLM 0.25.0 (scripts/vllm-gpu.sh check). Cost: one import of vLLM (~20 s of CPU)."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from artifact.catalog import load_config
from artifact.engines import get
from artifact.engines.vllm import env as vllm_env
from artifact.engines.vllm.adapter import serve_args

pytestmark = pytest.mark.vllm

FLAGS = vllm_env.PROBE.with_name("flags.py")


def test_the_adapters_serve_arguments_mean_to_vllm_what_the_adapter_means():
    cfg = load_config("demo-smollm2-agent-cpu-vllm")
    python = vllm_env.interpreter(vllm_env.resolve_executable(cfg.engine.binary))
    args = serve_args(cfg, "/nonexistent/model", "8000", "--no-enable-prefix-caching")
    out = subprocess.run([str(python), str(FLAGS), *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-800:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["vllm"] == "0.11.0"
    assert got["enable_prefix_caching"] is False and got["enable_prompt_tokens_details"] is True
    assert got["max_num_seqs"] == 1 and got["seed"] == 42 and got["generation_config"] == "vllm"
    assert got["kv_cache_dtype"] == "auto" and got["dtype"] == "bfloat16"
    assert got["max_model_len"] == cfg.server.ctx_size and got["max_num_batched_tokens"] == cfg.server.batch_size
    assert got["served_model_name"] == [cfg.model.name]
    bad = subprocess.run(
        [str(python), str(FLAGS), *args, "--no-such-flag"], capture_output=True, text=True, timeout=600
    )
    assert bad.returncode != 0 and "--no-such-flag" in bad.stderr
    # a plan's eager execution (the attention settings go by environment in 0.11.0: no flag to parse)
    eager = dataclasses.replace(get("vllm").settings(cfg), enforce_eager=True)
    out = subprocess.run(
        [str(python), str(FLAGS), *serve_args(cfg, "/nonexistent/model", "8000", "--enable-prefix-caching", eager)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-800:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["enforce_eager"] is True
