"""Replaying a check (artifact.check.replay): the same results, byte for byte, judged by the same checker give the
kept outputs, summary and exit code again, and timings.json says so; any change to a file under the results (same
size included), a file added, a link, the setting off, or an input error means the check runs (or none is kept)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import pytest

from artifact.check import replay
from artifact.check.run import TIMINGS, run_check
from artifact.cli import main
from artifact.errors import ArtifactError
from artifact.records import decoded
from artifact.records.listing import entries
from artifact.records.store import RECORD_FILES, REQUESTS, find_runs, write_json_atomic
from evidence_sets import runs, unpack
from synthetic_runs import OFF, ON1, ON2, main_plan


@pytest.fixture(autouse=True)
def _replays_on(tmp_path, monkeypatch):
    monkeypatch.setenv(decoded.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(decoded.ENV, raising=False)
    monkeypatch.delenv(replay.ENV, raising=False)


def _outputs(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != TIMINGS}


def _replayed(out) -> bool:
    return replay.REPLAYED in json.loads((out / TIMINGS).read_text())


def _results(root):
    main_plan(root, OFF, ON1, ON2)
    return root


def _check(root, capsys) -> tuple[int, str]:
    code = main(["check", str(root)])
    return code, capsys.readouterr().out


def test_the_same_results_are_replayed_byte_for_byte(tmp_path, capsys):
    root = _results(tmp_path / "results")
    code, printed = _check(root, capsys)
    first = _outputs(root / "check")
    assert not _replayed(root / "check")
    again, printed_again = _check(root, capsys)
    assert _replayed(root / "check")
    assert again == code and _outputs(root / "check") == first
    assert printed_again.startswith(printed.rstrip("\n")) and "replayed" in printed_again.splitlines()[-1]
    assert not list(root.rglob("*.msgpack"))  # the entry is the checker's own, outside the results
    assert list((tmp_path / "cache" / replay.SUBDIR).glob("*.msgpack"))


def _flip_a_byte(path):
    """The same size, the records still valid: the first request's first token 1 made 7 (its top-2 entry too)."""
    data = path.read_bytes()
    edited = data.replace(b'"output_tokens": [1, ', b'"output_tokens": [7, ', 1).replace(
        b'"top_logprobs": [[[1, ', b'"top_logprobs": [[[7, ', 1
    )
    assert edited != data and len(edited) == len(data)
    path.write_bytes(edited)


def test_a_changed_byte_a_new_file_or_the_setting_off_runs_the_check(tmp_path, capsys, monkeypatch):
    root = _results(tmp_path / "results")
    _check(root, capsys)
    _check(root, capsys)
    assert _replayed(root / "check")
    requests = next(root.rglob(REQUESTS))
    size = requests.stat().st_size
    _flip_a_byte(requests)
    assert requests.stat().st_size == size
    _check(root, capsys)
    assert not _replayed(root / "check")
    _check(root, capsys)
    assert _replayed(root / "check")  # the changed results, kept in their turn
    (root / "notes.txt").write_text("a file check does not read")
    _check(root, capsys)
    assert not _replayed(root / "check")
    monkeypatch.setenv(replay.ENV, "0")
    _check(root, capsys)
    assert not _replayed(root / "check")
    monkeypatch.delenv(replay.ENV)
    monkeypatch.setenv(decoded.ENV, "0")  # the checker's whole cache off
    _check(root, capsys)
    assert not _replayed(root / "check")


def test_a_replay_gives_the_verdicts_of_the_bytes_not_of_an_earlier_check(tmp_path, capsys):
    """An OFF rerun edited to differ (same size) must FAIL RQ1 although a check of the clean results was kept."""
    root = _results(tmp_path / "results")
    clean, _ = _check(root, capsys)
    off2 = next(p for p in root.rglob(REQUESTS) if p.parent.name == "off-run2")
    _flip_a_byte(off2)
    edited, printed = _check(root, capsys)
    assert not _replayed(root / "check")
    assert (clean, edited) == (0, 1)
    assert json.loads((root / "check" / "check.json").read_text())["hard_failures"] == ["RQ1"]


def test_links_and_input_errors_are_never_kept(tmp_path, capsys):
    root = _results(tmp_path / "results")
    (tmp_path / "note.txt").write_text("outside the results")
    (root / "note.txt").symlink_to(tmp_path / "note.txt")  # what it names may change: never hashed, never replayed
    assert _check(root, capsys)[0] == 0
    _check(root, capsys)
    assert not _replayed(root / "check")
    os.unlink(root / "note.txt")
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
    bad = next(root.rglob("manifest.json"))
    bad.write_text("{not json")
    for _ in range(2):
        with pytest.raises(ArtifactError):
            run_check(root, quiet=True)
    assert not list((tmp_path / "cache").rglob("*.msgpack")) if (tmp_path / "cache").exists() else True


def test_another_output_folder_or_expectations_file_is_another_check(tmp_path, capsys):
    root = _results(tmp_path / "results")
    run_check(root, tmp_path / "a", quiet=True)
    run_check(root, tmp_path / "b", quiet=True)
    assert not _replayed(tmp_path / "b")
    run_check(root, tmp_path / "b", quiet=True)
    assert _replayed(tmp_path / "b")
    assert _outputs(tmp_path / "a") == _outputs(tmp_path / "b")


def test_a_run_checked_on_its_own_is_not_kept_where_its_server_log_lies_above_it(tmp_path, capsys):
    """The server log a manifest names lies in the run's plan directory, above a run directory checked on its own:
    outside what a replay hashes, whether the log is there yet or not (one put there later is read)."""
    root = _results(tmp_path / "results")
    run_dir = next(root.rglob("manifest.json")).parent
    mf = run_dir / "manifest.json"
    mf.write_text(json.dumps({**json.loads(mf.read_text()), "server_log": "logs/server-off.log"}))
    for _ in range(2):
        run_check(run_dir, tmp_path / "out", quiet=True)
        assert not _replayed(tmp_path / "out")
    for _ in range(2):  # the whole results hold the log's place: kept, and replayed
        run_check(root, tmp_path / "all", quiet=True)
    assert _replayed(tmp_path / "all")


# --- what the key holds is what the run finder reads: tampered copies of committed evidence ---------------------


def _flip_first_token(run_dir):
    """The run's first generated token made another of the same width (its top-2 entry with it): the same size,
    valid records, an OFF rerun that now diverges."""
    path = run_dir / REQUESTS
    data = path.read_bytes()
    first = json.loads(data.split(b"\n", 1)[0])["output_tokens"][0]
    other = first + 1 if len(str(first + 1)) == len(str(first)) else first - 1
    edited = data.replace(f'"output_tokens": [{first}, '.encode(), f'"output_tokens": [{other}, '.encode(), 1)
    edited = edited.replace(f'"top_logprobs": [[[{first}, '.encode(), f'"top_logprobs": [[[{other}, '.encode(), 1)
    assert edited != data and len(edited) == len(data)
    path.write_bytes(edited)


@pytest.mark.parametrize("folder", ["", ".check.new-x1y2", ".check.old-x1y2/check", "check-notes"])
def test_an_edit_of_runs_in_any_folder_the_finder_reads_runs_the_check(tmp_path, capsys, folder):
    """evidence/cpu-endpoint's runs kept under the results in a folder named like check's own staging folders (the
    control: in no such folder): checked, replayed; then its OFF run 2 edited to diverge (same size) must be
    checked again and FAIL RQ1, never replayed as the earlier PASS."""
    root = tmp_path / "results"
    unpack("cpu-endpoint", tmp_path / "unpacked")
    shutil.copytree(tmp_path / "unpacked" / "results", root / folder)
    assert _check(root, capsys)[0] == 0
    assert _check(root, capsys)[0] == 0 and _replayed(root / "check")  # the control: the same bytes replay
    _flip_first_token(runs(root)["off-run2"])
    code, printed = _check(root, capsys)
    assert not _replayed(root / "check") and "replayed" not in printed
    assert code == 1 and json.loads((root / "check" / "check.json").read_text())["hard_failures"] == ["RQ1"]


def test_the_replay_key_lists_what_the_run_finder_reads(tmp_path):
    """One listing: every folder the finder reads a run from is in the key's listing, a staging-like name included;
    only the check's own output folder is left out of both."""
    root = tmp_path / "results"
    unpack("cpu-endpoint", tmp_path / "unpacked")
    shutil.copytree(tmp_path / "unpacked" / "results", root / ".check.new-abc")
    out = root / "check"
    listed = entries(root, skip=out)
    files = {e.rel for e in listed if e.kind == "f"}
    found = find_runs(root, skip=out)
    assert len(found) == 4
    for run in found:
        for name in RECORD_FILES:
            if (run.path / name).exists():
                assert str((run.path / name).relative_to(root)) in files
    (out / "sub").mkdir(parents=True)  # inside the output folder: neither reads it
    write_json_atomic(out / "sub" / "manifest.json", {})
    assert entries(root, skip=out) == listed and len(find_runs(root, skip=out)) == 4


def _sparse(path, size):
    with open(path, "wb") as fh:
        fh.truncate(size)


def test_a_large_file_is_hashed_in_bounded_memory_and_once_per_content(tmp_path, monkeypatch):
    """A 256 MiB file (weights left in a results folder) costs no more than a chunk of memory to hash, and its
    sha256 is kept by the file's identity: hashed again only once it changed."""
    import tracemalloc

    root = tmp_path / "results"
    root.mkdir()
    big = root / "weights.gguf"
    _sparse(big, 256 << 20)
    time.sleep(0.3)  # its times lie before the hashing: a digest kept by them is not racily clean
    reads = []
    stream = replay._stream
    monkeypatch.setattr(replay, "_stream", lambda fd: reads.append(fd) or stream(fd))
    tracemalloc.start()
    first = replay.digests(root, entries(root))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert first == [("weights.gguf", hashlib.sha256(bytes(256 << 20)).hexdigest())] and len(reads) == 1
    assert peak < 16 << 20, peak
    assert replay.digests(root, entries(root)) == first and len(reads) == 1  # not read again
    with open(big, "r+b") as fh:  # one byte changed, the same size: read again
        fh.write(b"x")
    again = replay.digests(root, entries(root))
    assert again != first and len(reads) == 2


def test_a_large_stray_file_leaves_the_check_whole_and_is_replayed(tmp_path, capsys):
    """The same with a whole check: its exit code is check.json's, the second check is replayed."""
    root = tmp_path / "results"
    unpack("cpu-endpoint", tmp_path / "unpacked")
    shutil.copytree(tmp_path / "unpacked" / "results", root)
    _sparse(root / "model.gguf", 256 << 20)
    code, _ = _check(root, capsys)
    assert code == 0 == json.loads((root / "check" / "check.json").read_text())["exit_code"]
    assert _check(root, capsys)[0] == 0 and _replayed(root / "check")
