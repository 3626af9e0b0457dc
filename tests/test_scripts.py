"""`scripts/` holds only what the artifact runs or documents: every file in it is named by what runs (run.sh, the
package under artifact/, a Dockerfile, .ci/) or by the documentation (README.md, ARTIFACT.md, docs/). A tool no one
runs or documents is either documented where a reader looks for it or deleted (git history keeps it); the tests
naming a script do not count, nor do other scripts."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"


def _namers() -> list[Path]:
    """The files whose naming a script counts: what the artifact runs, and its documentation."""
    runs = [REPO / "run.sh", *REPO.glob("Dockerfile*"), *(REPO / "docker").rglob("*Dockerfile*")]
    runs += [p for p in (REPO / ".ci").rglob("*") if p.is_file()]
    runs += [p for p in (REPO / "artifact").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    docs = [REPO / "README.md", REPO / "ARTIFACT.md", *(REPO / "docs").glob("*.md")]
    return [p for p in runs + docs if p.is_file()]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file (the committed adapter) names nothing
        return ""


def test_every_script_is_run_or_documented():
    texts = {p: _text(p) for p in _namers()}
    unnamed = []
    for script in sorted(p for p in SCRIPTS.iterdir() if p.is_file()):
        # the file's name on its own: `device-wheels.txt` is not named by `vllm-device-wheels.txt`
        name = re.compile(rf"(?<![\w.-]){re.escape(script.name)}(?![\w-])")
        if not any(name.search(text) for text in texts.values()):
            unnamed.append(f"scripts/{script.name}")
    assert not unnamed, (
        "files in scripts/ that nothing the artifact runs (run.sh, artifact/, Dockerfiles, .ci/) or documents "
        "(README.md, ARTIFACT.md, docs/) names: document each in the docs page where it is used (what it does, when "
        "to run it), or delete it:\n" + "\n".join(unnamed)
    )


def test_a_script_is_named_only_by_its_own_name():
    """The name must stand on its own: a longer name that ends in it does not count."""
    name = re.compile(rf"(?<![\w.-]){re.escape('device-wheels.txt')}(?![\w-])")
    assert name.search("(`scripts/device-wheels.txt`, ...)")
    assert not name.search("scripts/vllm-device-wheels.txt")
    assert not name.search("scripts/device-wheels.txt-old")
