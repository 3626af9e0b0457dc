"""A configuration at a test's budget: its workload settings replaced (episodes, turns, steps, tokens per reply)."""

from __future__ import annotations

from artifact.workloads.base import replace_settings


def with_workload(cfg, **workload):
    return replace_settings(cfg, **workload)
