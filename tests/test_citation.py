"""The artifact is citable: CITATION.cff is valid against the Citation File Format 1.2.0 schema (kept with its licence
in tests/data/cff-1.2.0/, so nothing is read from the network), cites the paper as its preferred citation and the
artifact itself; .zenodo.json is the archive metadata a DOI service reads; both agree with pyproject.toml on the
version and the licence; and the README says how to cite."""

from __future__ import annotations

import copy
import json

import pytest

from artifact.config import REPO, tomllib

jsonschema = pytest.importorskip("jsonschema", reason="requirements-dev.txt (./run.sh test installs it)")
yaml = pytest.importorskip("yaml", reason="requirements-dev.txt (./run.sh test installs it)")

SCHEMA = REPO / "tests" / "data" / "cff-1.2.0" / "schema.json"
PAPER_TITLE = (
    "Same Request, Different Answer: Prefix Caching Makes Serving Non-Reproducible, and Quantization Amplifies It"
)


class _Loader(yaml.SafeLoader):
    """YAML as the format's own validator reads it: dates stay strings (the schema checks their form)."""


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def cff() -> dict:
    return yaml.load((REPO / "CITATION.cff").read_text(encoding="utf-8"), Loader=_Loader)


def cff_errors(data: dict) -> list[str]:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(data)]


def test_citation_cff_is_valid_cff_1_2_0():
    data = cff()
    assert data["cff-version"] == "1.2.0"
    assert cff_errors(data) == []


def test_an_invalid_citation_is_caught():
    """The validation is the schema's, not a formality: a missing author list, an unknown key and a wrong type fail."""
    data = cff()
    for broken in (
        {k: v for k, v in data.items() if k != "authors"},
        {**data, "licence": "Apache-2.0"},
        {**data, "preferred-citation": {**data["preferred-citation"], "type": "blog post"}},
        {**data, "version": ["0.1.0"]},
    ):
        assert cff_errors(copy.deepcopy(broken)), broken


def test_the_paper_is_the_preferred_citation_and_the_artifact_the_record():
    data = cff()
    paper = data["preferred-citation"]
    assert " ".join(paper["title"].split()) == PAPER_TITLE
    assert data["type"] == "software" and PAPER_TITLE in " ".join(data["title"].split())


def test_versions_and_licences_agree():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    zenodo = json.loads((REPO / ".zenodo.json").read_text(encoding="utf-8"))
    data = cff()
    assert project["license"] == data["license"] == zenodo["license"] == "Apache-2.0"
    assert project["version"] == str(data["version"]) == zenodo["version"]


def test_zenodo_metadata_has_what_a_deposit_needs():
    zenodo = json.loads((REPO / ".zenodo.json").read_text(encoding="utf-8"))
    assert zenodo["upload_type"] == "software" and zenodo["access_right"] == "open"
    assert PAPER_TITLE in zenodo["title"] and zenodo["description"].strip()
    assert zenodo["creators"] and all(c.get("name") for c in zenodo["creators"])
    assert [c["name"] for c in zenodo["creators"]] == [a["name"] for a in cff()["authors"]]
    relations = {"isSupplementTo", "references", "isDerivedFrom", "cites", "isDocumentedBy", "requires"}
    for rel in zenodo.get("related_identifiers", []):
        assert rel["relation"] in relations and rel["identifier"] and rel["scheme"] in {"url", "doi", "arxiv"}


def test_the_readme_says_how_to_cite():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Citing\n", 1)[1].split("\n## ", 1)[0]
    assert "CITATION.cff" in section and PAPER_TITLE in " ".join(section.split())
