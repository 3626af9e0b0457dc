"""The package installs with pip (editable: it reads the checkout's configs/, expected/ and models/ beside it) and
gives the console script `prefix-cache-artifact`, which runs every command of run.sh: those that set up, build or run
the protocol hand over to run.sh (set-up, isolation); those that read records run in its own process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from artifact import cli

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("setup", "test", "demo", "run", "compare", "summary", "check", "fetch", "evidence-summary", "bench", "all")


def _env_without_set_up() -> dict:
    return {k: v for k, v in os.environ.items() if k not in (cli.SET_UP_ENV, "PYTHONPATH")}


def _copy_setuptools(into: Path) -> None:
    """The build backend pip needs for the package (setuptools >= 77), copied from this environment into a fresh
    one: no package index is reachable from the test suite's network isolation."""
    import setuptools

    version = tuple(int(part) for part in setuptools.__version__.split(".")[:2])
    assert version >= (77, 0), f"setuptools {setuptools.__version__} here: requirements.txt pins the build backend"
    have = Path(setuptools.__file__).parent.parent
    site = next((into / "lib").glob("python3*/site-packages"))
    for name in ("setuptools", "pkg_resources", "_distutils_hack", f"setuptools-{setuptools.__version__}.dist-info"):
        if (have / name).is_dir():
            shutil.copytree(have / name, site / name, dirs_exist_ok=True)
    if (have / "distutils-precedence.pth").is_file():
        shutil.copy2(have / "distutils-precedence.pth", site / "distutils-precedence.pth")


def test_a_fresh_venv_gets_the_console_script_from_pip_install_e(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    _copy_setuptools(env_dir)
    py = env_dir / "bin" / "python"
    install = subprocess.run(
        [
            py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
            "--no-build-isolation", "--no-deps", "-e", str(REPO),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    script = env_dir / "bin" / "prefix-cache-artifact"
    out = subprocess.run(
        [script, "--help"], capture_output=True, text=True, cwd=tmp_path, env=_env_without_set_up(), check=True
    ).stdout
    assert out.startswith("usage: prefix-cache-artifact")
    assert all(f"    {name} " in out or f"    {name}\n" in out for name in COMMANDS), out
    where = subprocess.run(
        [py, "-c", "import artifact; print(artifact.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env_without_set_up(),
        check=True,
    ).stdout.strip()
    assert Path(where) == REPO / "artifact" / "__init__.py"


def test_the_set_up_environment_has_the_console_script(tmp_path):
    """run.sh's set-up installs the package into its environment (offline: no build needed again here)."""
    script = Path(sys.executable).parent / "prefix-cache-artifact"
    if not script.exists():
        pytest.skip("NOT RUN: this Python's environment was not set up by run.sh (no prefix-cache-artifact)")
    out = subprocess.run(
        [script, "--help"], capture_output=True, text=True, cwd=tmp_path, env=_env_without_set_up(), check=True
    ).stdout
    assert out.startswith("usage: prefix-cache-artifact")
    assert all(f"    {name} " in out or f"    {name}\n" in out for name in COMMANDS), out
    bad = subprocess.run(
        [script, "summary", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env_without_set_up(),
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1


def test_commands_that_set_up_or_run_the_protocol_hand_over_to_run_sh(monkeypatch):
    monkeypatch.delenv(cli.SET_UP_ENV)
    calls = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append((path, argv)))
    for argv in (
        ["demo", "--episodes", "1"],
        ["run", "endpoint"],
        ["all", "--native"],
        ["setup"],
        ["test", "-x"],
        ["bench", "--repeat", "1"],
    ):
        calls.clear()
        cli.main(argv)
        assert calls == [(str(REPO / "run.sh"), [str(REPO / "run.sh"), *argv])]
    calls.clear()
    with pytest.raises(SystemExit):  # a reading command runs here: its own --help, no hand-over
        cli.main(["check", "--help"])
    assert calls == []


def test_run_sh_sets_the_commands_up_and_exports_no_pythonpath():
    text = (REPO / "run.sh").read_text()
    assert "export ARTIFACT_SET_UP=1" in text
    assert "PYTHONPATH" not in text
    assert sys.executable  # the suite itself runs under run.sh's set-up (conftest sets ARTIFACT_SET_UP)


@pytest.fixture(scope="module")
def copy_install(tmp_path_factory):
    """`pip install SRC` (not editable) of a copy of the checkout SRC, into a fresh venv: (the console script, SRC)."""
    tmp_path = tmp_path_factory.mktemp("copy")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    _copy_setuptools(env_dir)
    src = tmp_path / "src"
    skip = {".git", ".venv", ".venv-cuda", ".venv-vllm", ".device", "results", "weights", "models", "evidence", "build"}

    def top_level(folder: str, names: list[str]) -> list[str]:  # what the copy leaves out, at the top only
        return [n for n in names if folder == str(REPO) and (n in skip or n.endswith(".egg-info"))]

    shutil.copytree(REPO, src, ignore=top_level)
    install = subprocess.run(
        [env_dir / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
         "--no-build-isolation", "--no-deps", str(src)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    # the copy's checkout says what it was asked, instead of setting itself up (a venv of its own: minutes)
    (src / "run.sh").write_text('#!/bin/sh\necho "run.sh of the checkout it was installed from: $*"\n')
    return env_dir / "bin" / "prefix-cache-artifact", src


def _one_line_copy_error(done) -> str:
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a copy" in lines[0] and "./run.sh " in lines[0], done.stderr
    assert f"{cli.CHECKOUT_ENV}=DIR" in lines[0] and "pip install -e ." in lines[0]
    return lines[0]


def test_a_copy_installed_with_pip_install_dot_says_in_one_line_how_to_run_a_command(copy_install, tmp_path):
    """`pip install .` copies the package away from configs/, expected/ and run.sh: the console script still answers
    --help; run inside the checkout it was installed from, it hands every command to that checkout's run.sh;
    elsewhere a command is one line saying how to run it."""
    script, src = copy_install
    env = _env_without_set_up()
    assert subprocess.run([script, "--help"], capture_output=True, text=True, cwd=tmp_path, env=env).returncode == 0
    for command in (["demo"], ["check", str(REPO / "evidence" / "h200-agent")]):  # handed to run.sh; run here
        done = subprocess.run([script, *command], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
        _one_line_copy_error(done)
    # inside the checkout it was installed from (here, a folder below it): that checkout's run.sh runs the command
    inside = subprocess.run(
        [script, "check", "--help"], capture_output=True, text=True, cwd=src / "docs", env=env, timeout=120
    )
    assert inside.returncode == 0, inside.stderr[-2000:]
    assert inside.stdout == "run.sh of the checkout it was installed from: check --help\n"


def _planted(folder: Path) -> Path:
    """A folder received from someone else (a results folder) holding a run.sh, an artifact/cli.py and a
    pyproject.toml naming the project: its run.sh leaves a mark where it runs."""
    mark = folder / "ran"
    folder.mkdir(parents=True)
    (folder / "run.sh").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (folder / "run.sh").chmod(0o755)
    (folder / "artifact").mkdir()
    (folder / "artifact" / "cli.py").write_text("")
    (folder / "pyproject.toml").write_text('[project]\nname = "prefix-cache-artifact"\n')
    (folder / "results").mkdir()
    return mark


def test_a_copy_never_runs_the_run_sh_of_the_folder_it_runs_in(copy_install, tmp_path):
    """Another folder that looks like a checkout (a received results folder, or another checkout): its run.sh is
    not run, the one line says why and how; the user may name a checkout (ARTIFACT_CHECKOUT), whose run.sh runs."""
    script, src = copy_install
    env = _env_without_set_up()
    received = tmp_path / "received"
    mark = _planted(received)
    for command in (["check", "results"], ["summary", "results"], ["demo"], ["setup"]):
        done = subprocess.run([script, *command], capture_output=True, text=True, cwd=received, env=env, timeout=60)
        assert "holds a checkout it was not installed from" in _one_line_copy_error(done)
        assert not mark.exists()
    other = subprocess.run(  # the repository itself: a checkout, but not the one this copy came from
        [script, "check", "../evidence/cpu-endpoint"], capture_output=True, text=True, cwd=REPO / "docs", env=env
    )
    assert "holds a checkout it was not installed from" in _one_line_copy_error(other)
    named = subprocess.run(
        [script, "summary", "results"],
        capture_output=True,
        text=True,
        cwd=received,
        env={**env, cli.CHECKOUT_ENV: str(received)},
        timeout=60,
    )
    assert named.returncode == 0 and mark.exists(), named.stderr  # the user named it: its run.sh ran
    wrong = subprocess.run(
        [script, "summary"], capture_output=True, text=True, cwd=tmp_path, env={**env, cli.CHECKOUT_ENV: str(tmp_path)}
    )
    assert f"{cli.CHECKOUT_ENV}={tmp_path} is not a checkout" in _one_line_copy_error(wrong)
