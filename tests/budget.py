"""A configuration at a test's budget: its workload settings replaced (episodes, turns, steps, tokens per reply)."""

from __future__ import annotations

from artifact.workloads.base import replace_settings


def with_workload(cfg, **workload):
    return replace_settings(cfg, **workload)


# The vLLM CPU server tests serve float32. They test what the adapter, the protocol and the records do on the real
# server (arms, cache exposure, resume, errors), not a precision, and a CPU without bf16 instructions is slow at it:
# a ~3.8k-token BFCL prompt took 17.9 s to prefill in float32 against ~66 s in bfloat16 (2 cores; docs/demo.md,
# "RQ4 on a CPU"). The demo (`./run.sh demo --vllm`, tests/test_demo_vllm.py) serves bfloat16 as configured.
TEST_VLLM_DTYPE = "float32"
# ... and without torch.compile (`--enforce-eager`): the server then starts without compiling or loading compiled
# graphs. Measured on 2 CPU cores (the OFF server of the test configuration, a
# 1.5k-token prompt, bench/vllm_start_modes.py): eager 86-113 s to ready + 47 s for the first request, compiled 166 s + 24 s;
# later requests alike (20-28 s); the same 12 tokens either way, top-2 log-probabilities equal to ~5e-6 (eager gave
# bit-identical ones in both of its starts). A fresh machine without vLLM's compile cache saves ~3 min more per
# configuration. The demo serves compiled, as configured.
TEST_VLLM_EXTRA_ARGS = ("--enforce-eager",)


def vllm_test_config(name: str = "demo-smollm2-agent-cpu-vllm", **workload):
    """The demo's vLLM configuration served in TEST_VLLM_DTYPE with TEST_VLLM_EXTRA_ARGS, at a test's budget (workload
    settings replaced)."""
    import dataclasses

    from artifact.catalog import load_config

    cfg = load_config(name)
    args = list(cfg.server.extra_args)
    at = args.index("--dtype")
    args[at + 1] = TEST_VLLM_DTYPE
    args += [a for a in TEST_VLLM_EXTRA_ARGS if a not in args]
    cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, extra_args=tuple(args)))
    return with_workload(cfg, **workload) if workload else cfg
