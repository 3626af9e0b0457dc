"""One arm of plan `kernels` (OFF run 1 or ON run 1) of a configuration at a budget, for measuring where vLLM's CPU
runs diverge (bench/vllm_divergence.py reads the two arms' results). The server's OpenMP threads are bound to one
core (VLLM_CPU_OMP_THREADS_BIND=CPU), so that the two arms run side by side, one core each, and so that other
processes on a shared machine do not stall a two-thread server's barriers; the binding is recorded in each
manifest's server_env and pairing inputs. Measurement only: the demo's servers use vLLM's default binding (all
cores); the measurement in the git history of bench/vllm-demo-budget.md compared the two bit for bit.

    PYTHONPATH=.:tests scripts/isolate.sh .venv/bin/python bench/vllm_arm.py CONFIG RESULTS CPU off|on [KEY=INT ...]
    # e.g. demo-smollm2-agent-cpu-vllm M-OFF 1 off episodes=7 max_turns=1  (and ... M-ON 0 on ...)
"""

import dataclasses
import sys
from pathlib import Path

import artifact.engines.vllm.adapter as adapter
from artifact.catalog import load_config, load_plan
from artifact.protocol.runner import execute_plan
from budget import with_workload  # tests/budget.py: a configuration at a test's budget

config, results, cpu, arm = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
budget = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[5:])}
_fixed_env = adapter.fixed_env
adapter.fixed_env = lambda build: {**_fixed_env(build), "VLLM_CPU_OMP_THREADS_BIND": cpu}
cfg = with_workload(load_config(config), **budget)
execute_plan(cfg, dataclasses.replace(load_plan("kernels"), arms=(arm,)), results)
