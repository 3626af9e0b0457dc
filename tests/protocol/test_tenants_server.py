"""Background tenants for real: the real llama-server (b10434) with 2 slots, the embedded agent
model on this machine's CPU, one tenant thread sending BFCL prompts over loopback while the measured OFF requests
run. A tiny budget: one episode, one request per run, short replies."""

from __future__ import annotations

import dataclasses
import json

import pytest

from artifact.catalog import load_config, load_plans
from artifact.protocol.runner import execute_plan
from artifact.records.store import find_runs
from budget import with_workload

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    cfg = with_workload(load_config("probe-agent-cpu"), episodes=1, max_turns=1, max_steps_per_turn=0, n_predict=8)
    base = load_plans()["tenants1-shared"]
    plan = dataclasses.replace(
        base,
        name="tenants1-test",
        arms=("off",),
        runs=2,
        engine_settings={"llama_cpp": {**base.engine_settings["llama_cpp"], "slots": 2}},
        tenants={"count": 1, "prefix": "shared", "prompts": 2, "n_predict": 4},
    )
    results = tmp_path_factory.mktemp("results")
    execute_plan(cfg, plan, results)
    return cfg, sorted(find_runs(results), key=lambda r: r.manifest["run"])


def test_the_server_serves_two_slots_each_with_the_whole_context(loaded):
    cfg, runs = loaded
    for run in runs:
        m = run.manifest
        cmd = m["server_cmd"]
        assert cmd[cmd.index("-np") + 1] == "2" and cmd[cmd.index("-c") + 1] == str(2 * cfg.server.ctx_size)
        assert m["props"]["total_slots"] == 2 and m["props"]["n_ctx"] == cfg.server.ctx_size
        assert m["plan_data"]["tenants"]["count"] == 1 and m["pairing_inputs"]["tenants"]["spec"]["count"] == 1


def test_the_tenant_ran_beside_the_measured_requests_and_every_request_is_recorded(loaded):
    _, runs = loaded
    for run in runs:
        t = run.manifest["tenants"]
        assert t["spec"] == {"count": 1, "prefix": "shared", "prompts": 2, "n_predict": 4} and t["slots"] == 2
        assert t["units"][0]["unit"] == "multi_turn_base_0" and len(t["units"][0]["prompts_sha256"]) == 2
        sent, measured = t["sent"], t["measured"]
        assert sent["completed"] >= 1 and sent["failed"] == 0 and sent["first_error"] is None
        assert measured["requests"] == len(run.requests) == 1
        # the tenant's first request starts with the run: it is in flight while the measured request runs
        assert measured["overlapped"] == 1 and measured["overlap_share"] > 0
        rows = [json.loads(x) for x in (run.path / "tenants.jsonl").read_text().splitlines()]
        mine = [r for r in rows if r["kind"] == "tenant"]
        assert len(mine) == sent["requests"] and [r["request"] for r in mine] == list(range(len(mine)))
        assert [r["prompt"] for r in mine] == [c % 2 for c in range(len(mine))]  # the fixed schedule
        assert all(r["prompt_sha256"] == t["units"][0]["prompts_sha256"][r["prompt"]] for r in mine)
        assert all(r["predicted_n"] <= 4 and r["slot"] in (0, 1) for r in mine)
        assert mine[-1]["t_end"] <= run.manifest["wall_s"] + 1  # stopped with the run
        (m,) = [r for r in rows if r["kind"] == "measured"]
        assert m["unit"] == "multi_turn_base_0" and m["tenant_requests_overlapping"] >= 1
    # shared prefix: the tenant's later requests reuse its own cached system prompt
    assert any((r.manifest["tenants"]["sent"]["cache_n"] or 0) > 0 for r in runs) or all(
        r.manifest["tenants"]["sent"]["completed"] == 1 for r in runs
    )


def test_the_measured_requests_stay_greedy_and_cache_off(loaded):
    _, runs = loaded
    for run in runs:
        (req,) = run.requests
        assert req["error"] is None and req["cache_n"] == 0 and req["output_tokens"]
