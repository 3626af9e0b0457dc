"""Shared fixtures: synthetic runs written through the real RunWriter (see synthetic_runs.py)."""

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from synthetic_runs import write_bfcl_run


@pytest.fixture
def make_run(tmp_path):
    """make_run(arm, run, {episode_id: [output token lists]}, ...) -> Run, under tmp_path/synthetic/main/."""
    return lambda *a, **k: write_bfcl_run(tmp_path, *a, **{"config": "synthetic", "cache_n": 0, **k})


def pytest_configure(config):
    """The checker's record cache (artifact.records.decoded) of the tests' runs goes into a folder of the session's
    own, never the user's cache (tests that look at it choose their own: ARTIFACT_RECORD_CACHE); a check is replayed
    only where a test asks (ARTIFACT_CHECK_REPLAY).

    CI (.ci/run) sets up Docker, Slurm and Chromium in the background while `./run.sh test` compiles llama.cpp:
    wait here, before any test is collected (the Docker and Slurm tests ask at collection whether they can run),
    until that set-up has finished (ARTIFACT_CI_SERVICES_DONE names the file it writes last), at most 30 minutes."""
    if not os.environ.get("ARTIFACT_RECORD_CACHE"):
        config._record_cache = os.environ["ARTIFACT_RECORD_CACHE"] = tempfile.mkdtemp(prefix="artifact-record-cache-")
    # a test that checks the same results twice means to check them twice: replays (artifact.check.replay) only
    # where a test asks for them (tests/check/test_replay.py)
    os.environ.setdefault("ARTIFACT_CHECK_REPLAY", "0")
    # the suite runs commands in this process, set up by run.sh: none hands over to run.sh (artifact.cli.hand_over)
    os.environ.setdefault("ARTIFACT_SET_UP", "1")
    done = os.environ.get("ARTIFACT_CI_SERVICES_DONE")
    if not done:
        return
    t0 = time.monotonic()
    while not Path(done).exists() and time.monotonic() - t0 < 1800:
        time.sleep(2)
    print(f"ci: waited {time.monotonic() - t0:.0f} s for the background set-up of Docker, Slurm and Chromium")


def pytest_unconfigure(config):
    if getattr(config, "_record_cache", None):
        shutil.rmtree(config._record_cache, ignore_errors=True)
