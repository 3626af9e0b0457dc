"""`./run.sh all --slurm` through a REAL single-node Slurm (Debian's slurmctld, slurmd and MUNGE; .ci/run starts them
with scripts/slurm-single-node.sh): the CPU smoke matrix (configs/ci/all.toml, the native CPU path) submitted as a job
array with a dependent check job, a running task cancelled with scancel and the resubmission resuming, and the one-line
errors (no sbatch, bad options). The batch scripts, their options and the dry run need no daemons.

sbatch reaches slurmctld over TCP on this host, which a network-isolated test process (./run.sh test runs pytest
inside scripts/isolate.sh) cannot: .ci/run runs this file with ARTIFACT_ALLOW_NETWORK=1, and the tests that need Slurm
skip with that reason elsewhere. The Slurm tasks isolate their protocol runs themselves (their manifests are checked).
NOT RUN here: GPUs through gres, several nodes, Apptainer (no build of it is reachable here)."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from artifact.config import REPO

SMOKE = "docker-smoke-smollm2-cpu"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
HOST = socket.gethostname().split(".")[0]


def cli(*args, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "artifact", "all", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**ENV, **(env or {})},
    )


def submit(results: Path, *extra: str):
    r = cli(
        "--slurm",
        "--cpu",
        "--matrix",
        "configs/ci/all.toml",
        "--results",
        str(results),
        "--progress-every",
        "10",
        *extra,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted array job (\d+): .* and check job (\d+) \(--dependency=afterany:\1\)", r.stdout)
    assert m, r.stdout
    return m[1], m[2], Path(re.search(r"submission: (\S+)", r.stdout)[1])


def queued(job_id: str) -> list[str]:
    r = subprocess.run(["squeue", "-h", "-r", "-j", job_id, "-o", "%i %T %R"], capture_output=True, text=True)
    return r.stdout.split("\n")[:-1] if r.returncode == 0 else []


def wait_gone(job_id: str, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while queued(job_id):
        assert time.monotonic() < deadline, f"job {job_id} still queued after {timeout} s: {queued(job_id)}"
        time.sleep(2)


def manifests(pdir: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in pdir.glob("*/manifest.json")}


def isolated() -> bool:
    from artifact.provenance import network_interfaces

    return network_interfaces() == ["lo"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A reachable single-node Slurm: the one .ci/run started, else started here (root, apt) and stopped after."""
    if isolated():
        pytest.skip(
            "this test process runs in a network namespace of its own (scripts/isolate.sh), from which "
            "slurmctld's TCP port is unreachable: run `ARTIFACT_ALLOW_NETWORK=1 ./run.sh test "
            "tests/test_slurm.py` (.ci/run does; the Slurm tasks isolate themselves)"
        )
    state = tmp_path_factory.mktemp("slurm-state")
    env = {**os.environ, "SLURM_CI_STATE": str(state)}
    started = False
    reachable = shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0
    if not reachable:
        if os.geteuid() != 0:
            pytest.skip("no Slurm reachable and not root to start one (scripts/slurm-single-node.sh start)")
        r = subprocess.run(
            [str(REPO / "scripts" / "slurm-single-node.sh"), "start"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if r.returncode != 0:
            pytest.skip(f"a single-node Slurm could not be started here: {(r.stderr or r.stdout).strip()[-300:]}")
        started = True
    yield
    if started:
        subprocess.run([str(REPO / "scripts" / "slurm-single-node.sh"), "stop"], env=env, timeout=120)


# --- no daemons needed ------------------------------------------------------------------------------------------


def dry(*extra, env=None):
    r = cli("--slurm", "--dry-run", *extra, env=env)
    assert r.returncode == 0, r.stderr
    scripts = dict(re.findall(r"--- \S+/(array|check)\.sbatch\n(.*?)(?=\n--- |\nwould run)", r.stdout, re.S))
    return r.stdout, scripts


def test_dry_run_prints_both_batch_scripts_with_the_site_options_and_submits_nothing(tmp_path):
    out, scripts = dry(
        "--results",
        str(tmp_path / "r"),
        "--partition",
        "gpu",
        "--account",
        "proj42",
        "--qos",
        "normal",
        "--time",
        "4:00:00",
        "--gres",
        "gpu:a100:1",
        "--sbatch-line=--cpus-per-task=8",
        "--sbatch-line",
        "#SBATCH --constraint=h100",
        env={"PATH": "/usr/bin:/bin:/nonexistent"},
    )
    array, check = scripts["array"], scripts["check"]
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj42",
        "#SBATCH --qos=normal",
        "#SBATCH --time=4:00:00",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --constraint=h100",
    ):
        assert line in array and line in check, line
    assert "#SBATCH --gres=gpu:a100:1" in array and "--gres" not in check  # the check needs no GPU
    assert "#SBATCH --array=0-9,12-15" in array  # 16 jobs, the two vLLM ones skipped (no vLLM installed here)
    assert "#SBATCH --dependency=afterany:<array job id>" in check
    assert 'exec ./run.sh all --slurm-task "$SLURM_ARRAY_TASK_ID" --submission "$sub"' in array
    assert 'exec ./run.sh all --slurm-finish --submission "$sub"' in check
    assert "unset ARTIFACT_ALLOW_NETWORK" in array and "HF_HUB_OFFLINE=1" in array
    assert "every node must see it" in out and "nothing submitted" in out and "time per task" in out
    assert not (tmp_path / "r").exists()  # nothing written


def test_batch_script_says_in_one_line_when_the_results_directory_is_not_visible(tmp_path):
    """What a task on a node without the results directory prints (the dry run's script: its submission does not
    exist)."""
    _, scripts = dry("--cpu", "--matrix", "configs/ci/all.toml", "--results", str(tmp_path / "elsewhere"))
    script = tmp_path / "array.sbatch"
    script.write_text(scripts["array"])
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**ENV, "SLURM_ARRAY_TASK_ID": "0"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: the results directory is not visible on {socket.gethostname()}")
    assert "must be on a file system every node mounts" in r.stderr


def test_missing_sbatch_and_bad_options_are_one_line_errors(tmp_path):
    base = ["--slurm", "--cpu", "--matrix", "configs/ci/all.toml", "--results", str(tmp_path / "r")]
    cases = [
        (base, {"PATH": str(tmp_path)}, "error: sbatch not found on PATH"),
        (base + ["--time", "4 hours"], {}, "error: --time '4 hours': not a Slurm time"),
        (base + ["--gres", "gpu 1"], {}, "error: --gres 'gpu 1': not a Slurm gres"),
        (base + ["--partition", "a b"], {}, "error: --partition 'a b': not a Slurm partition"),
        (base + ["--sbatch-line", "cpus=8"], {}, "error: --sbatch-line 'cpus=8': expected one sbatch option"),
        (base + ["--sbatch-line=--array=0-3"], {}, "error: --sbatch-line '--array=0-3': --array is set by"),
        (["--partition", "x", "--dry-run"], {}, "error: --partition is an option of --slurm"),
        (
            ["--slurm", "--container", "apptainer", "--matrix", "configs/ci/all.toml"],
            {},
            "error: --container apptainer needs --image FILE.sif",
        ),
        (["--slurm", "--status", "--results", str(tmp_path / "none")], {}, "error: no Slurm submission under"),
    ]
    for argv, env, start in cases:
        r = cli(*argv, env=env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert r.stderr.startswith(start), (argv, r.stderr)
    assert not (tmp_path / "r").exists()


# --- a real Slurm -----------------------------------------------------------------------------------------------


def test_options_sbatch_refuses_are_one_line_errors_and_nothing_is_submitted(slurm, tmp_path):
    results = tmp_path / "r"

    def ids():
        return set(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split())

    before = ids()
    for extra, what in (
        (["--cpu", "--partition", "nosuch"], "invalid partition"),
        (["--cpu", "--sbatch-line=--no-such-option=1"], "unrecognized option"),
        ([], "gres"),
    ):  # GPU tasks (default --gres=gpu:1) on this node without GPUs
        r = cli("--slurm", "--matrix", "configs/ci/all.toml", "--results", str(results), *extra)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (extra, r.stderr)
        assert r.stderr.startswith("error: sbatch refused the job array (") and what in r.stderr.lower(), r.stderr
        assert "llama-server" not in r.stdout + r.stderr  # refused before any set-up or build
    assert ids() <= before  # no job submitted
    assert not list(results.glob("slurm/*"))  # no submission left behind


@pytest.mark.server
def test_slurm_array_runs_the_cpu_smoke_matrix_then_the_dependent_check(slurm, tmp_path):
    results = tmp_path / "results"
    t0 = time.monotonic()
    array, check, sub = submit(results)
    assert "#SBATCH --array=0\n" in (sub / "array.sbatch").read_text()
    assert f"#SBATCH --dependency=afterany:{array}\n" in (sub / "check.sbatch").read_text()
    assert any("(Dependency)" in line for line in queued(check))  # the check waits for the array
    wait_gone(check)
    print(f"array + check through Slurm: {time.monotonic() - t0:.0f} s")
    pdir = results / SMOKE / "main"
    ms = manifests(pdir)
    assert sorted(ms) == ["off-run1", "off-run2", "on-run1", "on-run2"]
    for m in ms.values():
        assert m["status"] == "complete" and m["engine_build"] == "b10434-7e4c0a968"
        assert m["isolation"]["network"] == "loopback-only"  # the task isolated its protocol run
        assert "ARTIFACT_ALLOW_NETWORK" not in m["isolation"]["initial_environment"]
    record = json.loads((sub / "tasks" / "0.json").read_text())
    assert record["state"] == "done" and record["array_job_id"] == array and record["node"] == socket.gethostname()
    task_out = (sub / "logs" / f"task-0-{array}.out").read_text()
    assert f"task 0: {SMOKE}/main done after" in task_out and f"[{HOST}] {SMOKE}/main: started" in task_out
    check_out = next((sub / "logs").glob("check-*.out")).read_text()
    assert f"{SMOKE}/main  done" in check_out and "RQ1 (hard)  PASS" in check_out
    assert (results / "check" / "report.html").is_file()
    r = cli("--slurm", "--status", "--results", str(results))
    assert r.returncode == 0, r.stderr
    assert re.search(rf"^0\s+{SMOKE}/main\s+done\s+{re.escape(socket.gethostname())}", r.stdout, re.M), r.stdout
    assert f"check job {check}: not queued" in r.stdout
    # everything complete: a resubmission has nothing to do
    r = cli("--slurm", "--cpu", "--matrix", "configs/ci/all.toml", "--results", str(results))
    assert r.returncode == 0 and "nothing to submit" in r.stdout, r.stdout + r.stderr


@pytest.mark.server
def test_scancel_of_a_running_task_then_resubmission_resumes(slurm, tmp_path):
    results = tmp_path / "results"
    pdir = results / SMOKE / "main"
    t0 = time.monotonic()
    array, check, sub = submit(results)
    deadline = time.monotonic() + 1800  # generous: a busy 2-core machine
    while not (pdir / "on-run1").exists():  # the OFF session is complete, the ON session under way
        assert time.monotonic() < deadline and queued(array), "the task ended before its ON session started"
        time.sleep(1)
    subprocess.run(["scancel", f"{array}_0"], check=True)
    wait_gone(array, timeout=120)
    record = json.loads((sub / "tasks" / "0.json").read_text())
    assert record["state"] == "interrupted" and "resubmitting resumes" in record["note"], record
    before = manifests(pdir)
    assert before["off-run1"]["status"] == before["off-run2"]["status"] == "complete"
    assert before["on-run1"]["status"] == "incomplete"
    protocol = subprocess.run(["pgrep", "-f", f"artifact run .* --results {results}"], capture_output=True)
    assert not protocol.stdout  # the task's protocol process ended with it
    wait_gone(check)  # afterany: the check job runs after a cancelled task too, and says what is missing
    check_out = next((sub / "logs").glob("check-*.out")).read_text()
    assert f"{SMOKE}/main  FAILED" in check_out and "resubmitting resumes" in check_out
    r = cli("--slurm", "--status", "--results", str(results))
    assert re.search(rf"^0\s+{SMOKE}/main\s+interrupted", r.stdout, re.M), r.stdout

    array2, check2, sub2 = submit(results)  # resubmit: the OFF session is kept, the ON session runs again
    assert sub2 != sub and "#SBATCH --array=0\n" in (sub2 / "array.sbatch").read_text()
    wait_gone(check2)
    print(f"submit, cancel, resubmit, resume through Slurm: {time.monotonic() - t0:.0f} s")
    after = manifests(pdir)
    assert {k: m["status"] for k, m in after.items()} == dict.fromkeys(
        ["off-run1", "off-run2", "on-run1", "on-run2"], "complete"
    )
    assert after["off-run1"]["started_at"] == before["off-run1"]["started_at"]  # reused, not re-run
    newest = sorted((pdir / "logs").glob("slurm-*.log"))[-1].read_text()
    assert "session off: complete, reusing" in newest
    assert list((pdir / "discarded").glob("*/on-run1/manifest.json"))  # the cancelled run, kept aside
    assert json.loads((sub2 / "tasks" / "0.json").read_text())["state"] == "done"
    check_out = next((sub2 / "logs").glob("check-*.out")).read_text()
    assert f"{SMOKE}/main  done" in check_out and "RQ1 (hard)  PASS" in check_out
