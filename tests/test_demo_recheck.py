"""The demo re-checks the committed GPU evidence and prints its verdicts beside its own run's."""


def test_the_demo_rechecks_the_committed_gpu_evidence_beside_its_own_verdicts(tmp_path, capsys):
    import json
    import shutil

    from artifact import cli
    from artifact.check.run import run_check
    from synthetic_runs import write_bfcl_run

    live = tmp_path / "results"
    for arm in ("off", "on"):
        for k in (1, 2):
            write_bfcl_run(live, arm, k, {"e0": [[1, 2]]})
    run_check(live, quiet=True)
    cli.recheck_evidence(live)
    out = capsys.readouterr().out
    assert "committed H200 records (h200-agent, re-checked)" in out
    assert any(line.startswith("RQ3") and line.rstrip().endswith("PASS") for line in out.splitlines())
    # the report names the evidence folder, not the temporary directory its records were unpacked into
    ev = json.loads((live / "check-evidence" / "check.json").read_text())
    assert ev["results_dir"] == "evidence/h200-agent"
    assert "Results: <code>evidence/h200-agent</code>" in (live / "check-evidence" / "report.html").read_text()
    shutil.rmtree(live / "check-evidence")
