"""Fixtures of the check tests that tamper with committed evidence: evidence/cpu-endpoint's runs unpacked once per
module (`endpoint_records`), and a fresh copy of them per test (`results`), to check as they are or edited."""

from __future__ import annotations

import shutil

import pytest

from evidence_sets import unpack


@pytest.fixture(scope="module")
def endpoint_records(tmp_path_factory):
    return unpack("cpu-endpoint", tmp_path_factory.mktemp("cpu-endpoint"))


@pytest.fixture
def results(endpoint_records, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(endpoint_records, root)
    return root
