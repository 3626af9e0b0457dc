"""Issue 39: check judges only what the primary records prove. Nothing else inside a results directory changes a
verdict (a planted `requests.decoded.msgpack`, the right sha256 and reader key, edited on its own)."""

from __future__ import annotations

import json
import os

import msgspec
from synthetic_runs import OFF, ON1, ON2, main_plan, write_bfcl_run

from artifact.check.claims import FAIL
from artifact.cli import main
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
    _plant(b, lambda recs: [r.update(output_tokens=[1, 2, 3, 4, 5]) for r in recs
                            if r["episode_id"] == "e1" and r["request_index"] == 0])
    assert main(["compare", str(a.path), str(b.path)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT" in out and "0 of 1 compared run pair(s) identical" in out, out
