"""The checker never passes on broken, partial or too little evidence.

Each test builds one situation as a results directory (through the real RunWriter, or by editing its files as a
damaged or hand-made directory would be) and asserts the verdict and the exit code of `./run.sh check`
(artifact.cli.main, so that malformed input is seen as the exit code a pipeline gets).
"""

from __future__ import annotations

import json

import pytest

from artifact.check.claims import EXIT_CODES, FAIL, INCONCLUSIVE, INVALID, NOT_RUN, PASS
from artifact.cli import main
from synthetic_runs import MODEL, OFF, ON1, ON2, fingerprint_of, main_plan, pairing_inputs, paper_model, write_bfcl_run

QWEN7_Q4KM = paper_model("qwen2.5-7b-q4_k_m")  # the paper's weights: a paper configuration by their digests
QWEN7_PAPER = {"paper": "qwen2.5-7b"}  # trend_runs: each level the paper's weights of that level (configs/paper/)


def check(root, capsys=None):
    """Exit code of `./run.sh check ROOT`, and (when check.json was written) the claims by id and the whole file."""
    code = main(["check", str(root)])
    out = root / "check" / "check.json"
    if not out.exists():
        return code, None, None
    data = json.loads(out.read_text())
    assert data["exit_code"] == code
    return code, {c["id"]: c for c in data["claims"]}, data


def statuses(claims) -> dict:
    return {k: c["status"] for k, c in claims.items()}


def edit_manifest(run, **fields):
    mf = run.path / "manifest.json"
    m = json.loads(mf.read_text())
    m.update(fields)
    mf.write_text(json.dumps(m))


def lines(path) -> list[str]:
    return path.read_text().splitlines()


# --- RQ1 is exact for every record shape ----------------------------------------------------------------------


def test_a_null_cache_count_does_not_hide_a_cached_token_elsewhere(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    off1 = tmp_path / "cfg" / "main" / "off-run1" / "requests.jsonl"
    recs = [json.loads(x) for x in lines(off1)]
    recs[0]["cache_n"] = None  # e0 request 0: not reported
    recs[1].update(cache_n=7, prompt_n=93)  # e0 request 1: 7 cached tokens served to the OFF arm
    off1.write_text("".join(json.dumps(r) + "\n" for r in recs))
    code, claims, data = check(tmp_path)
    assert code == 1 and claims["RQ1"]["status"] == FAIL
    assert any("off-run1: cache-OFF run served cached tokens in 1 requests" in p for p in data["invalid"])
    d = claims["RQ1"]["details"][0]
    assert "cached prompt tokens in OFF runs: 7" in d["observed"]
    assert "cache use not reported for cfg/main/off-run1 (1 of 8 requests)" in d["observed"]


def test_a_failed_request_still_counts_its_cached_tokens(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    write_bfcl_run(tmp_path, "off", 1, OFF, plan="p2", errors={("e1", 1): "HTTP 500"})
    write_bfcl_run(tmp_path, "off", 2, OFF, plan="p2", cache_n=5, errors={(e, 1): "HTTP 500" for e in OFF})
    code, claims, data = check(tmp_path)
    assert code == 1 and claims["RQ1"]["status"] == FAIL
    scopes = {d["scope"]: d for d in claims["RQ1"]["details"]}
    assert scopes["cfg / main"]["status"] == PASS and scopes["cfg / p2"]["status"] == FAIL
    assert any("p2/off-run2: cache-OFF run served cached tokens in 4 requests" in p for p in data["invalid"])


def test_every_pair_of_off_runs_is_compared(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    write_bfcl_run(tmp_path, "off", 3, {**OFF, "e3": [[1, 2, 3, 4, 5], [6, 7, 0]]})  # run 3 differs from 1 and 2
    code, claims, data = check(tmp_path)
    assert code == 1 and data["hard_failures"] == ["RQ1"]
    d = claims["RQ1"]["details"][0]
    assert d["status"] == FAIL and "OFF reruns 0/4" in d["observed"]  # the headline, run 1 vs 2, agrees
    assert "1/4 episodes diverge in any of the 3 OFF pairs" in d["observed"]
    assert any("e3 (request 1, token 2) in OFF run 1 vs run 3" in e for e in d["evidence"])


def test_off_runs_whose_requests_all_failed_are_inconclusive(tmp_path):
    every = {(e, i): "timeout" for e in OFF for i in range(2)}
    for arm, k, eps in (("off", 1, OFF), ("off", 2, OFF), ("on", 1, ON1), ("on", 2, ON2)):
        write_bfcl_run(tmp_path, arm, k, eps, errors=every)
    code, claims, _ = check(tmp_path)
    assert claims["RQ1"]["status"] == INCONCLUSIVE and claims["RQ2"]["status"] == INCONCLUSIVE
    assert "all failed" in claims["RQ1"]["details"][0]["evidence"][0]
    assert code == 3 and "nothing could be tested" in EXIT_CODES[code]


def test_runs_that_hold_no_requests_are_inconclusive(tmp_path):
    empty = {f"e{i}": [] for i in range(4)}  # every episode recorded with n_requests = 0 and no request
    for arm, k in (("off", 1), ("off", 2), ("on", 1), ("on", 2)):
        write_bfcl_run(tmp_path, arm, k, empty)
    code, claims, data = check(tmp_path)
    assert data["invalid"] == []  # whole runs (each episode record says 0 requests), but no evidence
    assert statuses(claims)["RQ1"] == INCONCLUSIVE and code == 3


def test_single_off_run_and_nothing_else_tested_exits_3(tmp_path):
    write_bfcl_run(tmp_path, "off", 1, OFF)
    code, claims, _ = check(tmp_path)
    assert set(statuses(claims).values()) == {NOT_RUN} and code == 3


# --- runs are validated before anything is judged -------------------------------------------------------------


@pytest.mark.parametrize(
    "run, name, keep, claim, problem",
    [
        (
            1,
            "requests.jsonl",
            lambda xs: [x for x in xs if '"episode_id": "e2"' not in x],
            "RQ1",
            "off-run2 is marked complete but has no requests for episode e2",
        ),
        (
            2,
            "episodes.jsonl",
            lambda xs: xs[:-1],
            "RQ2",
            "on-run1 is marked complete but has no episode record (verdict) for episode e3",
        ),
        (
            0,
            "requests.jsonl",
            lambda xs: xs[:-1],
            "RQ1",  # e3's last request gone, whole lines only
            "holds a different number of requests than its episode record says for episode e3",
        ),
    ],
    ids=["episode-without-requests", "episode-without-verdict", "fewer-requests-than-the-verdict-says"],
)
def test_complete_run_missing_records_is_invalid(tmp_path, run, name, keep, claim, problem):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    f = runs[run].path / name
    f.write_text("".join(x + "\n" for x in keep(lines(f))))
    code, claims, data = check(tmp_path)
    assert code == 1 and claims[claim]["status"] == INVALID
    assert claims["RQ2"]["details"][0]["status"] == INVALID  # the configuration-plan is not judged on it
    assert any(problem in p for p in data["invalid"])


def test_episode_listed_twice_is_invalid(tmp_path):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    edit_manifest(runs[0], episodes=["e0", "e1", "e2", "e3", "e1"])
    code, claims, data = check(tmp_path)
    assert code == 1 and claims["RQ1"]["status"] == INVALID
    assert any("its manifest lists episode e1 twice" in p for p in data["invalid"])


def test_two_runs_of_a_comparison_listing_different_episodes_are_not_compared(tmp_path):
    write_bfcl_run(tmp_path, "off", 1, OFF)
    write_bfcl_run(tmp_path, "off", 2, {**OFF, "e9": [[1]]})
    code, claims, data = check(tmp_path)
    assert code == 1 and claims["RQ1"]["status"] == INVALID
    assert (
        "cfg/main/off-run1 and cfg/main/off-run2 are not comparable: they list different episodes "
        "(1 only in the second (e.g. e9)); comparison refused"
    ) in data["invalid"]


@pytest.mark.parametrize("arm", ["OFF", "cached"])
def test_unknown_or_differently_cased_arm_label_is_malformed_input(tmp_path, arm, capsys):
    main_plan(tmp_path, OFF, ON1, ON2)
    write_bfcl_run(tmp_path, arm, 1, OFF, plan="other")
    code, claims, _ = check(tmp_path)
    assert code == 2 and claims is None
    err = capsys.readouterr().err
    assert f"arm '{arm}' is not one of the artifact's arms (off, on, bridge" in err and err.count("\n") == 1


def test_the_same_run_twice_is_malformed_input(tmp_path, capsys):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    copy = tmp_path / "copy" / "off-run1"
    copy.mkdir(parents=True)
    for f in runs[0].path.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    code, claims, _ = check(tmp_path)
    assert code == 2 and claims is None
    assert "two runs claim to be cfg/main/off-run1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, where",
    [("requests.jsonl", "middle"), ("requests.jsonl", "end"), ("episodes.jsonl", "middle"), ("episodes.jsonl", "end")],
)
def test_a_line_cut_short_in_a_complete_run_is_corruption(tmp_path, capsys, name, where):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    path = runs[1].path / name
    rows = lines(path)
    i = 1 if where == "middle" else len(rows) - 1
    rows[i] = rows[i][: len(rows[i]) // 2]
    path.write_text("\n".join(rows) + ("\n" if where == "middle" else ""))
    code, claims, _ = check(tmp_path)
    assert code == 2 and claims is None
    err = capsys.readouterr().err
    assert f"{path}:{i + 1}: not valid JSON (cut short?) in a run marked complete" in err and err.count("\n") == 1


def test_a_line_cut_short_at_the_end_of_an_interrupted_run_is_dropped_and_the_run_invalid(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    run = write_bfcl_run(tmp_path, "on", 3, ON1, complete=False)
    with open(run.path / "requests.jsonl", "a") as fh:
        fh.write('{"episode_id": "e0", "requ')
    code, claims, data = check(tmp_path)
    assert code == 1 and f"cfg/main/on-run3 is incomplete ({run.path})" in data["invalid"]
    assert claims["RQ1"]["status"] == PASS  # the OFF runs are whole and agree
    assert claims["RQ2"]["status"] == INVALID  # the configuration-plan holds an invalid run


# --- pairing fingerprints ---------------------------------------------------------------------------------------


def test_pairing_fingerprint_mismatch_refuses_the_comparison(tmp_path):
    write_bfcl_run(tmp_path, "off", 1, OFF)
    write_bfcl_run(tmp_path, "off", 2, OFF, inputs=pairing_inputs(MODEL, 8192, threads=4))
    main_plan(tmp_path, OFF, ON1, ON2, config="other")  # an unaffected configuration
    code, claims, data = check(tmp_path)
    assert code == 1
    assert (
        "cfg/main/off-run1 and cfg/main/off-run2 are not comparable: their pairing fingerprints differ "
        "(first differing pairing input: threads); comparison refused"
    ) in data["invalid"]
    rq1 = {d["scope"]: d["status"] for d in claims["RQ1"]["details"]}
    assert rq1 == {"cfg / main": INVALID, "other / main": PASS} and claims["RQ1"]["status"] == INVALID


def test_on_and_off_with_different_fingerprints_are_not_compared(tmp_path):
    changed = pairing_inputs(MODEL, 8192)
    changed["bfcl"] = {**changed["bfcl"], "dataset_sha256": "00" * 32}
    for k in (1, 2):
        write_bfcl_run(tmp_path, "off", k, OFF)
        write_bfcl_run(tmp_path, "on", k, ON1, inputs=changed)
    code, claims, data = check(tmp_path)
    assert code == 1 and claims["RQ1"]["status"] == PASS and claims["RQ2"]["status"] == INVALID
    assert any(
        "cfg/main/on-run1 and cfg/main/off-run1 are not comparable" in p
        and "first differing pairing input: bfcl.dataset_sha256" in p
        for p in data["invalid"]
    )


def test_a_run_without_a_pairing_fingerprint_is_invalid(tmp_path):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    edit_manifest(runs[3], pairing_fingerprint=None)
    code, claims, data = check(tmp_path)
    assert code == 1 and claims["RQ2"]["status"] == INVALID
    assert any(
        "cfg/main/on-run2 has no pairing_fingerprint in its manifest (made by an older artifact version)" in p
        for p in data["invalid"]
    )


def test_synthetic_runs_carry_one_fingerprint_per_configuration_plan(tmp_path):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    fps = {r.manifest["pairing_fingerprint"] for r in runs}
    assert fps == {fingerprint_of(pairing_inputs(MODEL, 8192))}


# --- network isolation ------------------------------------------------------------------------------------------


def test_unisolated_runs_are_flagged_but_do_not_fail(tmp_path, capsys):
    write_bfcl_run(tmp_path, "off", 1, OFF, isolation={"network": "host network (not isolated)"})
    write_bfcl_run(tmp_path, "off", 2, OFF, isolation=None)
    write_bfcl_run(tmp_path, "on", 1, ON1)
    write_bfcl_run(tmp_path, "on", 2, ON1)
    code, claims, data = check(tmp_path)
    assert code == 0 and claims["RQ1"]["status"] == PASS
    assert data["unisolated_runs"] == ["cfg/main/off-run1", "cfg/main/off-run2"]
    assert "isolation.network = 'host network (not isolated)'" in data["run_warnings"]["cfg/main/off-run1"][0]
    assert "no network-isolation record" in data["run_warnings"]["cfg/main/off-run2"][0]
    out = capsys.readouterr().out
    assert "WARNING (not network-isolated): cfg/main/off-run1" in out
    html = (tmp_path / "check" / "report.html").read_text()
    assert 'id="unisolated-runs"' in html and "Not network-isolated" in html and "cfg/main/off-run2" in html


# --- no vacuous or underpowered PASS --------------------------------------------------------------------------


def test_rq2_without_the_reruns_it_compares_against_is_inconclusive(tmp_path):
    write_bfcl_run(tmp_path, "off", 1, OFF)
    write_bfcl_run(tmp_path, "on", 1, ON1)
    code, claims, _ = check(tmp_path)
    d = claims["RQ2"]["details"][0]
    assert d["status"] == INCONCLUSIVE and "ON rerun and the OFF rerun" in " ".join(d["evidence"])
    assert statuses(claims)["RQ1"] == NOT_RUN and code == 3


@pytest.mark.parametrize("n, status, code", [(4, INCONCLUSIVE, 0), (8, FAIL, 4)])
def test_rq2_zero_on_vs_off_fails_only_with_enough_episodes(tmp_path, n, status, code):
    # 0/n ON vs OFF: its Wilson upper bound is 49.0% at n = 4 (above the paper's smallest 36.2%), 32.5% at n = 8
    eps = {f"e{i}": [[1, 2]] for i in range(n)}
    main_plan(tmp_path, eps, eps, eps, cache_n="warm")
    got, claims, _ = check(tmp_path)
    assert claims["RQ2"]["status"] == status and claims["RQ1"]["status"] == PASS and got == code


def rq2b_runs(root, n: int, default_diverging: range, cram0_diverging: range, model=MODEL, config="cfg"):
    """Plan main (ON run 2 diverges from ON run 1 in `default_diverging`) and plan cram0 (in `cram0_diverging`)."""
    off = {f"e{i}": [[1, 2]] for i in range(n)}
    on1 = {e: [[1, 3]] for e in off}
    main_plan(root, off, on1, {**on1, **{f"e{i}": [[7]] for i in default_diverging}}, model=model, config=config)
    for k, eps in ((1, on1), (2, {**on1, **{f"e{i}": [[7]] for i in cram0_diverging}})):
        write_bfcl_run(root, "on", k, eps, plan="cram0", cache_ram_mib=0, model=model, config=config)


def test_rq2b_paper_like_agreement_passes(tmp_path):
    # default ON reruns 31/80 (38.8%), with the layer off 1/80 (the paper's 79/80): b = 31, c = 1, p ~ 1.5e-8
    rq2b_runs(tmp_path, 80, range(31), range(79, 80), model=QWEN7_Q4KM, config="qwen")
    code, claims, _ = check(tmp_path)
    d = claims["RQ2b"]["details"][0]
    assert d["status"] == PASS and "31 agree only with the layer off, 1 only by default" in d["observed"]
    assert claims["RQ2b"]["status"] == PASS and code == 0
    band = [x for x in claims["RQ2b"]["details"] if x["kind"] == "band"][0]
    assert band["status"] == PASS  # 1/80 against the paper's 1.2%


def test_rq2b_reruns_that_merely_diverge_a_little_less_fail(tmp_path):
    # default 10/80, layer off 8/80 (the same 8 and no other): b = 2, c = 0, p = 0.5; full agreement would show
    # with power 0.94 (exact McNemar at n = 80, discordant rate = net shift = 12.5%)
    rq2b_runs(tmp_path, 80, range(10), range(8))
    code, claims, _ = check(tmp_path)
    d = claims["RQ2b"]["details"][0]
    assert d["status"] == FAIL and "p = 0.5" in d["observed"] and code == 4
    assert "did not come into agreement" in d["evidence"][0]


def test_rq2b_when_the_default_reruns_already_agree_is_inconclusive(tmp_path):
    rq2b_runs(tmp_path, 20, range(0), range(0))
    _, claims, _ = check(tmp_path)
    assert claims["RQ2b"]["status"] == INCONCLUSIVE
    assert "nothing for the host prompt cache to explain" in claims["RQ2b"]["details"][0]["evidence"][0]


def test_rq2b_without_default_reruns_is_not_run(tmp_path):
    for k in (1, 2):
        write_bfcl_run(tmp_path, "on", k, ON1, plan="cram0", cache_ram_mib=0)
    code, claims, _ = check(tmp_path)
    assert claims["RQ2b"]["details"][0]["status"] == NOT_RUN and code == 3


def trend(root, ks: dict, n: int, model=QWEN7_PAPER):
    from synthetic_runs import trend_runs

    return trend_runs(root, ks, n=n, model=model)


def test_rq3_significant_opposite_trend_fails_on_any_model(tmp_path):
    trend(tmp_path, {"F16": 60, "Q8_0": 40, "Q4_K_M": 10}, 80, model=MODEL)
    code, claims, _ = check(tmp_path)
    assert claims["RQ3"]["status"] == FAIL and "the other way" in claims["RQ3"]["details"][0]["evidence"][0]
    assert code == 4  # a claim other than RQ1 fails; the runs are valid (one OFF run per level: RQ1 NOT-RUN)


def test_rq3_paper_model_without_trend(tmp_path):
    # Qwen2.5-7B llama.cpp, the paper's z = 5.68 series: flat at 80 episodes per level is evidence against it,
    # flat at 20 episodes per level is too little to say
    trend(tmp_path / "at80", {"F16": 40, "Q8_0": 40, "Q4_K_M": 40}, 80)
    trend(tmp_path / "at20", {"F16": 10, "Q8_0": 10, "Q4_K_M": 10}, 20)
    assert check(tmp_path / "at80")[1]["RQ3"]["status"] == FAIL
    assert check(tmp_path / "at20")[1]["RQ3"]["status"] == INCONCLUSIVE


# --- what check.json states -------------------------------------------------------------------------------------


def test_check_json_copies_each_claims_minimum_evidence_and_the_exit_codes(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON1)
    code, claims, data = check(tmp_path)
    assert code == 0
    assert all(c["minimum_evidence"] for c in claims.values())
    assert set(data["claim_rules"]) == set(claims) and data["claim_rules"]["RQ5"]["minimum_evidence"]
    assert {int(k) for k in data["exit_codes"]} == {0, 1, 2, 3, 4} and data["exit_meaning"] == EXIT_CODES[0]


def test_an_unknown_plan_name_does_not_crash_the_checker(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON1)
    main_plan(tmp_path, OFF, ON1, ON1, plan="ub1")  # a mitigation plan the checker has no rule for
    code, claims, _ = check(tmp_path)
    assert code == 0 and {d["scope"] for d in claims["RQ2"]["details"] if d["kind"] == "direction"} == {
        "cfg / main",
        "cfg / ub1",
    }


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("episode_twice", "episodes.jsonl holds episode e1 twice"),
        ("index_twice", "holds a request_index twice for episode e0"),
        ("stray", "holds records of episode e7, which its manifest does not list"),
    ],
)
def test_other_ways_a_complete_run_is_not_whole(tmp_path, damage, reason):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    eps, req = runs[0].path / "episodes.jsonl", runs[0].path / "requests.jsonl"
    if damage == "episode_twice":
        eps.write_text(eps.read_text() + lines(eps)[1] + "\n")
    elif damage == "index_twice":
        recs = [json.loads(x) for x in lines(req)]
        recs[1]["request_index"] = 0
        req.write_text("".join(json.dumps(r) + "\n" for r in recs))
    else:
        recs = [json.loads(x) for x in lines(req)]
        req.write_text(req.read_text() + json.dumps({**recs[0], "episode_id": "e7"}) + "\n")
    code, claims, data = check(tmp_path)
    assert code == 1 and claims["RQ1"]["status"] == INVALID
    assert any(f"cfg/main/off-run1 is marked complete but {reason}" in p for p in data["invalid"])


def test_check_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for code, text in EXIT_CODES.items():
        assert f"  {code}  {text}" in out


def test_a_mitigation_plan_that_removes_the_divergence_is_not_an_rq2_failure(tmp_path):
    main_plan(tmp_path, OFF, ON1, ON2)
    ub1 = {
        "plan_data": {
            "name": "ub1",
            "cache_ram_mib": 8192,
            "lifecycle": "shared",
            "server_overrides": {"ubatch_size": 1},
        }
    }
    main_plan(tmp_path, OFF, OFF, OFF, plan="ub1", manifest=ub1)  # ON == OFF: the mitigation works
    code, claims, data = check(tmp_path)
    scopes = [d["scope"] for d in claims["RQ2"]["details"] if d["kind"] == "direction"]
    assert claims["RQ2"]["status"] == PASS and not any("ub1" in s for s in scopes)
    verdicts = {v["id"]: v["status"] for v in data["beyond"]["verdicts"]}
    assert verdicts["BEYOND-MITIGATION-ub1"] == PASS and code == 0  # judged where it belongs
