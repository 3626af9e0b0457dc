"""Divergence by cache tier, on records whose tiers are known: each ON session's server log is
written with the selection line llama-server b10435 logs for the tier the test wants."""

from __future__ import annotations

from pathlib import Path

from artifact.analysis import tiers
from artifact.check.beyond import write_beyond
from synthetic_runs import write_bfcl_run

SLOT = "I slot get_availabl: id  0 | task -1 | selected slot by LCP similarity, f_sim_best = 0.900 (> 0.100 thold), f_keep = 1.000"
LRU = "I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = 1"
TIMING = "I slot print_timing: id  0 | task 1 | prompt eval time =       1.00 ms / {n:5d} tokens (    0.04 ms per token, 1.0 tokens per second)"
CMD = ["llama-server", "-m", "x.gguf", "--cache-ram", "8192", "-sps", "0.1"]
N_EP = 20


def session_log(path: Path, requests: list[tuple[str, int]]) -> None:
    """One selection line (and its timing line) per request: (LRU or SLOT, prompt tokens computed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{sel}\n{TIMING.format(n=n)}\n" for sel, n in requests))


def scenario(root: Path, lifecycle: str = "shared"):
    """OFF run 1 and ON runs 1-2 of 20 two-request episodes. In ON run 2, episodes e0-e9 start from a prefix
    restored from host memory (cache_n 90 of 100 after an LRU choice) and 8 of them differ there from ON run 1;
    e10-e19 start from the slot's own prefix and none differs. Later requests are slot hits (cache_n 60)."""
    eps = {f"e{i}": [[1, 2, 3], [4, 5]] for i in range(N_EP)}
    on2 = {e: ([[1, 9, 3], [4, 5]] if i < 8 else t) for i, (e, t) in enumerate(eps.items())}
    first = {(f"e{i}", 0): (90 if i < 10 else 30) for i in range(N_EP)}
    log = {"server_cmd": CMD}
    write_bfcl_run(root, "off", 1, eps, lifecycle=lifecycle, manifest={**log, "server_log": "logs/server-off.log"})
    session_log(root / "cfg/main/logs/server-off.log", [(LRU, 100)] * (2 * N_EP))
    if lifecycle == "shared":
        names = ["logs/server-on.log"] * 2
    else:
        names = ["logs/server-on-run1.log", "logs/server-on-run2.log"]
    runs = []
    for k, (outputs, name) in enumerate(zip((eps, on2), names), 1):
        # ON run 1: first requests recompute (cache_n 0); ON run 2: as above
        cns = first if k == 2 else {}
        runs.append(
            write_bfcl_run(
                root, "on", k, outputs, lifecycle=lifecycle, cache_ns=cns, manifest={**log, "server_log": name}
            )
        )
    lines = {1: [], 2: []}
    for k in (1, 2):
        for i in range(N_EP):
            if k == 1:
                lines[k] += [(LRU, 100), (SLOT, 40)]
            else:
                lines[k] += [(LRU, 10) if i < 10 else (SLOT, 70), (SLOT, 40)]
    if lifecycle == "shared":
        session_log(root / "cfg/main/logs/server-on.log", lines[1] + lines[2])
    else:
        for k in (1, 2):
            session_log(root / f"cfg/main/logs/server-on-run{k}.log", lines[k])


def test_every_on_request_gets_its_known_tier(tmp_path):
    scenario(tmp_path)
    from artifact.records.store import find_runs

    tables, _ = tiers.analyse(find_runs(tmp_path))
    req = tables["tiers_requests.csv"]
    run2 = req[req["run"] == 2].set_index(["episode_id", "request_index"])["tier"]
    assert run2[("e0", 0)] == "host" and run2[("e15", 0)] == "slot" and run2[("e3", 1)] == "slot"
    run1 = req[req["run"] == 1]
    assert set(run1[run1["request_index"] == 0]["tier"]) == {"none"}
    assert req["certain"].all()


def test_host_served_rerun_requests_differ_more_often_and_the_verdict_says_so(tmp_path):
    scenario(tmp_path)
    from artifact.records.store import find_runs

    tables, verdicts = tiers.analyse(find_runs(tmp_path))
    s = tables["tiers.csv"]
    row = s[(s["run"] == 2) & (s["reference"] == "on run 1") & (s["level"] == "request") & (s["tier"] == "host")]
    assert (int(row["n"].iloc[0]), int(row["differ"].iloc[0])) == (10, 8)
    ep = s[(s["run"] == 2) & (s["reference"] == "on run 1") & (s["level"] == "episode")].set_index("tier")
    assert ep.loc["host", "differ"] == 8 and ep.loc["slot", "differ"] == 0
    (v,) = verdicts
    assert v.id == "BEYOND-TIERS" and v.scope == "cfg/main" and v.status == "PASS", v.observed
    assert "host 8/10" in v.observed and "slot 0/10" in v.observed


def test_a_plan_with_a_server_per_run_is_the_control_not_a_verdict(tmp_path):
    scenario(tmp_path, lifecycle="fresh")
    from artifact.records.store import find_runs

    _, verdicts = tiers.analyse(find_runs(tmp_path))
    assert verdicts == []  # lifecycle fresh: no ON rerun shares a server with the earlier run


def test_without_server_logs_tiers_are_unknown_and_the_verdict_not_run(tmp_path):
    scenario(tmp_path)
    for log in (tmp_path / "cfg/main/logs").iterdir():
        log.unlink()
    from artifact.records.store import find_runs

    tables, verdicts = tiers.analyse(find_runs(tmp_path))
    assert set(tables["tiers_requests.csv"]["tier"]) == {"none", "unknown"}
    assert [v.status for v in verdicts] == ["NOT-RUN"] and "no server log" in verdicts[0].observed


def test_check_writes_the_tier_tables_figure_and_report_section(tmp_path):
    scenario(tmp_path / "results")
    from artifact.records.store import find_runs

    out = tmp_path / "check"
    out.mkdir()
    b = write_beyond(find_runs(tmp_path / "results"), out)
    assert {"tiers.csv", "tiers_requests.csv", "tiers.png"} <= set(b.files)
    assert (out / "tiers.png").stat().st_size > 1000
    ctx = b.report_context(lambda p: "data:")
    host = ctx["tier_columns"].index("host (llama.cpp)")  # the columns are the engines' declared tiers
    assert any(r["cells"][host].startswith("8/10") for r in ctx["tiers"])
    assert b.as_dict()["tiers"]


def test_requests_without_a_tier_are_left_out_of_the_pairs_and_counts(tmp_path):
    """summary_frame counts a same-prompt pair under its ON request's tier; a request the engine gave no tier (its
    tier list ends early) is left out, as the per-pair loop this replaced left it out."""
    import pandas as pd

    from artifact.analysis.groups import same_prompt_requests
    from artifact.records.store import find_runs

    scenario(tmp_path)
    runs = find_runs(tmp_path)
    tiers_of = tiers.run_tiers(runs)
    on2 = next(r for r in runs if r.manifest["arm"] == "on" and r.manifest["run"] == 2)
    tiers_of[id(on2)] = tiers_of[id(on2)][:25]  # episodes e0-e11 and e12's first request
    summary, pairs = tiers.summary_frame(runs, tiers_of)
    expected = []
    for on in runs:
        if id(on) not in tiers_of or on.manifest["arm"] != "on":
            continue
        tier_of = {(q["episode_id"], q["request_index"]): t for q, t in zip(on.requests, tiers_of[id(on)])}
        for name, ref in tiers.references(on, runs):
            for qa, qb in same_prompt_requests(on, ref):
                t = tier_of.get((qa["episode_id"], qa["request_index"]))
                if t is not None:
                    expected.append(
                        (
                            on.manifest["config"],
                            "main",
                            on.manifest["run"],
                            name,
                            qa["request_index"],
                            t.tier,
                            t.certain,
                            qa["output_tokens"] != qb["output_tokens"],
                        )
                    )
    pd.testing.assert_frame_equal(pairs, pd.DataFrame(expected, columns=tiers.PAIR_COLUMNS))
    run2 = pairs[pairs["run"] == 2]
    assert 0 < len(run2[run2["reference"] == "on run 1"]) <= 25
    req = summary[(summary["run"] == 2) & (summary["reference"] == "on run 1") & (summary["level"] == "request")]
    assert req["n"].sum() == len(run2[run2["reference"] == "on run 1"])
    assert req.set_index("tier").loc["host", "differ"] == 8
