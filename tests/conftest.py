"""Shared fixtures: synthetic runs written through the real RunWriter (see synthetic_runs.py)."""

import os
import time
from pathlib import Path

import pytest

from synthetic_runs import write_bfcl_run


@pytest.fixture
def make_run(tmp_path):
    """make_run(arm, run, {episode_id: [output token lists]}, ...) -> Run, under tmp_path/synthetic/main/."""
    return lambda *a, **k: write_bfcl_run(tmp_path, *a, **{"config": "synthetic", "cache_n": 0, **k})


def pytest_configure(config):
    """CI (.ci/run) sets up Docker, Slurm and Chromium in the background while `./run.sh test` compiles llama.cpp:
    wait here, before any test is collected (the Docker and Slurm tests ask at collection whether they can run),
    until that set-up has finished (ARTIFACT_CI_SERVICES_DONE names the file it writes last), at most 30 minutes."""
    done = os.environ.get("ARTIFACT_CI_SERVICES_DONE")
    if not done:
        return
    t0 = time.monotonic()
    while not Path(done).exists() and time.monotonic() - t0 < 1800:
        time.sleep(2)
    print(f"ci: waited {time.monotonic() - t0:.0f} s for the background set-up of Docker, Slurm and Chromium")
