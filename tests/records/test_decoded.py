"""The checker's own record cache (artifact.records.decoded): outside the results, written by check only
after a run's records are validated, keyed by the sha256 of requests.jsonl's bytes, the run's state and the reader;
the reader gives the same records, the same top-2 arrays and the same errors either way, and nothing inside a
results directory (a planted `requests.decoded.msgpack`, however well made) is ever read as records."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from artifact.check.load import check_records
from artifact.check.load import load_run as check_load
from artifact.errors import ArtifactError
from artifact.records import decoded
from artifact.records.store import REQUESTS, LazyRecord, Run, load_run
from synthetic_runs import write_bfcl_run


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test its own cache directory (outside the results it writes)."""
    monkeypatch.setenv(decoded.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(decoded.ENV, raising=False)


def _run(tmp_path, **kw):
    """A finished run (through the real RunWriter): texts holding ":" and non-ASCII, and a request with a
    position the engine gave no log-probabilities for."""
    episodes = {"e0": [[1, 2, 3], [4, 5]], "e1": [[6], [7, 8, 9, 10]], "e2": [[11, 12]]}
    logprobs = {("e2", 0): [[[11, -0.25], [3, -1.75]], None]}
    texts = {("e0", 0): "key: value", ("e1", 1): "caf\u00e9 \u2603: done"}
    return write_bfcl_run(tmp_path / "results", "off", 1, episodes, logprobs=logprobs, texts=texts, **kw)


def _state(run: Run) -> dict:
    """Everything a reader of the run sees of its requests: each record's type, fields (with their types), top-2
    text; the top-2 arrays (records by position in the run, counts, ids, log-probabilities)."""
    records, counts, ids, lps = run.top2_arrays()
    where = {id(r): i for i, r in enumerate(run.requests)}
    return {
        "records": [
            (type(r).__name__, [(k, type(v).__name__, v) for k, v in dict.items(r)], getattr(r, "_raw", None))
            for r in run.requests
        ],
        "top2": (
            [where[id(r)] for r in records],
            list(counts),
            ids.tolist(),
            lps.tolist(),
            str(ids.dtype),
            str(lps.dtype),
        ),
    }


def _fresh(run: Run) -> Run:
    return Run(run.path, dict(run.manifest))


def _read(run: Run) -> Run:
    """The run as check reads it: its records, validated (`check_records`)."""
    read = _fresh(run)
    check_records(read)
    return read


def _plain(run: Run, monkeypatch) -> Run:
    """The run as check reads it from requests.jsonl alone (cache off)."""
    with monkeypatch.context() as m:
        m.setenv(decoded.ENV, "0")
        return _read(run)


def _entries(tmp_path) -> list:
    return sorted((tmp_path / "cache").rglob("*.msgpack"))


def test_the_writer_writes_nothing_but_the_records(tmp_path):
    run = _run(tmp_path)
    assert sorted(p.name for p in run.path.iterdir()) == ["episodes.jsonl", "manifest.json", "requests.jsonl"]
    assert not _entries(tmp_path)


def test_check_caches_a_validated_run_outside_the_results_and_reads_it_as_its_records(tmp_path, monkeypatch):
    run = _run(tmp_path)
    first = check_load(run.path, run.manifest)
    assert first[3] == "written"
    [entry] = _entries(tmp_path)
    assert tmp_path / "results" not in entry.parents
    assert entry.name.startswith(decoded.digest((run.path / REQUESTS).read_bytes()))
    assert check_load(run.path, run.manifest)[3] == "read"
    cached = _read(run)
    assert cached._validated
    plain = _plain(run, monkeypatch)
    assert not plain._validated
    assert _state(cached) == _state(plain)
    assert all(type(r) is LazyRecord for r in cached.requests)
    assert [r["top_logprobs"] for r in cached.requests] == [r["top_logprobs"] for r in plain.requests]


def test_the_cache_holds_the_records_as_validation_left_them(tmp_path, monkeypatch):
    """A record whose top_logprobs are not a top-2 list at every position (here: top-3) is decoded and judged by
    the rule itself while validating: the entry holds it decoded, as a reader that validated the file holds it."""
    episodes = {"e0": [[5, 6]], "e1": [[7]]}
    top3 = {("e0", 0): [[[5, -0.5], [9, -1.5], [2, -3.0]], [[6, -0.2], [2, -2.5], [3, -4.0]]]}
    run = write_bfcl_run(tmp_path / "results", "off", 1, episodes, logprobs=top3)
    assert check_load(run.path, run.manifest)[3] == "written"
    validated = _plain(run, monkeypatch)
    cached = _fresh(run)
    cached.requests
    assert cached._validated
    assert dict.__contains__(cached.requests[0], "top_logprobs")
    assert _state(cached) == _state(validated)


@pytest.mark.parametrize("change", ["edited", "other-reader", "other-state", "not-an-entry", "cut-short", "empty"])
def test_an_entry_not_made_from_these_bytes_by_this_reader_is_not_read(tmp_path, monkeypatch, change):
    run = _run(tmp_path)
    check_load(run.path, run.manifest)
    [entry] = _entries(tmp_path)
    path = run.path / REQUESTS
    if change == "edited":  # a value changed after the entry was made: the file is what counts
        path.write_text(path.read_text().replace('"key: value"', '"key: other"', 1))
    elif change == "other-reader":
        monkeypatch.setattr(decoded, "reader_key", lambda: "another reader")
    elif change == "other-state":
        manifest = json.loads((run.path / "manifest.json").read_text())
        manifest["status"] = "incomplete"
        run = Run(run.path, manifest)
    elif change == "not-an-entry":
        entry.write_bytes(b"\x93\x01\x02")
    elif change == "cut-short":
        entry.write_bytes(entry.read_bytes()[:-100])
    else:
        entry.write_bytes(b"")
    read = _read(run)
    assert not read._validated
    if change == "edited":
        assert read.requests[0]["output_text"] == "key: other"
    assert _state(read) == _state(_plain(run, monkeypatch))


def test_a_run_that_breaks_a_rule_is_never_cached_and_gives_the_same_error(tmp_path, monkeypatch):
    run = _run(tmp_path)
    path = run.path / REQUESTS
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"output_tokens": [4, 5]', '"output_tokens": [4, 5, 6]', 1)  # 3 tokens, 2 positions
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ArtifactError) as cached:
        check_load(run.path, run.manifest)
    assert not _entries(tmp_path)
    with pytest.raises(ArtifactError) as plain, monkeypatch.context() as m:
        m.setenv(decoded.ENV, "0")
        check_load(run.path, run.manifest)
    assert str(cached.value) == str(plain.value)
    assert "requests.jsonl:2" in str(plain.value)


def test_an_entry_that_is_a_link_is_not_read(tmp_path):
    run = _run(tmp_path)
    check_load(run.path, run.manifest)
    [entry] = _entries(tmp_path)
    entry.rename(tmp_path / "elsewhere")
    entry.symlink_to(tmp_path / "elsewhere")
    assert not _read(run)._validated


def test_an_interrupted_run_is_read_from_its_file(tmp_path):
    run = write_bfcl_run(tmp_path / "results", "off", 1, {"e0": [[1]]}, complete=False)
    assert load_run(run.path).requests[0]["output_tokens"] == [1]


def test_the_entry_s_arrays_are_the_parsed_numbers(tmp_path):
    run = _run(tmp_path)
    check_load(run.path, run.manifest)
    cached = _fresh(run)
    records, counts, ids, lps = cached.top2_arrays()
    assert cached._validated
    assert ids.dtype == np.int64 and lps.dtype == np.float64 and ids.shape == lps.shape == (sum(counts), 2)
    assert ids.flags.writeable and lps.flags.writeable
    assert lps[-1].tolist() == [-0.1, -2.5]


def test_a_sidecar_planted_in_the_results_is_never_read(tmp_path, monkeypatch):
    """A `requests.decoded.msgpack` beside requests.jsonl, made as earlier versions made it (the right
    sha256 and reader key) and then edited on its own, is ignored: the records are requests.jsonl's."""
    run = _run(tmp_path)
    data = (run.path / REQUESTS).read_bytes()
    plain = _plain(run, monkeypatch)
    blob = decoded.encode(data, True, plain.requests, plain.top2_arrays())
    forged = msgspec.msgpack.decode(blob, type=decoded.Copy)
    forged.records[0]["output_text"] = "forged"
    (run.path / decoded.LEGACY_NAME).write_bytes(msgspec.msgpack.encode(forged))
    read = _read(run)
    assert not read._validated and read.requests[0]["output_text"] == "key: value"


def test_the_cache_off_reads_and_writes_nothing(tmp_path, monkeypatch):
    run = _run(tmp_path)
    check_load(run.path, run.manifest)
    monkeypatch.setenv(decoded.ENV, "0")
    assert not _read(run)._validated
    (tmp_path / "cache").rename(tmp_path / "old")
    assert check_load(run.path, run.manifest)[3] == "none"
    assert not (tmp_path / "cache").exists()


def test_a_failure_to_cache_never_fails_the_check(tmp_path, monkeypatch, capsys):
    """The cache is a shortcut: where making an entry fails unexpectedly the run is still read and validated, and a
    one-line warning says so."""

    def broken(*args):
        raise TypeError("boom")

    monkeypatch.setattr(decoded, "encode", broken)
    run = _run(tmp_path)
    got = check_load(run.path, run.manifest)
    assert got[3] == "none" and len(got[0]) == 5
    assert "not cached (TypeError: boom)" in capsys.readouterr().err


def test_an_unwritable_cache_never_fails_the_check(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file, not a folder")
    run = _run(tmp_path)
    got = check_load(run.path, run.manifest)
    assert got[3] == "none" and len(got[0]) == 5


def test_a_reader_without_a_library_s_distribution_reads_the_file(tmp_path, monkeypatch):
    """The reader's key names the decoding libraries' versions; where one is not installed as a distribution the key
    is another (no entry matches it) and the reader decodes requests.jsonl, never fails."""
    run = _run(tmp_path)
    check_load(run.path, run.manifest)

    def missing(name):
        raise decoded.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(decoded.metadata, "version", missing)
    decoded.reader_key.cache_clear()
    try:
        read = _read(run)
        assert not read._validated and len(read.requests) == 5
    finally:
        decoded.reader_key.cache_clear()


def test_the_cache_keeps_to_its_bound_and_drops_the_least_recently_used_entry(tmp_path, monkeypatch):
    """When a process first writes, entries go, least recently used first (a read renews one), until the cache
    holds at most ARTIFACT_RECORD_CACHE_MIB; the entry just written stays; the runs read the same either way."""
    import os

    runs = [
        write_bfcl_run(tmp_path / f"results{i}", "off", 1, {"e0": [[i + 1, 2, 3]], "e1": [[4 + i]]}) for i in range(4)
    ]
    for i, run in enumerate(runs[:3]):
        monkeypatch.setattr(decoded, "_pruned", False)
        assert check_load(run.path, run.manifest)[3] == "written"
        for entry in _entries(tmp_path):  # an hour apart, oldest first: run 0, 1, 2
            if entry.stat().st_mtime_ns > 10**9 * 10**9:
                os.utime(entry, (1_000_000 + 3600 * i, 1_000_000 + 3600 * i))
    assert check_load(runs[0].path, runs[0].manifest)[3] == "read"  # run 0 used again: now the newest
    size = max(e.stat().st_size for e in _entries(tmp_path))
    monkeypatch.setenv(decoded.MAX_ENV, str(3.5 * size / (1 << 20)))
    monkeypatch.setattr(decoded, "_pruned", False)
    assert check_load(runs[3].path, runs[3].manifest)[3] == "written"
    left = {e.name.split("-")[0] for e in _entries(tmp_path)}
    digests = [decoded.digest((r.path / REQUESTS).read_bytes()) for r in runs]
    assert left == {digests[0], digests[2], digests[3]}  # run 1, the least recently used, went
    assert check_load(runs[1].path, runs[1].manifest)[3] == "written"  # and is read from its file again


@pytest.mark.parametrize("value", ["lots", "inf", "-inf", "nan", "-1", "1e400", "0x10"])
def test_a_bound_that_is_no_finite_size_is_a_one_line_error_and_pruning_never_fails(tmp_path, monkeypatch, value):
    monkeypatch.setenv(decoded.MAX_ENV, value)
    with pytest.raises(ArtifactError, match=f"{decoded.MAX_ENV}=.*must be a number of MiB from 0 to"):
        decoded.bound()
    assert decoded.prune() == 0  # never raises: check said it before it read anything
    for fine, size in (("", decoded.DEFAULT_MAX_MIB << 20), (" 0 ", 0), ("1.5", 3 << 19)):
        monkeypatch.setenv(decoded.MAX_ENV, fine)
        assert decoded.bound() == size
    monkeypatch.setenv(decoded.DIR_ENV, str(tmp_path / "not-there"))
    assert decoded.prune() == 0
