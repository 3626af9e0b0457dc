"""Routing from facts: what a run's engine observed of its server is derived from the engine (one that
starts its own server observes everything), never read from an absent or free `observes` label as "everything"."""

from __future__ import annotations

from artifact.check.core import observes, unobserved
from synthetic_runs import OFF, write_bfcl_run


def test_an_endpoint_run_without_observes_observed_nothing(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, OFF, engine="endpoint")
    assert "observes" not in run.manifest
    assert not any(observes(run).values())
    assert unobserved([run], "weights_sha256") == [run.label]


def test_an_endpoint_run_observed_what_its_manifest_says_and_nothing_more(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, OFF, engine="endpoint",
                         manifest={"observes": {"logprobs": True, "cache_use": "as reported"}})
    seen = observes(run)
    assert seen["logprobs"] is True and seen["cache_use"] == "as reported"
    assert seen["weights_sha256"] is False and seen["binary"] is False


def test_an_engine_that_starts_its_server_observes_everything_whatever_its_label_says(tmp_path):
    run = write_bfcl_run(tmp_path, "off", 1, OFF, manifest={"observes": {"weights_sha256": False}})
    assert all(v is True for v in observes(run).values())
    assert unobserved([run], "weights_sha256") == []
