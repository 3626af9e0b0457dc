import json
import os
import subprocess
import sys

from artifact.config import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "artifact", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60
    )


def test_bad_input_gives_one_line_error_and_exit_2(tmp_path):
    for args in (
        ["run", "no-such-config"],
        ["run", "demo-smollm2-agent-cpu", "--plan", "nope"],
        ["run", "demo-smollm2-agent-cpu", "--episodes", "0"],
        ["compare", str(tmp_path), str(tmp_path)],
        ["summary", str(tmp_path / "none")],
    ):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_compare_and_summary_read_runs(tmp_path, make_run):
    a = make_run("off", 1, {"e0": [[1, 2]], "e1": [[3]]})
    b = make_run("off", 2, {"e0": [[1, 5]], "e1": [[3]]})
    r = cli("compare", str(a.path), str(b.path))  # they differ: exit 1, the field and its first position named
    assert (
        r.returncode == 1
        and "diverged episodes: 1/2" in r.stdout
        and "e0: first diverging request #1 (request_index 0), token index 1" in r.stdout
    )
    assert "field 'output_tokens' differs in 1 of 2 requests; first: episode e0, request 0, position 1" in r.stdout
    r = cli("summary", str(tmp_path))
    assert r.returncode == 0 and "OFF run 1 vs run 2" in r.stdout and "1/2" in r.stdout


def test_compare_flags_an_off_run_served_from_cache(make_run):
    a = make_run("off", 1, {"e0": [[1], [2]]}, cache_n=7)
    b = make_run("off", 2, {"e0": [[1], [2]]})
    r = cli("compare", str(a.path), str(b.path))
    assert r.returncode == 1 and "INVALID" in r.stdout


def test_run_sh_help_needs_no_setup():
    r = subprocess.run([str(REPO / "run.sh"), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "./run.sh demo" not in r.stderr and "demo" in r.stdout and "test" in r.stdout
    r = subprocess.run([str(REPO / "run.sh"), "frobnicate"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown command" in r.stderr


def test_check_unpacks_every_records_archive_of_an_evidence_folder(tmp_path):
    import tarfile

    from synthetic_runs import write_bfcl_run

    runs = tmp_path / "runs"
    for k in (1, 2):
        write_bfcl_run(runs, "off", k, {"e0": [[1, 2]]}, config="synthetic", cache_n=0)
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    for i, run_dir in enumerate(sorted(p.parent for p in runs.rglob("manifest.json"))):
        with tarfile.open(evidence / f"records-{i}.tar.xz", "w:xz") as tar:  # one run per archive
            tar.add(run_dir, arcname=f"results/{run_dir.relative_to(runs)}")
    r = cli("check", str(evidence))
    assert "check: 2 runs" in r.stderr + r.stdout and (evidence / "check" / "check.json").is_file()
    assert "RQ1 (hard)  PASS" in r.stdout
    # labelled by the evidence folder (outside the repository: as given), not by the temporary directory
    assert f"under {evidence}\n" in r.stdout and "artifact-evidence-" not in r.stdout
    assert json.loads((evidence / "check" / "check.json").read_text())["results_dir"] == str(evidence)
    assert f"Results: <code>{evidence}</code>" in (evidence / "check" / "report.html").read_text()


def test_the_demo_times_each_step_from_run_shs_clock(monkeypatch):
    """run.sh hands the demo its set-up clock (ARTIFACT_SETUP_TIMES: start and after each step; a locale may write
    a comma); the demo prints each step and the total. A missing or garbled clock gives no set-up rows, no error."""
    from artifact import cli

    monkeypatch.setenv("ARTIFACT_SETUP_TIMES", "100.5 130,5 730.5 745.5")
    steps = cli.setup_steps()
    assert [round(s, 1) for _, s in steps] == [30.0, 600.0, 15.0]
    table = cli.time_table(steps + [("check", 2.0)])
    assert "set-up: llama-server build" in table and table.splitlines()[-1].split()[-2] == "647.0"
    for bad in ("", "x y"):
        monkeypatch.setenv("ARTIFACT_SETUP_TIMES", bad)
        assert cli.setup_steps() == []
