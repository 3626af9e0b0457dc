"""`./run.sh demo --vllm`'s budget decides RQ4.

RQ4 (artifact/check/claims/rq4.py) passes on the first ON-vs-OFF divergence and fails at 0/n once 0/n contradicts
the paper's smallest ON-vs-OFF rate (n >= 7); below that, 0/n is INCONCLUSIVE. Which request diverges, if any,
depends on the CPU (bench/vllm-demo-budget.md), so the demo's budget must be decided either way:

- the first test (seconds, no server) holds the demo's [[vllm]] configurations to an episode count at which 0/n is a
  FAIL, so that a smaller budget cannot come back unnoticed;
- the second runs the demo's [[vllm]] entries exactly as `./run.sh demo --vllm` does (same configuration, plan and
  budget, no override) on the real vLLM 0.11.0 CPU server, then `check`, and asserts RQ4 PASS or FAIL with its
  evidence: what the model and the server actually do (requests without error, cache hits in the ON run) cannot
  leave it undecided either. Cost: one demo run (4 runs, 2 server starts), whose time is not recorded (docs/demo.md
  says where it goes).
"""

from __future__ import annotations

import json
import os

import pytest

from artifact.check.core import Paper, zero_contradicts
from artifact.check.expected import load_document
from artifact.check.run import run_check
from artifact.cli import demo_entries, execute
from artifact.catalog import load_config


def test_the_vllm_demo_budget_is_large_enough_for_rq4_to_fail_at_zero_divergences():
    paper = Paper(load_document())
    for entry in demo_entries("vllm"):
        n = load_config(entry["config"]).workload.episodes
        assert zero_contradicts(n, paper), f"{entry['config']}: ON vs OFF 0/{n} would be INCONCLUSIVE"


@pytest.mark.vllm
@pytest.mark.skipif(
    os.environ.get("ARTIFACT_DEMO_VLLM_TEST") != "1",
    reason="NOT RUN unless ARTIFACT_DEMO_VLLM_TEST=1: it costs one whole `./run.sh demo --vllm` "
    "(its time is not recorded; the cache-OFF prefill of seven episodes on vLLM's CPU build), more than "
    "CI's time allows",
)
def test_the_vllm_demo_decides_rq4(tmp_path):
    results = tmp_path / "results"
    for entry in demo_entries("vllm"):
        execute(entry["config"], entry["plan"], None, results)  # None: the configuration's own budget
    run_check(results, quiet=True)
    rq4 = {c["id"]: c for c in json.loads((results / "check" / "check.json").read_text())["claims"]}["RQ4"]
    assert rq4["status"] in ("PASS", "FAIL"), rq4
    assert rq4["details"] and all(d["status"] in ("PASS", "FAIL") and d["evidence"] for d in rq4["details"]), rq4
