"""What differs between vLLM 0.11.0 and 0.25.0 (artifact/engines/vllm/versions.py), the vLLM plan settings and the
conversion pins: decisions that need no server. Log lines are the ones each version's source writes."""

from __future__ import annotations

import json

import pytest

from artifact import engines
from artifact.catalog import load_config, load_plan, load_plans
from artifact.engines.vllm import env as vllm_env
from artifact.engines.vllm import versions
from artifact.engines.vllm.adapter import arm_flag, arm_placeholder, describe_cache, require_version
from artifact.engines.vllm.env import fixed_env
from artifact.errors import ArtifactError

VLLM = engines.get("vllm")

V25 = [
    "(EngineCore pid=812) INFO 12-01 10:00:01 [selector.py:135] Using NHD KV cache layout for FLASH_ATTN backend.",
    "(EngineCore pid=812) INFO 12-01 10:00:01 [cuda.py:476] Using FLASH_ATTN attention backend out of potential "
    "backends: ['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION'].",
    "(EngineCore pid=812) INFO 12-01 10:00:02 [flash_attn.py:718] Using FlashAttention version 3",
]


def test_the_attention_backend_is_read_from_each_versions_own_log_line():
    a = versions.attention("0.25.0", V25)
    assert a["backend"] == "FLASH_ATTN" and a["flash_attn_version"] == 3
    assert a["candidates"] == ["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"]  # not the KV-layout line
    explicit = versions.attention("0.25.0", ["INFO [cuda.py:416] Using AttentionBackendEnum.TRITON_ATTN backend."])
    assert explicit["backend"] == "TRITON_ATTN" and explicit["candidates"] is None
    assert versions.attention("0.11.0", ["INFO [cpu.py:104] Using Torch SDPA backend."])["backend"] == "Torch SDPA"
    cuda11 = versions.attention("0.11.0", ["INFO [cuda.py:325] Using Flash Attention backend on V1 engine."])
    assert cuda11["backend"] == "Flash Attention"
    assert versions.attention("0.25.0", ["INFO nothing about attention"])["backend"] is None


def test_a_vllm_of_another_version_than_the_configurations_is_refused():
    cfg = load_config("h200-vllm/h200-vllm-agent-fp16")
    settings = VLLM.settings(cfg)
    assert settings.version == "0.25.0"
    assert require_version(cfg, settings, {"vllm": "0.25.0"}).torch == "2.11.0"
    with pytest.raises(
        ArtifactError,
        match=r"vLLM 0\.11\.0\+cpu is installed, the configuration is written for vLLM "
        r"0\.25\.0",
    ):
        require_version(cfg, settings, {"vllm": "0.11.0+cpu"})
    demo = load_config("demo-smollm2-agent-cpu-vllm")
    assert VLLM.settings(demo).version == "0.11.0"  # the default: the paper's vLLM
    assert require_version(demo, VLLM.settings(demo), {"vllm": "0.11.0"}).batch_invariant is False


def test_batch_invariance_needs_a_vllm_that_has_it_and_plans_do_not_choose_the_version(tmp_path):
    demo = load_config("demo-smollm2-agent-cpu-vllm")
    with pytest.raises(
        ArtifactError, match="batch_invariant needs VLLM_BATCH_INVARIANT, which vLLM 0.11.0 does not have"
    ):
        VLLM.settings(demo, load_plan("bi"))
    plans = tmp_path / "plans.toml"
    plans.write_text('[x]\ndescription = "x"\narms = ["on"]\nruns = 1\nvllm = { version = "0.25.0" }\n')
    with pytest.raises(ArtifactError, match="the vLLM version is the configuration's"):
        load_plans(plans)
    bad = tmp_path / "v.toml"
    bad.write_text(f'extends = "{demo.path}"\nname = "v"\n[engine.settings]\nversion = "0.99.0"\n')
    with pytest.raises(ArtifactError, match="this adapter knows vLLM 0.11.0, 0.25.0"):
        load_config(str(bad))


def test_the_vllm_plans_set_the_environment_the_arm_flag_and_the_salt():
    cfg = load_config("h200-vllm/h200-vllm-agent-bf16")
    plans = load_plans()
    main, bi, bi_salt, salt = (VLLM.settings(cfg, plans[n]) for n in ("main", "bi", "bi-salt", "salt"))
    assert "VLLM_BATCH_INVARIANT" not in fixed_env("cuda", main)
    assert fixed_env("cuda", bi)["VLLM_BATCH_INVARIANT"] == "1" == fixed_env("cuda", bi_salt)["VLLM_BATCH_INVARIANT"]
    assert fixed_env("cuda", main)["NCCL_NVLS_ENABLE"] == "0" and "NCCL_NVLS_ENABLE" not in fixed_env("cpu", main)
    # what the H200 runs needed: 0.25.0's sampler imports FlashInfer (not staged) at start-up unless this is 0
    assert fixed_env("cuda", main)["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in fixed_env("cpu", main)
    assert fixed_env("cpu", main) == fixed_env("cpu")  # the CPU demo's environment (and fingerprint) is unchanged
    assert arm_flag(main, "off") == "--no-enable-prefix-caching" and arm_flag(salt, "off") == "--enable-prefix-caching"
    assert arm_flag(salt, "on") == "--enable-prefix-caching"
    assert "cache_salt" in describe_cache(salt, "off") and "cache_salt" not in describe_cache(salt, "on")
    assert arm_placeholder(main) == "<arm: --enable-prefix-caching | --no-enable-prefix-caching>"
    assert VLLM.overrides(plans["bi"]) == {"batch_invariant": True} and VLLM.overrides(plans["salt"]) == {}
    # a llama.cpp configuration runs these plans with its own defaults (they have no llama_cpp table)
    llama = load_config("h200/h200-agent-f16")
    assert engines.get("llama.cpp").settings(llama, plans["bi"]) == engines.get("llama.cpp").settings(llama)


def test_a_conversion_is_checked_against_its_converters_pin(tmp_path, monkeypatch):
    pins = tmp_path / "conversions.json"
    monkeypatch.setattr(vllm_env, "PINS", pins)
    pins.write_text(json.dumps({"pins": []}))
    record = {
        "source_sha256": "ab" * 32,
        "dtype": "float32",
        "transformers": "5.17.0",
        "tokenizers": "0.23.2",
        "safetensors": "0.8.0",
        "gguf": "0.19.0",
        "files_sha256": {"model.safetensors": "1" * 64, "tokenizer.json": "2" * 64},
    }
    assert vllm_env.pin_of(record) is None and vllm_env.pin_problem(record) is None  # unpinned: served, said so
    vllm_env.write_pin(record, "derived:x/F16")
    assert vllm_env.pin_of(record) is not None and vllm_env.pin_problem(record) is None
    changed = {**record, "files_sha256": {**record["files_sha256"], "tokenizer.json": "3" * 64}}
    assert "differs from its pin (tokenizer.json)" in vllm_env.pin_problem(changed)
    # another converter may write other tokenizer files, never other weights
    other = {
        **record,
        "transformers": "4.56.2",
        "files_sha256": {"model.safetensors": "1" * 64, "tokenizer.json": "4" * 64},
    }
    assert vllm_env.pin_problem(other) is None
    other["files_sha256"]["model.safetensors"] = "5" * 64
    assert "has weights (model.safetensors) other than every pinned conversion" in vllm_env.pin_problem(other)


def test_the_committed_pins_name_the_agent_models_f16():
    f16 = load_config("h200-vllm/h200-vllm-agent-fp16").model.sha256
    pins = vllm_env.load_pins()
    assert pins and all(p["source_sha256"] == f16 and p["dtype"] == vllm_env.CONVERT_DTYPE for p in pins)
    weights = {p["files_sha256"]["model.safetensors"] for p in pins}
    assert len(weights) == 1  # the same weights under every pinned converter
    assert {p["converter"]["transformers"] for p in pins} >= {"4.56.2", "5.17.0"}  # the CPU demo's and the H200's
