"""The vLLM adapter's decisions that need no server: refusals before anything runs, and how a /v1/completions
response and the /metrics text become a request record (bodies shaped as vLLM 0.11.0 answers; the real server is
exercised in test_vllm_server.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from artifact.catalog import load_config, load_plan
from artifact.engines.vllm import env as vllm_env
from artifact.engines import get
from artifact.engines.vllm.adapter import ARM_FLAGS, kernel_env, kernel_record, serve_args
from artifact.engines.vllm.answers import completion, parse_choice, parse_metrics
from artifact.errors import ArtifactError
from artifact.protocol.runner import execute_plan

METRICS_TEXT = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1536.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1408.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0"} 1.0
"""


def body(tokens, tops, finish="stop", stop_reason=None, cached=None):
    return {
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "token_ids": tokens,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in tokens],
                    "token_logprobs": [0.0] * len(tokens),
                    "top_logprobs": tops,
                    "text_offset": [0] * len(tokens),
                },
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": len(tokens),
            "total_tokens": 10 + len(tokens),
            "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
        },
    }


@pytest.fixture
def vcfg():
    return load_config("demo-smollm2-agent-cpu-vllm")


def test_a_response_becomes_token_ids_and_ranked_top2(vcfg):
    tops = [{"token_id:7": -0.1, "token_id:9": -2.5}, {"token_id:4": -3.0, "token_id:2": -0.01}]
    tokens, text, top, stop, usage = parse_choice(body([7, 2], tops))
    assert tokens == [7, 2] and text == "ab" and stop == "eos" and usage["prompt_tokens"] == 10
    assert top == [[[7, -0.1], [9, -2.5]], [[2, -0.01], [4, -3.0]]]
    assert parse_choice(body([7], tops[:1], finish="length"))[3] == "limit"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b["choices"][0]["logprobs"]["tokens"].__setitem__(0, "hello"), "not 'token_id:N'"),
        (lambda b: b["choices"][0].__setitem__("token_ids", [8]), "disagree"),
        (lambda b: b["choices"][0]["logprobs"]["top_logprobs"].pop(), "do not match"),
        (lambda b: b.pop("usage"), "'usage'"),
        (lambda b: b["choices"][0].__setitem__("finish_reason", "abort"), "abort"),
        (lambda b: b.__setitem__("choices", []), "0 choices"),
    ],
)
def test_a_malformed_response_is_a_one_line_fatal_error(mutate, message):
    b = body([7], [{"token_id:7": -0.1, "token_id:9": -2.5}])
    mutate(b)
    with pytest.raises(ArtifactError, match=message):
        parse_choice(b)


def test_metrics_counters_are_read_and_summed():
    m = parse_metrics(METRICS_TEXT)
    assert m["queries"] == 1536.0 and m["hits"] == 1408.0 and m["prefill_s"] is None


def test_cache_n_carries_the_hits_of_either_source(vcfg, tmp_path):
    tokens, text, top, stop, usage = parse_choice(body([7], [{"token_id:7": -0.1, "token_id:9": -2.5}], cached=None))
    before = {"hits": 100.0, "queries": 500.0, "prefill_n": 3.0, "prefill_s": 1.0, "decode_n": 3.0, "decode_s": 2.0}
    after = {"hits": 228.0, "queries": 510.0, "prefill_n": 4.0, "prefill_s": 1.5, "decode_n": 4.0, "decode_s": 2.25}
    done = completion(tokens, text, top, stop, usage, before, after, 12.0, vcfg.server.batch_size)
    # usage said null (0) but the counters saw 128 hit tokens: cache_n is 128 and the disagreement is recorded
    assert done.cache_n == 128 and done.prompt_n == 10 - 128
    assert done.extra["usage_cached_tokens"] is None and done.extra["metrics_prefix_cache_hits"] == 128
    assert done.extra["cache_sources_agree"] is False
    assert done.prompt_ms == 500.0 and done.predicted_ms == 250.0
    same = {**after, "hits": 100.0}
    cold = completion(tokens, text, top, stop, usage, before, same, 12.0, vcfg.server.batch_size)
    assert cold.cache_n == 0 and cold.extra["cache_sources_agree"] is True


def test_vllm_that_is_not_installed_is_a_one_line_error_before_anything_runs(vcfg, tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_VLLM_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(ArtifactError, match=r"vLLM is not installed .*scripts/setup-vllm\.sh"):
        execute_plan(vcfg, load_plan("main"), tmp_path / "results")
    assert not list((tmp_path).rglob("manifest.json"))
    other = dataclasses.replace(vcfg, engine=dataclasses.replace(vcfg.engine, binary="/nope/vllm"))
    with pytest.raises(ArtifactError, match="not found or not executable"):
        vllm_env.resolve_executable(other.engine.binary)


def test_the_gsm8k_bridge_is_refused_on_vllm_before_anything_starts(vcfg, tmp_path):
    from artifact.cli import execute

    cfg = tmp_path / "vllm-gsm8k.toml"
    cfg.write_text(f'extends = "{vcfg.path}"\nname = "vllm-gsm8k"\n[workload]\nname = "gsm8k"\nepisodes = 2\n')
    with pytest.raises(
        ArtifactError, match="needs arm 'bridge', per request cache switch, which engine vllm does not have"
    ):
        execute(str(cfg), "bridge", None, tmp_path / "results")
    assert not (tmp_path / "results").exists()


def test_flags_the_adapter_owns_cannot_be_overridden(vcfg):
    for extra, message in [
        (("--dtype", "bfloat16", "--disable-log-stats"), "--disable-log-stats"),
        (("--dtype", "bfloat16", "--enable-prefix-caching"), "--enable-prefix-caching"),
        (("--max-num-seqs=4", "--dtype", "bfloat16"), "--max-num-seqs"),
        ((), "--dtype explicitly"),
    ]:
        cfg = dataclasses.replace(vcfg, server=dataclasses.replace(vcfg.server, extra_args=extra))
        with pytest.raises(ArtifactError, match=message):
            serve_args(cfg, "m", "1", "--no-enable-prefix-caching")
    args = serve_args(vcfg, "m", "1", "--no-enable-prefix-caching")
    assert args[-1] == "--no-enable-prefix-caching" and "--enable-prompt-tokens-details" in args


def test_the_recorded_command_line_is_held_against_the_identity_it_was_paired_by():
    """A manifest as VllmServer records it (the command line `serve_args` makes, the identity with its placeholders)
    passes the checker's engine facts; another arm's flag or another argument does not (artifact.check.facts)."""
    from artifact.engines.vllm.adapter import ARM_FLAGS, ENGINE

    cfg = load_config("demo-smollm2-agent-cpu-vllm")
    ident = {
        "engine": "vllm",
        "vllm": "0.11.0",
        "server_args": serve_args(cfg, "<model dir>", "<port>", "<arm: " + " | ".join(ARM_FLAGS.values()) + ">"),
    }
    for arm in ("off", "on"):
        m = {
            "arm": arm,
            "pairing_inputs": {"engine": ident},
            "server_cmd": ["/venv/bin/vllm"] + serve_args(cfg, "/models/m", "41234", ARM_FLAGS[arm]),
            "cache_condition": {"arm_flag": ARM_FLAGS[arm]},
        }
        assert ENGINE.audit.manifest_problem(m) is None
    m["server_cmd"] = ["/venv/bin/vllm"] + serve_args(cfg, "/models/m", "41234", ARM_FLAGS["off"])  # arm "on"
    assert "lacks --enable-prefix-caching, the flag of arm 'on'" in ENGINE.audit.manifest_problem(m)
    m["server_cmd"] = ["/venv/bin/vllm"] + serve_args(
        dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, batch_size=1)),
        "/models/m",
        "41234",
        ARM_FLAGS["on"],
    )
    assert "the server ran another command line" in ENGINE.audit.manifest_problem(m)
    assert "not `vllm serve`" in ENGINE.audit.manifest_problem({**m, "server_cmd": ["llama-server", "--port", "1"]})


KERNEL_PLANS = ("bi-fa2", "bi-triton", "bi-flex", "bi-eager", "eager")


def test_a_plans_kernel_settings_become_vllm_025_flags_and_are_recorded():
    """vLLM 0.25.0 takes the attention settings as one --attention-config and eager execution as --enforce-eager,
    on both arms' servers; each plan's settings are server overrides (a mitigation plan's), and what it asked is
    recorded beside what vLLM chose."""
    cfg, vllm = load_config("h200-vllm/h200-vllm-agent-bf16"), get("vllm")
    for name in KERNEL_PLANS:
        plan = load_plan(name)
        settings = vllm.settings(cfg, plan)
        for flag in ARM_FLAGS.values():
            args = serve_args(cfg, "m", "1", flag, settings)
            assert args[-1] == flag and kernel_env(settings) == {}
            assert ("--enforce-eager" in args) == settings.enforce_eager
            if settings.attention_backend:
                config = json.loads(args[args.index("--attention-config") + 1])
                assert config["backend"] == settings.attention_backend
                assert config.get("flash_attn_version", 0) == settings.flash_attn_version
            else:
                assert "--attention-config" not in args
        assert vllm.overrides(plan) and set(vllm.overrides(plan)) <= {
            "batch_invariant",
            "attention_backend",
            "flash_attn_version",
            "enforce_eager",
        }
        record = kernel_record(settings)
        assert record["how"] == "--attention-config" and record["enforce_eager"] == settings.enforce_eager
    main = vllm.settings(cfg, load_plan("main"))
    assert serve_args(cfg, "m", "1", ARM_FLAGS["on"], main) == serve_args(cfg, "m", "1", ARM_FLAGS["on"])


def test_vllm_011_takes_the_attention_settings_from_the_environment(vcfg):
    vllm = get("vllm")
    settings = dataclasses.replace(vllm.settings(vcfg), attention_backend="TORCH_SDPA", enforce_eager=True)
    args = serve_args(vcfg, "m", "1", ARM_FLAGS["off"], settings)
    assert "--enforce-eager" in args and "--attention-config" not in args
    assert kernel_env(settings) == {"VLLM_ATTENTION_BACKEND": "TORCH_SDPA"}
    assert kernel_record(settings)["how"] == "environment"


def test_kernel_settings_a_plan_gets_wrong_are_one_line_errors(tmp_path):
    cfg, vllm = load_config("h200-vllm/h200-vllm-agent-bf16"), get("vllm")
    for table, message in [
        ({"attention_backend": "flash-attn"}, "registry name"),
        ({"flash_attn_version": 4}, "2 or 3"),
        ({"attention_backend": "TRITON_ATTN", "flash_attn_version": 2}, "applies to FLASH_ATTN only"),
        ({"enforce_eager": "yes"}, "enforce_eager"),
    ]:
        plan = dataclasses.replace(load_plan("main"), engine_settings={"vllm": table})
        with pytest.raises(ArtifactError, match=message):
            vllm.settings(cfg, plan)
    for extra in (("--attention-backend", "FLASH_ATTN"), ("--attention-config", "{}")):
        bad = dataclasses.replace(
            cfg, server=dataclasses.replace(cfg.server, extra_args=("--dtype", "bfloat16", *extra))
        )
        with pytest.raises(ArtifactError, match="which the vLLM adapter sets itself"):
            serve_args(bad, "m", "1", ARM_FLAGS["on"])


def test_eager_asked_by_the_configuration_and_by_the_plan_is_one_flag(vcfg):
    """A configuration may run eager itself (the CPU tests do, to skip torch.compile): a plan's eager then adds no
    second flag, and the manifest says where it came from."""
    cfg = dataclasses.replace(
        vcfg, server=dataclasses.replace(vcfg.server, extra_args=("--dtype", "bfloat16", "--enforce-eager"))
    )
    settings = get("vllm").settings(cfg)
    eager = dataclasses.replace(settings, enforce_eager=True)
    assert serve_args(cfg, "m", "1", ARM_FLAGS["on"], eager).count("--enforce-eager") == 1
    assert kernel_record(settings, cfg.server.extra_args)["enforce_eager_from"] == "configuration"
    assert kernel_record(eager, cfg.server.extra_args)["enforce_eager_from"] == "plan"
    assert kernel_record(settings)["enforce_eager"] is False
