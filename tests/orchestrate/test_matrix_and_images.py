"""`./run.sh all` without Docker: the run matrix, the dry run, prerequisites' one-line errors, progress parsing."""

import os
import subprocess
import sys

import pytest

from artifact import workloads

from artifact.config import REPO

from artifact.catalog import load_plan
from artifact.errors import ArtifactError
from artifact.orchestrate import host
from artifact.orchestrate.common import schedule_hours
from artifact.orchestrate.fanout import Progress, runs_per_session
from artifact.orchestrate.matrix import load_jobs

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def cli(*args, **env):
    return subprocess.run(
        [sys.executable, "-m", "artifact", *args],
        cwd=REPO,
        env={**ENV, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_matrix_holds_the_ten_configurations_and_the_papers_plans():
    jobs = load_jobs()
    bfcl = {j.cfg.name for j in jobs if j.cfg.workload.name == "bfcl_multi_turn_base"}
    assert len(bfcl) == 10 and sum(j.engine == "vllm" for j in jobs) == 2
    plans = {(j.cfg.name, j.plan) for j in jobs}
    assert all((c, "main") in plans for c in bfcl)
    assert {p for c, p in plans if c == "qwen2.5-7b-q4_k_m"} == {"main", "cram0", "fresh"}
    bridge = sorted(j.cfg.model.quant for j in jobs if j.plan == "bridge")
    assert bridge == ["F16", "Q3_K_M", "Q4_K_M", "Q8_0"]
    for j in jobs:  # the paper's settings
        w, s = j.cfg.workload, workloads.get(j.cfg.workload.name).settings(j.cfg)
        if w.name == "bfcl_multi_turn_base":
            assert (w.episodes, s.max_turns, s.max_steps_per_turn, s.prompt_variant) == (80, 0, 20, "default")
        else:
            assert (w.episodes, s.gsm8k_source) == (200, "hub")


def test_dry_run_lists_jobs_images_weights_and_gpu_time_without_docker():
    r = cli("all", "--dry-run", "--gpus", "0,1", DOCKER_HOST="unix:///nonexistent.sock")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for name in (
        "qwen2.5-7b-f16",
        "qwen2.5-7b-q8_0",
        "qwen2.5-7b-q4_k_m",
        "qwen2.5-7b-q3_k_m",
        "llama-3.1-8b-q8_0",
        "llama-3.1-8b-q4_k_m",
        "llama-3.1-8b-q3_k_m",
        "qwen2.5-14b-q4_k_m",
        "vllm-qwen2.5-7b-bf16",
        "vllm-qwen2.5-7b-fp16",
    ):
        assert name in out
    assert "prefix-cache-artifact/llamacpp:b10434-cu126" in out and "cram0" in out and "bridge" in out
    assert "58.3 GB pinned" in out and "free there" in out and "on 2 GPUs" in out


def test_configs_subset_and_unknown_names():
    r = cli("all", "--dry-run", "--configs", "qwen2.5-7b-q4_k_m")
    assert r.returncode == 0 and r.stdout.count("qwen2.5-7b-q4_k_m ") == 3  # main, cram0, fresh
    r = cli("all", "--dry-run", "--configs", "gpt-5")
    assert r.returncode == 2 and r.stderr.startswith("error: --configs: 'gpt-5' is not in all.toml")


def test_unreachable_docker_daemon_is_one_line_error():
    r = cli("all", "--cpu", "--matrix", "configs/ci/all.toml", DOCKER_HOST="unix:///nonexistent.sock")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: cannot reach the Docker daemon") and "Traceback" not in r.stderr


def test_matrix_rejects_configs_outside_the_repository_and_bad_entries(tmp_path):
    (tmp_path / "x.toml").write_text((REPO / "configs" / "demo-smollm2-agent-cpu.toml").read_text())
    m = tmp_path / "all.toml"
    m.write_text('[[run]]\nconfig = "x"\nplans = ["main"]\ngpu_mem_gib = 1\nhours = { main = 1 }\n')
    with pytest.raises(ArtifactError, match="outside the repository"):
        load_jobs(m)
    m.write_text('[[run]]\nconfig = "x"\nplans = ["main"]\ngpu_mem_gib = 1\nhours = {}\nextra = 1\n')
    with pytest.raises(ArtifactError, match="unknown key 'extra'"):
        load_jobs(m)


def test_gpu_listing_and_selection():
    gpus = host.parse_nvidia_smi("0, NVIDIA GeForce RTX 4090, 24564, 560.35.03\n1, NVIDIA H200, 143771, 580.1\n")
    assert [(g.index, round(g.memory_gib)) for g in gpus] == [(0, 24), (1, 140)]
    assert [g.index for g in host.select_gpus(gpus, "1")] == [1]
    with pytest.raises(ArtifactError, match="no GPU 3 on this host"):
        host.select_gpus(gpus, "0,3")
    with pytest.raises(ArtifactError, match="expected GPU indices"):
        host.select_gpus(gpus, "all")


def test_progress_follows_the_protocols_lines():
    jobs = [j for j in load_jobs() if j.key == "qwen2.5-7b-q4_k_m/main"]
    total, per_session = runs_per_session(load_plan("main"))
    p = Progress(jobs[0], total)
    p.feed("[qwen2.5-7b-q4_k_m/main] session off: complete, reusing", per_session)
    p.feed("  [on run 1] 3/80 multi_turn_base_2: valid (9 requests)", per_session)
    text = p.line("gpu1")
    assert "on run 1" in text and "episode 3/80" in text and "left" in text
    assert p.done_runs == {("off", 1), ("off", 2)}


def test_longest_first_schedule():
    assert schedule_hours([2.5, 1.0, 1.0, 0.5], 2) == 2.5
    assert schedule_hours([1, 1, 1], 1) == 3


def test_build_context_leaves_out_environments_weights_and_results(tmp_path):
    from artifact.orchestrate.images import context_files

    for rel in (
        "run.sh",
        "artifact/cli.py",
        ".venv-vllm/lib/torch.so",
        ".venv/bin/python",
        ".venv-cuda/bin/python",
        "models/series/f16.gguf",
        "results/cfg/main/off-run1/requests.jsonl",
        "weights/qwen/model.gguf",
        "tests/test_x.py",
        "docker/build-inputs/ca.crt",
        "docker/build-inputs/ca-env.sh",
        "artifact/models/recipes/lora.gguf",
        "artifact/models/derive.py",
        "configs/x.gguf",
        "artifact/tests/x.py",
        "artifact/__pycache__/x.pyc",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert sorted(p.as_posix() for p in context_files(tmp_path)) == [
        "artifact/cli.py",
        "artifact/models/derive.py",
        "artifact/models/recipes/lora.gguf",
        "artifact/tests/x.py",
        "docker/build-inputs/ca-env.sh",
        "run.sh",
    ]  # top-level models/ and tests/ only: artifact/models/ is the package


def test_a_hub_gsm8k_job_of_the_paper_matrix_gets_its_dataset_mounted_read_only(tmp_path):
    """A bug once: the Docker back-end read `job.cfg.workload.gsm8k_source` (a workload setting, not a field), so
    every GSM8K job of `./run.sh all` with a Hub cache raised AttributeError. The mounts are the workload's now, for
    the Docker and the Apptainer back-ends alike; no Docker engine is needed to build a container's volumes."""
    from artifact.orchestrate.fanout import Fanout, Slot
    from artifact.orchestrate.matrix import load_jobs
    from artifact.orchestrate.slurm import apptainer_command

    jobs = load_jobs()
    gsm = [j for j in jobs if j.cfg.workload.name == "gsm8k"]
    bfcl = [j for j in jobs if j.cfg.workload.name != "gsm8k"]
    assert gsm and bfcl
    hf_cache = tmp_path / "hub"
    (hf_cache / "datasets--openai--gsm8k" / "snapshots").mkdir(parents=True)
    results = tmp_path / "results"
    results.mkdir()
    fan = Fanout(client=None, images={}, expect_build={}, results=results, weights=None, hf_cache=hf_cache)
    dataset = str((hf_cache / "datasets--openai--gsm8k").resolve())
    for job in gsm:
        assert job.cfg.workload.settings.get("gsm8k_source") == "hub", job.key
        vols = fan.volumes(job)
        assert vols[dataset] == {"bind": "/hf-cache/datasets--openai--gsm8k", "mode": "ro"}, job.key
        assert vols[str(results.resolve())] == {"bind": "/results", "mode": "rw"}
        spec = {
            "results": str(results),
            "weights": str(tmp_path / "w"),
            "hf_hub_cache": str(hf_cache),
            "image": "img.sif",
            "image_id": "sha256:0",
            "cpu": True,
            "episodes": None,
        }
        argv, _ = apptainer_command(job, Slot("node", ()), spec=spec)
        assert f"{dataset}:/hf-cache/datasets--openai--gsm8k:ro" in argv, job.key
    for job in bfcl[:2]:  # the BFCL jobs read no Hub data
        assert dataset not in fan.volumes(job)
    # without a Hub cache (or before `./run.sh fetch`), nothing is mounted and nothing fails
    assert dataset not in Fanout(
        client=None, images={}, expect_build={}, results=results, weights=None, hf_cache=None
    ).volumes(gsm[0])
