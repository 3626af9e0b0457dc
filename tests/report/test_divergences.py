"""The first divergences (artifact.report.divergences): their JSON laid out by msgspec's formatter is the text
json.dumps(..., indent=1) writes, on every committed evidence folder and on model text UTF-8 cannot encode; a margin
read from a run's parsed top-2 arrays is the one the decoded list gives, integer log-probabilities included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from artifact.report.divergences import _margin_at, indented
from artifact.report.example import top2_margin
from artifact.records.store import Run
from synthetic_runs import write_bfcl_run

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(REPO.glob("evidence/*/check/first-divergence.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.parent.name for p in COMMITTED])
def test_the_layout_is_json_dumps_indent_1_on_every_evidence_folder(path):
    text = path.read_text(encoding="utf-8")
    assert indented(json.loads(text)) + "\n" == text


def test_the_layout_of_text_utf8_cannot_encode_is_json_dumps_own():
    entries = [{"a": {"text": "x\ud800y", "n": 9.2e-05, "m": [], "o": {}}}]
    assert indented(entries) == json.dumps(entries, indent=1, ensure_ascii=False)


def test_a_margin_from_the_arrays_is_the_decoded_list_s(tmp_path):
    episodes = {"e0": [[1, 2, 3]], "e1": [[4, 5]]}
    logprobs = {
        ("e0", 0): [[[1, -0.25], [7, -1.75]], [[2, -1.0], [8, -1.0]], [[3, -0.125], [9, -3.0]]],
        ("e1", 0): [[[4, -1], [6, -2]], [[5, -1], [6, -3]]],
    }  # integers: json reads ints
    run = write_bfcl_run(tmp_path, "off", 1, episodes, logprobs=logprobs)
    run = Run(run.path, run.manifest)
    for req in run.requests:
        decoded = Run(run.path, run.manifest).requests[run.requests.index(req)]
        for token in (None, 0, 1, 2, 5):
            want = top2_margin(decoded.get("top_logprobs") or [], token)
            got = _margin_at(run, req, token)
            assert json.dumps(got) == json.dumps(want)
