"""A configuration at a test's budget: its workload settings replaced (episodes, turns, steps, tokens per reply)."""

from __future__ import annotations

import dataclasses


def with_workload(cfg, **workload):
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, **workload))
