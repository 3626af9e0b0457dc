"""Endpoint records held against themselves: tampered copies of the committed evidence/cpu-endpoint (a llama-server
the user ran, OFF run 1+2, ON run 1+2; exit 0: the control) where one recorded fact that routes a run (cache use,
a cold start, the server family, who started the server) is edited and the fields the engine wrote beside it are
not. Each such run is INVALID, the field named; a run relabelled as one whose weights the artifact loaded is too."""

from __future__ import annotations

import json
import shutil

import pytest

from artifact.check.claims import INVALID, PASS
from artifact.cli import main
from evidence_sets import edit_manifest, edit_requests, runs, unpack


def check(root, capsys) -> tuple[int, dict]:
    code = main(["check", str(root)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    data = json.loads((root / "check" / "check.json").read_text())
    assert data["exit_code"] == code, err
    return code, data


def invalid(root, capsys, run: str, *needles: str) -> dict:
    """Exit 1, `run` named under INVALID with every needle, RQ1 not PASS on it."""
    code, data = check(root, capsys)
    assert code == 1, data["invalid"]
    mine = [p for p in data["invalid"] if f"endpoint/main/{run}:" in p]
    assert mine, data["invalid"]
    for needle in needles:
        assert any(needle in p for p in mine), (needle, mine)
    return data


def test_the_control_passes(results, capsys):
    code, data = check(results, capsys)
    claims = {c["id"]: c for c in data["claims"]}
    assert code == 0 and data["invalid"] == [] and claims["RQ1"]["status"] == PASS


# --- cache use: cache_n against the counts the server reported -----------------------------------------------------


def test_an_off_request_whose_server_reported_cached_tokens_cannot_say_none(results, capsys):
    """The server's answer said 40 cached tokens (engine_extra.cache_sources), cache_n says 0: RQ1 would PASS on
    the label."""

    def hide(recs):
        recs[1]["engine_extra"]["cache_sources"]["timings.cache_n"] = 40
        recs[1]["engine_extra"]["cache_sources"]["usage.prompt_tokens_details.cached_tokens"] = 40

    edit_requests(runs(results)["off-run2"], hide)
    data = invalid(results, capsys, "off-run2", "field 'cache_n' is 0", "engine_extra.cache_sources", "give 40")
    assert {c["id"]: c for c in data["claims"]}["RQ1"]["status"] != PASS


@pytest.mark.parametrize("direction", ["lowered", "raised"])
def test_a_cache_count_edited_either_way_against_its_sources_is_invalid(results, capsys, direction):
    def edit(recs):
        r = next(r for r in recs if (r["cache_n"] > 0) == (direction == "lowered"))
        n = 0 if direction == "lowered" else r["prompt_tokens"] - 1
        r.update(cache_n=n, prompt_n=r["prompt_tokens"] - n)

    edit_requests(runs(results)["on-run1"], edit)
    invalid(results, capsys, "on-run1", "field 'cache_n' is", "engine_extra.cache_sources")


def test_a_request_without_the_sources_its_run_records_elsewhere_is_invalid(results, capsys):
    edit_requests(runs(results)["off-run1"], lambda recs: recs[2]["engine_extra"].pop("cache_sources"))
    invalid(results, capsys, "off-run1", "field 'engine_extra.cache_sources' is missing")


# --- a cold start: cached_before_session against the cached counts -------------------------------------------------


def _warm_first_request(recs, prefix=0):
    r = recs[0]
    n = r["prompt_tokens"] - 1
    r.update(cache_n=n, prompt_n=1)
    r["engine_extra"]["cache_sources"].update({"timings.cache_n": n, "usage.prompt_tokens_details.cached_tokens": n})
    r["engine_extra"]["session_prefix"] = prefix  # cached_before_session left 0: "cold"


def test_a_first_request_served_from_cache_cannot_be_recorded_cold(results, capsys):
    """ON run 1's first request served all but one prompt token from cache, its record still says none of them
    was cached before the session: the start is warm (no evidence for RQ2), not cold."""
    edit_requests(runs(results)["on-run1"], _warm_first_request)
    invalid(results, capsys, "on-run1", "field 'engine_extra.cached_before_session' is 0", "beyond session_prefix 0")


def test_a_session_prefix_on_the_sessions_first_request_is_invalid(results, capsys):
    """The same, its session prefix edited to cover the cached tokens: nothing was sent before the first request."""
    edit_requests(runs(results)["on-run1"], lambda recs: _warm_first_request(recs, prefix=recs[0]["prompt_tokens"]))
    invalid(results, capsys, "on-run1", "field 'engine_extra.session_prefix' is", "on the session's first request")


def test_a_session_prefix_longer_than_what_the_run_sent_is_invalid(results, capsys):
    def stretch(recs):
        r = recs[1]  # a longer prompt than the first request's prompt and reply: more cached, its prefix stretched
        n = r["prompt_tokens"] - 1
        assert n > recs[0]["prompt_tokens"] + len(recs[0]["output_tokens"]) + 2
        r.update(cache_n=n, prompt_n=1)
        r["engine_extra"]["cache_sources"].update(
            {"timings.cache_n": n, "usage.prompt_tokens_details.cached_tokens": n}
        )
        r["engine_extra"]["session_prefix"] = n

    edit_requests(runs(results)["on-run1"], stretch)
    invalid(results, capsys, "on-run1", "field 'engine_extra.session_prefix' is", "more than any earlier request")


# --- the server family: the recorded identity against the one the runs were paired by ------------------------------


def test_a_server_identity_edited_to_another_family_routes_nothing_into_rq4(results, capsys):
    """Every run's recorded identity says vLLM (`owned_by`), the identity the runs were paired by llama.cpp: no
    run is read as a vLLM server's; each is INVALID, the field named."""
    for run_dir in runs(results).values():

        def to_vllm(m):
            for model in m["server"]["identity"]["models"]:
                model["owned_by"] = "vllm"
            m["server_family"] = "vllm"

        edit_manifest(run_dir, to_vllm)
    data = invalid(results, capsys, "on-run1", "field 'server.identity' reports server family 'vllm'", "'llamacpp'")
    assert {c["id"]: c for c in data["claims"]}["RQ4"]["status"] != PASS
    assert len(data["invalid"]) == 4


# --- who started the server -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("logs", ["kept", "left out"])
def test_a_users_server_relabelled_llama_cpp_with_a_command_line_is_invalid(results, capsys, logs):
    """Engine 'llama.cpp' (whose runs' weights the artifact loaded and verified), a consistent pairing identity and
    fingerprint, any server_cmd: the record still says the user started the server."""
    for run_dir in runs(results).values():

        def relabel(m):
            m["engine"] = "llama.cpp"
            m["pairing_inputs"]["engine"].update(engine="llama.cpp", binary_sha256="ee" * 32)
            m["server_cmd"] = ["llama-server", "-m", "model.gguf"]

        edit_manifest(run_dir, relabel, refingerprint=True)
    if logs == "left out":
        shutil.rmtree(results / "endpoint" / "main" / "logs")
    data = invalid(results, capsys, "off-run1", "field 'server.started_by' is 'the user (not the artifact)'")
    assert sum("field 'server.started_by'" in p for p in data["invalid"]) == 4
    assert {c["id"]: c for c in data["claims"]}["RQ1"]["status"] == INVALID


def test_a_users_server_relabelled_without_its_started_by_is_still_invalid(results, capsys):
    """The same with server.started_by, unknown and observes removed: the pairing identity still holds what only a
    server the user runs reports (its servers' identities), and the weights are a server's (model.source)."""
    shutil.rmtree(results / "endpoint" / "main" / "logs")
    for run_dir in runs(results).values():

        def relabel(m):
            m["engine"] = "llama.cpp"
            m["pairing_inputs"]["engine"].update(engine="llama.cpp", binary_sha256="ee" * 32)
            m["server_cmd"] = ["llama-server"]
            for key in ("unknown", "observes"):
                m.pop(key)
            m["server"].pop("started_by")

        edit_manifest(run_dir, relabel, refingerprint=True)
    invalid(results, capsys, "on-run2", "field 'model.source' is 'server:'")


def test_an_endpoint_run_cannot_claim_to_have_observed_the_weights(results, capsys):
    edit_manifest(runs(results)["on-run2"], lambda m: m["observes"].update(weights_sha256=True))
    invalid(results, capsys, "on-run2", "field 'observes.weights_sha256' is true")


def test_a_llama_cpp_command_line_the_runs_were_not_paired_by_is_invalid(tmp_path, capsys):
    """evidence/cpu-kernels (llama.cpp, the control: exit 3, nothing refused): one run's pairing identity without
    the server_args its server_cmd is held to (fingerprint made again) is a command line nothing verifies."""
    root = unpack("cpu-kernels", tmp_path / "kernels")
    assert main(["check", str(root)]) == 3 and json.loads((root / "check" / "check.json").read_text())["invalid"] == []
    run_dir = next(iter(runs(root).values()))
    edit_manifest(run_dir, lambda m: m["pairing_inputs"]["engine"].pop("server_args"), refingerprint=True)
    assert main(["check", str(root)]) == 1
    problems = json.loads((root / "check" / "check.json").read_text())["invalid"]
    assert len(problems) == 1 and "field 'pairing_inputs.engine' records no server_args" in problems[0]
    capsys.readouterr()
