"""Check's worker process (artifact.check.worker): it loads part of the runs and draws the figures at scale, and
what check writes does not depend on it: the same outputs, the same first error, and a dead worker's jobs done
by the checking process."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil

import pytest

from artifact.check.run import run_check
from artifact.check.worker import WORKER_ENV, Worker
from artifact.cli import main
from artifact.records import decoded
from synthetic_runs import OFF, ON1, ON2, main_plan, trend_runs


def _results(root):
    main_plan(root, OFF, ON1, ON2)
    trend_runs(root, {"Q8_0": 10, "Q4_K_M": 30, "Q3_K_M": 40}, n=40)
    return root


def _outputs(out):
    """Every output file's bytes but timings.json's, check.json without its results folder."""
    files = {}
    for p in sorted(out.iterdir()):
        data = p.read_bytes()
        if p.name == "timings.json":  # the one output that differs on every check
            continue
        if p.name == "check.json":
            d = json.loads(data)
            d.pop("results_dir"), d.pop("record_cache")  # whether the cache was on: what this test varies
            data = d
        files[p.name] = data
    return files


def test_the_outputs_are_the_same_with_and_without_the_worker(tmp_path, monkeypatch):
    """With and without the worker, and with the checker's record cache cold, warm (artifact.records.decoded: every
    run read here, the worker only drawing) and off (the worker reads runs from requests.jsonl too)."""
    root = _results(tmp_path / "results")
    monkeypatch.setenv(decoded.DIR_ENV, str(tmp_path / "cache"))
    outs, codes, caches = {}, {}, {}
    for cache in ("cold", "warm", "off"):
        if cache == "off":
            monkeypatch.setenv(decoded.ENV, "0")
        for choice in ("0", "1"):
            if cache == "cold":
                shutil.rmtree(tmp_path / "cache", ignore_errors=True)
            monkeypatch.setenv(WORKER_ENV, choice)
            key = (cache, choice)
            codes[key] = run_check(root, tmp_path / f"out{cache}{choice}", quiet=True)
            caches[key] = json.loads((tmp_path / f"out{cache}{choice}" / "timings.json").read_text())["record_cache"]
            outs[key] = _outputs(tmp_path / f"out{cache}{choice}")
    assert len(set(codes.values())) == 1
    runs = caches["cold", "0"]["runs"]
    assert caches["cold", "0"] == caches["cold", "1"] == {"enabled": True, "read": 0, "written": runs, "runs": runs}
    assert caches["warm", "1"] == {"enabled": True, "read": runs, "written": 0, "runs": runs}
    assert caches["off", "1"] == {"enabled": False, "read": 0, "written": 0, "runs": runs}
    assert not list(root.rglob("*.msgpack"))
    assert {n for n in outs["cold", "0"] if n.endswith(".png")} >= {"fig1.png", "fig2.png", "flip_margin.png"}
    assert all(out == outs["cold", "0"] for out in outs.values())


def test_the_first_bad_run_in_order_is_named_whoever_loads_it(tmp_path, monkeypatch, capsys):
    root = _results(tmp_path / "results")
    runs = sorted(root.rglob("requests.jsonl"))
    for path in (runs[0], runs[-1]):  # the first run the worker takes, and the first this process takes
        lines = path.read_text().splitlines()
        lines[0] = lines[0].replace('"output_tokens": [', '"output_tokens": ["x", ', 1)
        path.write_text("\n".join(lines) + "\n")
    errors = {}
    for choice in ("0", "1"):
        monkeypatch.setenv(WORKER_ENV, choice)
        assert main(["check", str(root)]) == 2
        errors[choice] = capsys.readouterr().err
    assert str(runs[0]) in errors["0"] and str(runs[-1]) not in errors["0"]
    assert errors["0"] == errors["1"]


def _in_worker() -> bool:
    return multiprocessing.parent_process() is not None


def _dies_in_worker(x):
    if _in_worker():
        os._exit(1)  # as a worker killed by the kernel
    return x + 1


def _raises(message):
    from artifact.errors import ArtifactError

    raise ArtifactError(message)


def test_a_dead_worker_s_jobs_run_here_and_errors_come_back_as_raised():
    worker = Worker(True)
    try:
        assert worker.enabled
        jobs = [worker.submit(_dies_in_worker, k) for k in range(3)]
        assert [job.result()[0] for job in jobs] == [1, 2, 3]  # run here once the worker died
        assert worker.submit(_dies_in_worker, 9).result()[0] == 10
    finally:
        worker.close()
    worker = Worker(True)
    try:
        with pytest.raises(Exception, match="^one line$") as exc:
            worker.submit(_raises, "one line").result()
        assert type(exc.value).__name__ == "ArtifactError"
        assert worker.submit(_in_worker).result()[0] is True
    finally:
        worker.close()


def test_a_check_command_forks_its_worker_and_writes_what_a_spawned_one_writes(tmp_path, monkeypatch):
    """`python -m artifact check` (no thread, no numpy yet: `start_method` forks) against a check in this process
    (numpy imported: it spawns)."""
    import subprocess
    import sys

    from artifact.check.worker import start_method

    assert start_method() == "spawn"
    root = _results(tmp_path / "results")
    monkeypatch.setenv(WORKER_ENV, "1")
    run_check(root, tmp_path / "spawned", quiet=True)
    env = {**os.environ, WORKER_ENV: "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    probe = "import artifact.check.run as r, artifact.check.worker as w; print(w.start_method())"
    assert subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.strip() == ("fork" if sys.platform == "linux" else "spawn")
    subprocess.run(
        [sys.executable, "-m", "artifact", "check", str(root), "--out", str(tmp_path / "forked")],
        env=env,
        check=True,
        capture_output=True,
    )
    assert _outputs(tmp_path / "forked") == _outputs(tmp_path / "spawned")
