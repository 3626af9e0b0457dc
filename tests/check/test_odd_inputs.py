"""Odd paths, names and settings handed to `./run.sh check`, around a copy of committed evidence (evidence/cpu-endpoint,
exit 0: the control): each ends in the true verdicts, or in one line and exit 2 decided before any output is
published; check.json's exit code is always the process's, and nothing prints a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from artifact.cli import main
from artifact.config import REPO
from artifact.records import decoded
from artifact.records.listing import MAX_DEPTH


@pytest.fixture(autouse=True)
def _as_a_user_checks(tmp_path, monkeypatch):
    """Replays on (a user's default), in a cache of the test's own."""
    monkeypatch.setenv(decoded.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(decoded.ENV, raising=False)
    monkeypatch.setenv("ARTIFACT_CHECK_REPLAY", "1")


def check(capsys, *args: str) -> tuple[int, str, str, dict | None]:
    """Exit code, stdout, stderr, and check.json where one was published (under --out, else RESULTS/check)."""
    code = main(["check", *args])
    got = capsys.readouterr()
    out = args[args.index("--out") + 1] if "--out" in args else os.path.join(args[0], "check")
    path = os.path.join(out, "check.json")
    data = json.loads(open(path, encoding="utf-8").read()) if os.path.isfile(path) else None
    assert "Traceback" not in got.err
    if data is not None:
        assert data["exit_code"] == code, (code, got.err)  # what check.json says is what the process returns
    return code, got.out, got.err, data


def one_line_error(got: tuple, *needles: str) -> None:
    code, _, err, data = got
    assert code == 2 and data is None, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_the_control_passes(results, capsys):
    code, out, _, data = check(capsys, str(results))
    assert code == 0 and data["exit_code"] == 0 and "exit code 0" in out


def _loop(tmp_path):
    a, b = tmp_path / "loop-a", tmp_path / "loop-b"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def test_a_results_path_that_is_a_loop_of_links_is_one_line(tmp_path, capsys):
    one_line_error(check(capsys, str(_loop(tmp_path))), "Too many levels of symbolic links")


@pytest.mark.parametrize("where", ["loop", "under the loop", "a link to a folder"])
def test_an_out_path_that_is_a_loop_or_a_link_is_one_line_before_anything_is_written(results, tmp_path, capsys, where):
    loop = _loop(tmp_path)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    out = {"loop": loop, "under the loop": loop / "out", "a link to a folder": tmp_path / "link"}[where]
    one_line_error(check(capsys, str(results), "--out", str(out)), "cannot write the check outputs to")
    assert list(real.iterdir()) == [] and not (results / "check").exists()


def test_names_that_are_not_utf8_get_the_true_verdicts(results, tmp_path, capsys):
    """A run folder, a stray file and the output folder named in bytes that are not UTF-8: the verdicts of the
    records, printed with the names escaped; check.json says the exit code the process returns."""
    run = next(results.rglob("off-run2"))
    os.rename(os.fsencode(run), os.fsencode(run.parent) + b"/off-\xffrun2")
    (results / os.fsdecode(b"notes-\xfe.txt")).write_text("x")
    out = tmp_path / os.fsdecode(b"out-\xff")
    code, printed, err, data = check(capsys, str(results), "--out", str(out))
    assert code == 0 and data["runs"] == 4, err
    assert "\\udcff" in printed  # the name, escaped


def test_a_name_with_a_line_break_keeps_the_error_on_one_line(results, tmp_path, capsys):
    odd = tmp_path / "two\nlines"
    odd.mkdir()
    (odd / "file").write_text("not a folder of runs")
    one_line_error(check(capsys, str(odd / "file")), "is not a directory", "two\\nlines")


def test_folders_nested_very_deep_are_one_line_before_anything_is_read(results, capsys):
    """1,500 folders deep (deeper than a path may name, deeper than a recursive walk may go)."""
    depth, here = 1500, os.getcwd()
    try:
        os.chdir(results)
        for _ in range(depth):
            os.mkdir("d")
            os.chdir("d")
        one_line_error(check(capsys, str(results)), f"folders nest more than {MAX_DEPTH} deep")
    finally:
        for _ in range(depth):  # removed from the bottom up (a recursive removal would not reach it)
            os.chdir("..")
            os.rmdir("d")
        os.chdir(here)


def test_deep_but_bounded_folders_are_read(results, capsys):
    deep = results.joinpath(*["d"] * (MAX_DEPTH - 1))
    deep.mkdir(parents=True)
    (deep / "note.txt").write_text("x")
    assert check(capsys, str(results))[0] == 0


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "lots", "-5", "1e999"])
def test_a_cache_bound_that_is_no_size_is_one_line_before_any_output(results, capsys, monkeypatch, value):
    monkeypatch.setenv(decoded.MAX_ENV, value)
    one_line_error(check(capsys, str(results)), f"{decoded.MAX_ENV}={value!r}")
    assert not (results / "check").exists()


@pytest.mark.parametrize("value", ["", "0", "0.5", "4096"])
def test_a_cache_bound_that_is_a_size_gets_the_true_verdicts(results, capsys, monkeypatch, value):
    monkeypatch.setenv(decoded.MAX_ENV, value)
    for _ in range(2):
        assert check(capsys, str(results))[0] == 0


def test_the_exit_status_of_the_process_is_check_jsons_with_names_not_utf8_and_a_closed_output(results, tmp_path):
    """As a user's shell sees it: a separate process whose summary goes to a pipe closed early (`| head -1`), in a
    C locale, with an output folder named in bytes that are not UTF-8."""
    out = os.fsencode(tmp_path) + b"/out-\xff"
    env = {**os.environ, "LC_ALL": "C", "PYTHONIOENCODING": "ascii", "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        [sys.executable, "-m", "artifact", "check", os.fsencode(results), "--out", out],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    p.stdout.readline()
    p.stdout.close()  # the reader went away
    err = p.stderr.read().decode(errors="replace")
    code = p.wait(timeout=300)
    assert "Traceback" not in err, err
    data = json.loads((tmp_path / os.fsdecode(b"out-\xff") / "check.json").read_text())
    assert code == data["exit_code"] == 0, err
