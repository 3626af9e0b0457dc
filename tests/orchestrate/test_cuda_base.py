"""The CUDA base images made from PyPI wheels (scripts/make-cuda-base.sh, docker/cuda-base/): the pins, the recipe,
Dockerfile.llamacpp's CUDA arguments and docs/cuda-base.md held together by reading the files (no Docker build)."""

import re

from artifact.config import REPO

PINS = REPO / "docker" / "cuda-base" / "wheels.txt"
RECIPE = REPO / "scripts" / "make-cuda-base.sh"
BASE_DOCKERFILE = REPO / "docker" / "cuda-base" / "Dockerfile"
DOC = REPO / "docs" / "cuda-base.md"
PIN = re.compile(r"^([a-z0-9-]+)==([0-9.]+) --hash=sha256:([0-9a-f]{64})$")
# what ggml-cuda's build needs: the compiler (nvcc + cicc + crt headers), cudart, cuBLAS, CCCL (cub, thrust, libcu++)
NEEDED = {
    "nvidia-cuda-nvcc",
    "nvidia-nvvm",
    "nvidia-cuda-crt",
    "nvidia-cuda-runtime",
    "nvidia-cublas",
    "nvidia-cuda-cccl",
}


def pins() -> dict[str, str]:
    out = {}
    for line in PINS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = PIN.match(line)
        assert m, f"not an exact pin with its sha256: {line!r}"
        assert m[1] not in out, f"{m[1]} pinned twice"
        out[m[1]] = m[2]
    return out


def toolkit() -> str:
    m = re.search(r"^# cuda-toolkit: ([0-9]+\.[0-9]+\.[0-9]+)$", PINS.read_text(), re.M)
    assert m, "wheels.txt names its CUDA toolkit release ('# cuda-toolkit: X.Y.Z')"
    return m[1]


def test_every_wheel_is_pinned_by_version_and_sha256_and_the_build_needs_are_there():
    p = pins()
    assert set(p) == NEEDED, f"pinned {sorted(p)}; ggml-cuda's build needs {sorted(NEEDED)}"


def test_the_compiler_wheels_are_of_the_toolkit_release_the_pins_name():
    version, p = toolkit(), pins()
    major_minor = ".".join(version.split(".")[:2])
    for name in ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl"):
        assert p[name].startswith(major_minor + "."), f"{name}=={p[name]} is not CUDA {major_minor}"
    # nvcc, cicc and the crt headers come from one compiler release
    assert p["nvidia-cuda-nvcc"] == p["nvidia-nvvm"] == p["nvidia-cuda-crt"]
    assert p["nvidia-cublas"].split(".")[0] == version.split(".")[0]


def test_the_compiler_is_the_one_the_committed_gpu_evidence_was_built_with():
    nvcc = pins()["nvidia-cuda-nvcc"]
    for folder in ("h200-agent", "h200-smollm2"):
        assert f"V{nvcc}" in (REPO / "evidence" / folder / "nvcc.txt").read_text()


def test_the_recipe_installs_exactly_the_pinned_files():
    text = RECIPE.read_text()
    download = re.search(r"pip download [^\n]*\\\n[^\n]*", text)
    assert download, "the recipe downloads the wheels with pip"
    for flag in ("--no-deps", "--only-binary=:all:", "--require-hashes", '-r "$pins"'):
        assert flag in download[0], f"pip download without {flag}"
    assert "pins=$repo/docker/cuda-base/wheels.txt" in text
    assert "wheels downloaded, $pins pins $want" in text  # the count of files is checked against the pins


def test_the_recipe_builds_the_two_targets_of_its_dockerfile_with_the_tags_the_docs_use():
    stages = re.findall(r"^FROM \S+ AS (\w+)$", BASE_DOCKERFILE.read_text(), re.M)
    assert stages == ["runtime", "devel"]
    assert "for target in runtime devel; do" in RECIPE.read_text()
    assert '"$tag:$version-$target-bookworm"' in RECIPE.read_text()
    doc = DOC.read_text()
    for target in ("devel", "runtime"):
        assert f"local/cuda:{toolkit()}-{target}-bookworm" in doc


def test_nvidias_cuda_12_6_3_images_stay_the_default_and_the_bases_are_build_arguments():
    text = (REPO / "Dockerfile.llamacpp").read_text()
    assert "ARG BUILD_BASE=nvidia/cuda:12.6.3-devel-ubuntu24.04" in text
    assert "ARG RUNTIME_BASE=nvidia/cuda:12.6.3-runtime-ubuntu24.04" in text
    assert "FROM ${BUILD_BASE} AS build" in text and "FROM ${RUNTIME_BASE}\n" in text
    assert "--build-arg CUDA_ARCHS=" in DOC.read_text() and "--build-arg LLAMA_SOURCE=sdist" in DOC.read_text()


def test_the_doc_names_every_pinned_version_and_says_why_not_12_6():
    doc = DOC.read_text()
    for name, version in pins().items():
        assert f"{name}=={version}" in doc, f"docs/cuda-base.md does not name {name}=={version}"
    assert "nvidia-cuda-nvcc-cu12==12.6.85" in doc
    assert "cuda-base.md" in (REPO / "docs" / "gpu-hosts.md").read_text()
