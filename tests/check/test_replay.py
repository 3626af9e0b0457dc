"""Replaying a check (artifact.check.replay): the same results, byte for byte, judged by the same checker give the
kept outputs, summary and exit code again, and timings.json says so; any change to a file under the results (same
size included), a file added, a link, the setting off, or an input error means the check runs (or none is kept)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from artifact.check import replay
from artifact.check.run import TIMINGS, run_check
from artifact.cli import main
from artifact.errors import ArtifactError
from artifact.records import decoded
from artifact.records.store import REQUESTS
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


def test_a_run_checked_on_its_own_is_not_kept(tmp_path, capsys):
    """Its server log would lie in its plan directory, above the results checked: outside what a replay hashes."""
    root = _results(tmp_path / "results")
    run_dir = next(root.rglob("manifest.json")).parent
    for _ in range(2):
        run_check(run_dir, tmp_path / "out", quiet=True)
        assert not _replayed(tmp_path / "out")
