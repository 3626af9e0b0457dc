"""Shared fixtures: synthetic runs written through the real RunWriter (see synthetic_runs.py)."""

import pytest

from synthetic_runs import write_bfcl_run


@pytest.fixture
def make_run(tmp_path):
    """make_run(arm, run, {episode_id: [output token lists]}, ...) -> Run, under tmp_path/synthetic/main/."""
    return lambda *a, **k: write_bfcl_run(tmp_path, *a, **{"config": "synthetic", "cache_n": 0, **k})
