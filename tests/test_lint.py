"""The code passes the linter and the formatter's check configured in pyproject.toml ([tool.ruff]), and the type
checker configured there ([tool.mypy]: strict on the records, the checker and the engine and workload interfaces), and
every `# noqa` and `# type: ignore` names its codes and says why, so a new violation fails `./run.sh test` (which
installs the pinned ruff and mypy from requirements-dev.txt)."""

from __future__ import annotations

import re
import subprocess
import sys
import tokenize

import pytest

from artifact.config import REPO


def _ruff(*args: str) -> subprocess.CompletedProcess:
    try:
        import ruff  # noqa: F401 -- only whether it is installed
    except ImportError:
        pytest.skip("NOT RUN: ruff is not installed here (`./run.sh test` installs it from requirements-dev.txt)")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    done = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_file_is_laid_out_as_ruff_format_lays_it_out():
    done = _ruff("format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_type_checker_finds_nothing():
    try:
        import mypy  # noqa: F401 -- only whether it is installed
    except ImportError:
        pytest.skip("NOT RUN: mypy is not installed here (`./run.sh test` installs it from requirements-dev.txt)")
    # its files, strictness and imports: pyproject.toml's [tool.mypy]; no cache left in the checkout
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", "/dev/null"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


NOQA = re.compile(r"#\s*noqa\b(.*)$")
REASON = re.compile(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s*(--\s*|\()\S")


def _comments(path):
    """(line, text) of every comment of a Python file (its tokens: never a string that mentions one)."""
    with open(path, "rb") as fh:
        for tok in tokenize.tokenize(fh.readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string


def test_every_noqa_names_its_codes_and_says_why():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True).stdout.split()
    bad = [
        f"{f}:{i}: {text}"
        for f in files
        if (REPO / f).is_file()
        for i, text in _comments(REPO / f)
        if (m := NOQA.search(text)) and not REASON.match(m.group(1))
    ]
    assert not bad, "a # noqa without its codes and a reason ('# noqa: CODE -- why'):\n" + "\n".join(bad)


TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore\b(.*)$")
IGNORE_REASON = re.compile(r"\[[a-z-]+(\s*,\s*[a-z-]+)*\]\s*#\s*\S")


def test_every_type_ignore_names_its_codes_and_says_why():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True).stdout.split()
    bad = [
        f"{f}:{i}: {text}"
        for f in files
        if (REPO / f).is_file()
        for i, text in _comments(REPO / f)
        if (m := TYPE_IGNORE.search(text)) and not IGNORE_REASON.match(m.group(1))
    ]
    assert not bad, "a # type: ignore without its codes and a reason ('# type: ignore[code]  # why'):\n" + "\n".join(
        bad
    )
