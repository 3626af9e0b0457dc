"""Check judges only what the primary records prove. Nothing else inside a results directory changes a
verdict (a planted `requests.decoded.msgpack`, the right sha256 and reader key, edited on its own), a huge or padded
record file is refused in one line before it is read, and text cells of the CSVs never start a formula."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time

import msgspec
import pytest
from synthetic_runs import OFF, ON1, ON2, main_plan, write_bfcl_run

from artifact.check.claims import FAIL
from artifact.cli import main
from artifact.config import REPO
from artifact.records import decoded
from artifact.records.store import REQUESTS, Run


def _check(root, capsys):
    code = main(["check", str(root)])
    err = capsys.readouterr().err.strip()
    out = root / "check" / "check.json"
    data = json.loads(out.read_text()) if out.exists() else None
    return code, err, data


def _plant(run: Run, edit) -> None:
    """A sidecar as earlier versions wrote it beside requests.jsonl (this reader's key, the file's sha256), its
    records edited on their own by `edit(records)`."""
    data = (run.path / REQUESTS).read_bytes()
    os.environ[decoded.ENV] = "0"
    try:
        plain = Run(run.path, dict(run.manifest))
        blob = decoded.encode(data, plain.complete, plain.requests, plain.top2_arrays())
    finally:
        os.environ.pop(decoded.ENV)
    copy = msgspec.msgpack.decode(blob, type=decoded.Copy)
    edit(copy.records)
    (run.path / decoded.LEGACY_NAME).write_bytes(msgspec.msgpack.encode(copy))


def _served_cached_tokens(run: Run) -> None:
    """The OFF run's second request served 7 cached tokens (what RQ1 must see)."""
    path = run.path / REQUESTS
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    recs[1].update(cache_n=7, prompt_n=93)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_a_planted_sidecar_never_turns_a_failing_rq1_into_a_pass(tmp_path, capsys):
    runs = main_plan(tmp_path, OFF, ON1, ON2)
    _served_cached_tokens(runs[0])
    _plant(runs[0], lambda recs: recs[1].update(cache_n=0, prompt_n=100))
    code, _, data = _check(tmp_path, capsys)
    claims = {c["id"]: c for c in data["claims"]}
    assert code == 1 and claims["RQ1"]["status"] == FAIL
    assert any("served cached tokens" in p for p in data["invalid"])


def test_the_verdicts_are_those_of_the_records_alone(tmp_path, capsys, monkeypatch):
    """Every run with an edited sidecar (outputs all equal: no divergence at all) is judged as without one."""
    plain_root, planted_root = tmp_path / "plain", tmp_path / "planted"
    main_plan(plain_root, OFF, ON1, ON2)
    runs = main_plan(planted_root, OFF, ON1, ON2)
    for run in runs:
        _plant(run, lambda recs: [r.update(output_tokens=[1] * len(r["output_tokens"])) for r in recs])
    monkeypatch.setenv(decoded.ENV, "0")
    _, _, plain = _check(plain_root, capsys)
    monkeypatch.delenv(decoded.ENV)
    _, _, planted = _check(planted_root, capsys)
    assert [c["status"] for c in planted["claims"]] == [c["status"] for c in plain["claims"]]
    assert [c["observed"] for c in planted["claims"]] == [c["observed"] for c in plain["claims"]]


def test_compare_tells_differing_records_apart_whatever_sidecar_lies_beside_them(tmp_path, capsys):
    a = write_bfcl_run(tmp_path / "a", "off", 1, OFF)
    b = write_bfcl_run(tmp_path / "b", "off", 1, {**OFF, "e1": [[1, 2, 3, 4, 6], [6, 7, 8]]})
    _plant(
        b,
        lambda recs: [
            r.update(output_tokens=[1, 2, 3, 4, 5]) for r in recs if r["episode_id"] == "e1" and r["request_index"] == 0
        ],
    )
    assert main(["compare", str(a.path), str(b.path)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT" in out and "0 of 1 compared run pair(s) identical" in out, out


# --- large and hostile inputs: a bound checked before reading -------------------------------------------------


@pytest.mark.parametrize("name", ["requests.jsonl", "episodes.jsonl", "manifest.json"])
def test_a_padded_record_file_is_refused_in_one_line_before_it_is_read(tmp_path, name):
    """A record file padded (sparse) to 2 GiB: exit 2 within seconds, one line naming the file and the bound, no
    traceback, under a 2 GiB address-space limit (it is never read into memory)."""
    runs = main_plan(tmp_path / "results", OFF, ON1, ON2)
    path = runs[1].path / name
    os.truncate(path, 2 << 30)
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31)); "
        "from artifact.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "ARTIFACT_CHECK_WORKER": "0"}
    t = time.monotonic()
    got = subprocess.run(
        [sys.executable, "-c", code, "check", str(tmp_path / "results"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert time.monotonic() - t < 60
    assert got.returncode == 2, got.stderr
    err = got.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and "MemoryError" not in err, err
    assert str(path) in err or str(tmp_path / "results") in err, err
    assert "refusing to read" in err or "more than" in err, err
    assert not (tmp_path / "out").exists()


def test_results_too_large_together_are_refused_before_any_is_read(tmp_path, capsys, monkeypatch):
    from artifact.check import run as check_run

    main_plan(tmp_path, OFF, ON1, ON2)
    monkeypatch.setattr(check_run, "MAX_RESULTS_BYTES", 1000)
    code, err, data = _check(tmp_path, capsys)
    assert code == 2 and data is None
    assert "more than the 1000" in err and "\n" not in err


# --- CSV cells that would start a formula ----------------------------------------------------------------------


def test_a_model_name_is_never_a_live_formula_in_a_csv(tmp_path, capsys):
    model = {
        "family": "testlm",
        "name": '=HYPERLINK("http://x.invalid","a")',
        "quant": "Q4_1",
        "sha256": "ab" * 32,
        "source": "path:x.gguf",
    }
    main_plan(tmp_path, OFF, ON1, ON2, model=model)
    _check(tmp_path, capsys)
    seen = 0
    for path in sorted((tmp_path / "check").glob("*.csv")):
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.reader(fh):
                for cell in row:
                    assert not cell.startswith(("=", "+", "@")), (path.name, cell)
                    if cell.startswith("-") and cell.strip("-"):
                        float(cell)  # a negative number stays a number (a lone "-" placeholder stays too)
                    seen += "HYPERLINK" in cell
    assert seen


# --- one admission gate: INVALID runs feed no analysis --------------------------------------------------------


def test_a_copied_run_drives_no_verdict_beyond_the_paper(tmp_path, capsys):
    """ON run 2 of a fresh-lifecycle plan copied from ON run 1 (both INVALID: not independent runs) would make the
    fresh-server reruns PASS (0 of 1 episodes diverge); admitted runs only: the verdict is NOT-RUN, and no table
    beyond the paper holds the plan."""
    eps = {"e0": [[1, 2], [3, 4]]}
    root = tmp_path / "res"
    main_plan(root, OFF, ON1, ON2)
    runs = [write_bfcl_run(root, "on", k, eps, plan="fresh", lifecycle="fresh") for k in (1, 2)]
    for name in ("requests.jsonl", "episodes.jsonl"):
        shutil.copy(runs[0].path / name, runs[1].path / name)
    code, _, data = _check(root, capsys)
    assert code == 1
    assert any("not independent runs" in p for p in data["invalid"])
    fresh = [v for v in data["beyond"]["verdicts"] if v["id"] == "BEYOND-FRESH"]
    assert [v["status"] for v in fresh] == ["NOT-RUN"]
    with (root / "check" / "benefit_runs.csv").open(newline="", encoding="utf-8") as fh:
        assert {row["plan"] for row in csv.DictReader(fh)} == {"main"}
