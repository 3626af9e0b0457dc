"""A run's decoded copy (artifact.records.decoded, `requests.decoded.msgpack`): written when the run finishes, read
instead of requests.jsonl only where it was made from the file's bytes as they are, for the run in its state, by
this reader; the reader gives the same records, the same top-2 arrays and the same errors either way."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from artifact.check.load import check_records
from artifact.check.load import load_run as check_load
from artifact.errors import ArtifactError
from artifact.records import decoded
from artifact.records.store import REQUESTS, LazyRecord, Run, load_run, write_decoded
from synthetic_runs import write_bfcl_run


def _run(tmp_path, **kw):
    """A finished run (through the real RunWriter): texts holding ":" and non-ASCII, and a request with a
    position the engine gave no log-probabilities for."""
    episodes = {"e0": [[1, 2, 3], [4, 5]], "e1": [[6], [7, 8, 9, 10]], "e2": [[11, 12]]}
    logprobs = {("e2", 0): [[[11, -0.25], [3, -1.75]], None]}
    texts = {("e0", 0): "key: value", ("e1", 1): "caf\u00e9 \u2603: done"}
    return write_bfcl_run(tmp_path, "off", 1, episodes, logprobs=logprobs, texts=texts, **kw)


def _state(run: Run) -> dict:
    """Everything a reader of the run sees of its requests: each record's type, fields (with their types), top-2
    text; the top-2 arrays (records by position in the run, counts, ids, log-probabilities)."""
    records, counts, ids, lps = run.top2_arrays()
    where = {id(r): i for i, r in enumerate(run.requests)}
    return {
        "records": [(type(r).__name__, [(k, type(v).__name__, v) for k, v in dict.items(r)], getattr(r, "_raw", None))
                    for r in run.requests],
        "top2": ([where[id(r)] for r in records], list(counts), ids.tolist(), lps.tolist(), str(ids.dtype),
                 str(lps.dtype)),
    }


def _fresh(run: Run) -> Run:
    return Run(run.path, dict(run.manifest))


def _read(run: Run) -> Run:
    """The run as check reads it: its records, validated (`check_records`)."""
    read = _fresh(run)
    check_records(read)
    return read


def _without_copy(run: Run) -> Run:
    """The run as check reads it from requests.jsonl alone."""
    (run.path / decoded.NAME).rename(run.path / "aside")
    try:
        return _read(run)
    finally:
        (run.path / "aside").rename(run.path / decoded.NAME)


def test_a_finished_run_s_copy_reads_as_its_records_do(tmp_path):
    run = _run(tmp_path)
    assert (run.path / decoded.NAME).is_file()
    copied = _read(run)
    assert copied._validated
    plain = _without_copy(run)
    assert not plain._validated
    assert _state(copied) == _state(plain)
    assert all(type(r) is LazyRecord for r in copied.requests)
    # the top_logprobs kept as text decode as the file's do
    assert [r["top_logprobs"] for r in copied.requests] == [r["top_logprobs"] for r in plain.requests]
    # check's loader (the worker's job) gives the same either way
    a, b = check_load(run.path, run.manifest), check_load(run.path, run.manifest)
    assert len(a[0]) == len(b[0]) == len(plain.requests)


def test_the_copy_holds_the_records_as_validation_left_them(tmp_path):
    """A record whose top_logprobs are not a top-2 list at every position (here: top-3) is decoded and judged by
    the rule itself while validating: the copy holds it decoded, as a reader that validated the file holds it."""
    episodes = {"e0": [[5, 6]], "e1": [[7]]}
    top3 = {("e0", 0): [[[5, -0.5], [9, -1.5], [2, -3.0]], [[6, -0.2], [2, -2.5], [3, -4.0]]]}
    run = write_bfcl_run(tmp_path, "off", 1, episodes, logprobs=top3)
    validated = _without_copy(run)
    copied = _fresh(run)
    copied.requests
    assert copied._validated
    assert dict.__contains__(copied.requests[0], "top_logprobs")  # decoded in the copy, as validation left it
    assert _state(copied) == _state(validated)


@pytest.mark.parametrize("change", ["edited", "other-reader", "other-state", "not-a-copy", "cut-short", "empty"])
def test_a_copy_not_made_from_these_bytes_by_this_reader_is_not_read(tmp_path, monkeypatch, change):
    run = _run(tmp_path)
    copy = run.path / decoded.NAME
    path = run.path / REQUESTS
    if change == "edited":  # a value changed after the copy was made: the file is what counts
        path.write_text(path.read_text().replace('"key: value"', '"key: other"', 1))
    elif change == "other-reader":
        monkeypatch.setattr(decoded, "reader_key", lambda: "another reader")
    elif change == "other-state":
        manifest = json.loads((run.path / "manifest.json").read_text())
        manifest["status"] = "incomplete"
        run = Run(run.path, manifest)
    elif change == "not-a-copy":
        copy.write_bytes(b"\x93\x01\x02")
    elif change == "cut-short":
        copy.write_bytes(copy.read_bytes()[:-100])
    else:
        copy.write_bytes(b"")
    read = _read(run)
    assert not read._validated
    if change == "edited":
        assert read.requests[0]["output_text"] == "key: other"
    assert _state(read) == _state(_without_copy(run))


def test_a_run_that_breaks_a_rule_gets_no_copy_and_the_same_error(tmp_path):
    run = _run(tmp_path)
    path = run.path / REQUESTS
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"output_tokens": [4, 5]', '"output_tokens": [4, 5, 6]', 1)  # 3 tokens, 2 positions
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ArtifactError) as with_stale_copy:
        check_load(run.path, run.manifest)
    (run.path / decoded.NAME).unlink()
    assert not write_decoded(_fresh(run))
    assert not (run.path / decoded.NAME).exists()
    with pytest.raises(ArtifactError) as without:
        check_load(run.path, run.manifest)
    assert str(with_stale_copy.value) == str(without.value)
    assert "requests.jsonl:2" in str(without.value)


def test_a_copy_that_is_a_link_is_not_read(tmp_path):
    run = _run(tmp_path)
    copy = run.path / decoded.NAME
    copy.rename(tmp_path / "elsewhere")
    copy.symlink_to(tmp_path / "elsewhere")
    read = _read(run)
    assert not read._validated


def test_an_interrupted_run_gets_no_copy(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, {"e0": [[1]]}, complete=False)
    assert not (run.path / decoded.NAME).exists()
    assert load_run(run.path).requests[0]["output_tokens"] == [1]


def test_the_copy_s_arrays_are_the_parsed_numbers(tmp_path):
    run = _run(tmp_path)
    copied = _fresh(run)
    records, counts, ids, lps = copied.top2_arrays()
    assert ids.dtype == np.int64 and lps.dtype == np.float64 and ids.shape == lps.shape == (sum(counts), 2)
    assert ids.flags.writeable and lps.flags.writeable
    assert lps[-1].tolist() == [-0.1, -2.5]


def test_a_copy_edited_on_its_own_is_read_unless_copies_are_turned_off(tmp_path, monkeypatch):
    """The copy is trusted as the file it was made from (the limit docs/admission.md's tampering table states): records
    changed in the copy alone, its sha256 kept, are what a reader gets; with ARTIFACT_RECORD_COPIES=0 (results from
    elsewhere) requests.jsonl is decoded whatever copy lies beside it."""
    run = _run(tmp_path)
    copy = run.path / decoded.NAME
    forged = msgspec.msgpack.decode(copy.read_bytes(), type=decoded.Copy)
    forged.records[0]["output_text"] = "forged"
    copy.write_bytes(msgspec.msgpack.encode(forged))
    assert _read(run).requests[0]["output_text"] == "forged"
    monkeypatch.setenv(decoded.ENV, "0")
    read = _read(run)
    assert not read._validated and read.requests[0]["output_text"] == "key: value"


def test_a_failure_to_make_the_copy_never_fails_the_run(tmp_path, monkeypatch, capsys):
    """The copy is a shortcut: where making it fails unexpectedly the run still finishes (complete, its records
    whole), without a copy, and a one-line warning says so."""
    def broken(*args):
        raise TypeError("boom")

    monkeypatch.setattr(decoded, "encode", broken)
    run = _run(tmp_path)
    assert run.complete and not (run.path / decoded.NAME).exists()
    assert "warning: no decoded copy of" in capsys.readouterr().err
    assert len(_read(run).requests) == 5


def test_a_reader_without_a_library_s_distribution_reads_the_file(tmp_path, monkeypatch):
    """The reader's key names the decoding libraries' versions; where one is not installed as a distribution the key
    is another (no copy matches it) and the reader decodes requests.jsonl, never fails."""
    run = _run(tmp_path)

    def missing(name):
        raise decoded.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(decoded.metadata, "version", missing)
    decoded.reader_key.cache_clear()
    try:
        read = _read(run)
        assert not read._validated and len(read.requests) == 5
    finally:
        decoded.reader_key.cache_clear()
