"""The licences: the project's own (LICENSE, the Apache-2.0 text, stated in pyproject.toml), and a notice
(THIRD_PARTY_NOTICES.md) that names every part the results depend on that the set-up, the images or the workflows
fetch: each pinned Python package, each CUDA wheel, each model source and the committed adapter; every licence text it
points to is there (an MIT text with its copyright line), and every text under LICENSES/ is one it points to."""

from __future__ import annotations

import json
import re

from artifact.config import REPO, tomllib

NOTICE = REPO / "THIRD_PARTY_NOTICES.md"
LICENSES = REPO / "LICENSES"


def notice() -> str:
    return " ".join(NOTICE.read_text(encoding="utf-8").split())


def pinned(path) -> list[str]:
    """The package names a requirements file pins (name==version)."""
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"\s*([A-Za-z0-9_.\-]+)==", line.split("#")[0]):
            names.append(m[1])
    return names


def test_the_project_licence_is_apache_2_0_and_pyproject_says_so():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert (LICENSES / "Apache-2.0.txt").read_text(encoding="utf-8") == text
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0" and "LICENSE" in project["license-files"]


def test_every_pinned_package_and_cuda_wheel_is_named():
    text = notice()
    names = [
        *pinned(REPO / "requirements.txt"),
        *pinned(REPO / "requirements-nodeps.txt"),
        *pinned(REPO / "requirements-dev.txt"),
        *pinned(REPO / "docker" / "cuda-base" / "wheels.txt"),
    ]
    missing = [n for n in names if f"{n} (" not in text and f"`{n}`" not in text and f"`{n}==" not in text]
    assert not missing, f"THIRD_PARTY_NOTICES.md names no licence for {missing}"


def test_every_model_source_and_the_adapter_are_named():
    text = notice()
    for spec in sorted((REPO / "artifact" / "models" / "sources").glob("*.json")):
        data = json.loads(spec.read_text(encoding="utf-8"))
        assert f"artifact/models/sources/{spec.name}" in text, spec.name
        first = data["parts"][0]["distribution"]
        assert f"`{first}`" in text, first
    recipe = json.loads((REPO / "artifact" / "models" / "recipes" / "smollm2-135m-bfcl-agent.json").read_text())
    assert f"artifact/models/recipes/{recipe['adapter']['file']}" in text
    assert recipe["base"]["sha256"] in text  # the SmolLM2 file the set-up takes from its wheel


def test_every_licence_text_is_there_and_used():
    raw = NOTICE.read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(((?:LICENSES/|tests/data/)[^)#\s]+)\)", raw))
    assert linked, "the notice links its licence texts"
    for rel in linked:
        assert (REPO / rel).is_file(), rel
    texts = {f"LICENSES/{p.name}" for p in LICENSES.iterdir()}
    assert texts <= linked, f"licence texts nothing names: {texts - linked}"
    for path in LICENSES.glob("MIT-*.txt"):
        body = path.read_text(encoding="utf-8")
        assert re.search(r"^Copyright \(c\) \d{4}", body, re.M) and "Permission is hereby granted" in body, path.name


def test_the_front_page_points_to_the_licences():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "](LICENSE)" in readme and "](THIRD_PARTY_NOTICES.md)" in readme
