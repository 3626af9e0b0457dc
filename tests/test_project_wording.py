"""The project speaks of itself and its users only: no tracked text file carries wording about how the project was
developed (notes of a working session, issue numbers, the output folder of a tool that built it), no unfilled
placeholder, and no path of a particular machine (a fixed temporary folder in a recipe or script is a `mktemp` or a
variable). The evidence's records are what they are (records are never edited after the fact) and are left out; the
pages check writes from them are held by tests/test_evidence_identifiers.py."""

from __future__ import annotations

import re
import subprocess

from artifact.config import REPO

DEVELOPMENT = re.compile(
    r"(?i:session notes|host session|lab notes?|\bissues? #?\d+\b|\(#\d+\)|the session did not)|\$OUT\b"
)
PLACEHOLDER = re.compile(r"\bTODO\b|\bFIXME\b|\bXXX\b|\bTBD\b|\b[A-Z]{2,}_RESULT\b")
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|home|root|scratch|Users|mnt|tmp)/[\w.+-]")

# Where a machine path is the thing itself, not a machine's: (file, the text that may name it, why).
ALLOWED = {
    ("artifact/provenance.py", "/tmp/nvidia-mps"): "CUDA MPS's own default pipe directory",
    ("tests/orchestrate/test_native.py", "/tmp/nvidia-mps"): "CUDA MPS's own default pipe directory",
    ("docs/gpu-hosts.md", "/tmp/nvidia-mps"): "CUDA MPS's own default pipe directory",
    ("artifact/orchestrate/slurm/batch.py", '"/tmp/", "/var/tmp/"'): "node-local folders a shared results path is not",
    ("Dockerfile.llamacpp", "HOME=/tmp MPLCONFIGDIR=/tmp/"): "the image's own filesystem",
    ("artifact/models/recipes/smollm2-135m-bfcl-agent.json", '"base": "/tmp/'): "the training record, as recorded",
}
SKIPPED = ("evidence/", "tests/test_project_wording.py")


def tracked_text() -> dict[str, str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True)
    texts = {}
    for name in out.stdout.decode().split("\0"):
        if not name or name.startswith(SKIPPED) or not (REPO / name).is_file():
            continue
        data = (REPO / name).read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        texts[name] = data.decode("utf-8", errors="replace")
    return texts


def findings(name: str, text: str) -> list[str]:
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in (("development", DEVELOPMENT), ("placeholder", PLACEHOLDER), ("path", MACHINE_PATH)):
            if pattern.search(line) and not any(f == name and allowed in line for f, allowed in ALLOWED):
                out.append(f"{name}:{number}: {what}: {line.strip()[:160]}")
    return out


def test_no_development_wording_placeholder_or_machine_path_in_tracked_files():
    texts = tracked_text()
    assert len(texts) > 200
    bad = [f for name, text in texts.items() for f in findings(name, text)]
    assert not bad, "\n".join(bad)


def test_the_scan_catches_each_kind():
    for line in (
        "see the session notes",
        "Where a host session ends between transfers",
        "collect into $OUT",
        "fixed in issue 55",
        "check OFFLINE_RESULT;",
        "TODO: measure",
        "W=${WORK:-/tmp/w}",
        "/home/alice/artifact/.venv",
    ):
        assert findings("x.md", line), line
    assert not findings("x.md", "W=${WORK:?set WORK}; out=$(mktemp -d)")
    assert not findings("artifact/provenance.py", 'or "/tmp/nvidia-mps")')
