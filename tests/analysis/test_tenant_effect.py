"""Other tenants: records with known load, written through the real RunWriter, against the
isolated baseline; the verdicts worked out by hand. RQ1 and RQ2 stay judged on plans without load."""

from __future__ import annotations

import json

from artifact.analysis import tenant_effect
from artifact.check.beyond import analyse
from artifact.check.run import run_check
from artifact.records.store import find_runs
from synthetic_runs import MODEL, OFF, ON1, ON2, main_plan, pairing_inputs, write_bfcl_run
from tenant_runs import SPEC, load_record, loaded_inputs, loaded_plan


def verdict(root, plan):
    b = analyse(find_runs(root))
    return {v.id: v for v in b.verdicts}[f"BEYOND-TENANTS-{plan}"], b


def test_off_under_load_equal_to_isolated_passes_and_the_on_arm_is_reported(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    loaded_plan(tmp_path, "tenants1-shared", OFF, OFF, ON2, ON2)
    v, b = verdict(tmp_path, "tenants1-shared")
    assert v.status == "PASS" and v.scope == "cfg/tenants1-shared"
    assert "OFF under load vs isolated diverged in 0/8 episodes; OFF rerun under load 0/4" in v.observed
    # ON run 1 under load = ON2 against isolated ON1: e3 diverges; ON run 2 = isolated ON run 2: none
    assert "ON vs isolated ON 1/8" in v.evidence[0] and "ON vs OFF 6/8 (isolated 5/8)" in v.evidence[0]
    assert "28 tenant requests (0 failed), 8/8 measured requests overlapped" in v.evidence[1]  # over 4 runs
    row = b.tables["tenants.csv"].iloc[0]
    assert (row["tenants"], row["prefix"], row["slots"]) == (1, "shared", 3)
    assert row["on_vs_isolated_detail"].startswith("run 1: 1/4 (first: e3 request 0, token 0)")
    runs = b.tables["tenants_runs.csv"]
    assert list(runs["arm"]) == ["off", "off", "on", "on"] and runs["refused"].isna().all()
    # the load plan is no mitigation: no BEYOND-MITIGATION verdict, no mitigation row
    assert not [x for x in b.verdicts if x.id.startswith("BEYOND-MITIGATION-tenants")]
    assert "tenants1-shared" not in set(b.tables["mitigation.csv"].get("plan", []))


def test_off_outputs_that_change_under_load_are_a_finding(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    off2 = {**OFF, "e1": [[1, 2, 3, 4, 5], [6, 0, 8]]}
    loaded_plan(tmp_path, "tenants2-unshared", OFF, off2, ON1, ON2, spec={**SPEC, "count": 2, "prefix": "unshared"})
    v, b = verdict(tmp_path, "tenants2-unshared")
    assert v.status == "FAIL"
    assert "diverged in 1/8 episodes; OFF rerun under load 1/4 (first: e1 request 1, token 1)" in v.observed
    assert "a finding" in v.observed and "do not share" in v.claim
    # ... and RQ1 stays judged on the isolated plan only: PASS, the loaded plan named as not judged
    code = run_check(tmp_path, quiet=True)
    data = json.loads((tmp_path / "check" / "check.json").read_text())
    rq1 = {c["id"]: c for c in data["claims"]}["RQ1"]
    assert rq1["status"] == "PASS" and [d["scope"] for d in rq1["details"]] == ["cfg / main"]
    assert any("not judged (background tenants" in e and "cfg / tenants2-unshared" in e for e in rq1["evidence"])
    rq2 = {c["id"]: c for c in data["claims"]}["RQ2"]
    assert all("tenants" not in d["scope"] for d in rq2["details"])
    assert code != 1 and data["hard_failures"] == []
    statuses = {x["id"]: x["status"] for x in data["beyond"]["verdicts"]}
    assert statuses["BEYOND-TENANTS-tenants2-unshared"] == "FAIL"
    assert (tmp_path / "check" / "tenants.png").is_file() and "tenants.png" in data["files"]
    assert data["beyond"]["tenants"][0]["off_vs_isolated_diverged"] == 1
    html = (tmp_path / "check" / "report.html").read_text()
    assert 'id="beyond-tenants"' in html and 'id="tenants-table"' in html and "2 (unshared)" in html


def test_the_control_without_load_is_judged_by_rq1_and_gets_its_own_verdict(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    spec0 = {**SPEC, "count": 0}
    loaded_plan(
        tmp_path, "tenants0", OFF, OFF, ON1, ON2, spec=spec0, load=load_record(spec0, overlapped=0, completed=0)
    )
    v, _ = verdict(tmp_path, "tenants0")
    assert v.status == "PASS" and "without load" in v.claim  # no load is expected: not INCONCLUSIVE
    run_check(tmp_path, quiet=True)
    data = json.loads((tmp_path / "check" / "check.json").read_text())
    rq1 = {c["id"]: c for c in data["claims"]}["RQ1"]
    assert sorted(d["scope"] for d in rq1["details"]) == ["cfg / main", "cfg / tenants0"]


def test_no_measured_overlap_is_inconclusive(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    loaded_plan(tmp_path, "tenants1-shared", OFF, OFF, ON1, ON2, load=load_record(overlapped=0, completed=0))
    v, _ = verdict(tmp_path, "tenants1-shared")
    assert v.status == "INCONCLUSIVE" and "no load was measured" in v.observed


def test_runs_that_differ_beyond_the_load_are_not_compared(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    loaded_plan(tmp_path, "tenants1-shared", OFF, OFF, ON1, ON2, inputs=loaded_inputs(threads=4))
    v, b = verdict(tmp_path, "tenants1-shared")
    assert v.status == "INVALID" and "differ in threads, not only in the load" in v.observed
    assert b.tables["tenants_runs.csv"]["vs_isolated"].isna().all()


def test_without_the_isolated_baseline_or_any_tenant_plan_it_is_not_run(tmp_path):
    loaded_plan(tmp_path / "a", "tenants1-shared", OFF, OFF, ON1, ON2)
    v, _ = verdict(tmp_path / "a", "tenants1-shared")
    assert v.status == "NOT-RUN" and "no isolated run (plan main)" in v.observed
    main_plan(tmp_path / "b", OFF, ON1, ON2)
    (only,) = [x for x in analyse(find_runs(tmp_path / "b")).verdicts if x.id.startswith("BEYOND-TENANTS")]
    assert only.status == "NOT-RUN" and "--plan tenants1-shared" in only.observed


def test_only_the_load_and_its_server_arguments_may_differ():
    base = pairing_inputs(MODEL, 8192)
    assert tenant_effect._strip(loaded_inputs()) == tenant_effect._strip(base)
    real = {"engine": {"server_args": ["-m", "x", "-c", "24576", "-np", "3", "-ub", "512"]}, "tenants": {}}
    assert tenant_effect._strip(real) == {"engine": {"server_args": ["-m", "x", "-ub", "512"]}}


def test_one_off_run_under_load_is_not_enough_for_a_pass(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    write_bfcl_run(
        tmp_path, "off", 1, OFF, plan="tenants1-shared", manifest={"tenants": load_record()}, inputs=loaded_inputs()
    )
    v, _ = verdict(tmp_path, "tenants1-shared")
    assert v.status == "INCONCLUSIVE" and "the rerun under load did not run" in v.observed
    assert v.evidence[0].startswith("ON vs isolated ON -;")


def test_the_committed_cpu_tenant_runs_recheck_as_documented(tmp_path):
    """evidence/cpu-tenants (docs/beyond-the-paper.md): the 3-slot server alone changes nothing; with background tenants the
    cache-OFF reruns disagree (a finding, not a failure: RQ1 is judged on the isolated plan and holds)."""
    import csv

    from artifact.cli import main
    from artifact.config import REPO

    assert main(["check", str(REPO / "evidence" / "cpu-tenants"), "--out", str(tmp_path)]) == 0
    got = {
        r["id"]: r["status"]
        for r in csv.DictReader((tmp_path / "beyond_verdicts.csv").open())
        if r["id"].startswith("BEYOND-TENANTS")
    }
    assert got == {
        "BEYOND-TENANTS-tenants0": "PASS",
        "BEYOND-TENANTS-tenants1-shared": "FAIL",
        "BEYOND-TENANTS-tenants1-unshared": "FAIL",
        "BEYOND-TENANTS-tenants2-shared": "FAIL",
        "BEYOND-TENANTS-tenants2-unshared": "FAIL",
    }
    rq1 = {r["scope"]: r["status"] for r in csv.DictReader((tmp_path / "verdicts.csv").open()) if r["claim"] == "RQ1"}
    assert set(rq1.values()) == {"PASS"} and not any("tenants1" in s or "tenants2" in s for s in rq1)
