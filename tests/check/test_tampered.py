"""Result sets a hostile or broken reviewer could hand the checker, each built as a results directory:
a clean plan (OFF run 1+2, ON run 1+2, written through the real RunWriter) with one thing changed the way an
editor, a script or a full disk would change it. Each test runs `./run.sh check` (artifact.cli.main) and asserts
the exit code and, where something is judged, the verdict; docs/records.md lists the classes and where each goes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from artifact.check.claims import INCONCLUSIVE, INVALID, PASS
from artifact.cli import main
from artifact.config import REPO
from artifact.errors import ArtifactError
from artifact.provenance import fingerprint
from synthetic_runs import OFF, ON1, ON2, main_plan, write_bfcl_run


def check(root, capsys):
    """Exit code, the one-line error (stderr) and, where check.json was written, the claims by id."""
    code = main(["check", str(root)])
    err = capsys.readouterr().err.strip()
    out = root / "check" / "check.json"
    data = json.loads(out.read_text()) if out.exists() else None
    return code, err, ({c["id"]: c for c in data["claims"]} if data else None), data


def malformed(root, capsys, *needles: str) -> str:
    """Exit 2 with one line naming every needle (file, line, field), and nothing judged."""
    code, err, claims, _ = check(root, capsys)
    assert code == 2 and claims is None, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def records(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def rewrite(path, recs: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def edit_request(run, i: int, **fields) -> None:
    recs = records(run.path / "requests.jsonl")
    recs[i].update(fields)
    rewrite(run.path / "requests.jsonl", recs)


def edit_manifest(target, **fields) -> None:
    mf = target.path / "manifest.json"
    mf.write_text(json.dumps({**json.loads(mf.read_text()), **fields}))


@pytest.fixture
def plan(tmp_path):
    """The clean plan: RQ1 and RQ2 PASS, exit 0 (the control every tampered set starts from)."""
    return main_plan(tmp_path, OFF, ON1, ON2)


def test_the_control_passes(tmp_path, plan, capsys):
    code, _, claims, _ = check(tmp_path, capsys)
    assert code == 0 and claims["RQ1"]["status"] == PASS and claims["RQ2"]["status"] == PASS


# --- a cache hit cannot hide from RQ1 -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"cache_n": 0, "prompt_n": 60}, "field 'cache_n' (0) + prompt_n (60) must equal prompt_tokens (100)"),
        ({"cache_n": None, "prompt_n": 60}, "field 'cache_n' is null (not reported) although prompt_n (60)"),
        ({"cache_n": 140, "prompt_n": 0}, "field 'cache_n' (140) exceeds prompt_tokens (100)"),
        ({"cache_n": -3}, "field 'cache_n' must be >= 0"),
        ({"cache_n": 0, "prompt_n": 40, "prompt_tokens": None}, "field 'prompt_tokens' is null in a served request"),
    ],
)
def test_cache_accounting_that_does_not_add_up_is_corruption(tmp_path, plan, capsys, fields, why):
    edit_request(plan[0], 1, **fields)  # OFF run 1, second request
    malformed(tmp_path, capsys, "off-run1/requests.jsonl:2: ", why)


@pytest.mark.parametrize("value", ["5", 2.0, True, [1]])
def test_a_failed_requests_cache_count_of_the_wrong_type_is_not_read_as_not_reported(tmp_path, plan, capsys, value):
    edit_request(plan[1], 0, error="HTTP 400: context", cache_n=value, output_tokens=[], top_logprobs=[])
    malformed(tmp_path, capsys, "off-run2/requests.jsonl:1: field 'cache_n' must be int/null")


def test_a_failed_request_may_report_cached_tokens_and_then_invalidates_the_off_run(tmp_path, plan, capsys):
    edit_request(plan[1], 1, error="HTTP 500", cache_n=40, prompt_n=0)  # within the prompt: a fact, not corruption
    code, _, claims, data = check(tmp_path, capsys)
    assert code == 1 and claims["RQ1"]["status"] == "FAIL"
    assert any("off-run2: cache-OFF run served cached tokens in 1 requests" in p for p in data["invalid"])


# --- ON vs OFF needs a cache that was used ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cache_n, why",
    [
        (0, "cfg/main/on-run1 was served no cached token (cache_n = 0 on all 8 requests): not a cache-ON run"),
        ("null", "cfg/main/on-run1 reports no cache use (cache_n null on every request)"),
    ],
)
def test_an_on_run_served_no_cached_token_is_no_evidence_for_rq2(tmp_path, capsys, cache_n, why):
    for k in (1, 2):
        write_bfcl_run(tmp_path, "off", k, OFF)
    write_bfcl_run(tmp_path, "on", 1, ON1, cache_n=cache_n)
    write_bfcl_run(tmp_path, "on", 2, ON2)
    code, _, claims, _ = check(tmp_path, capsys)
    rq2 = next(d for d in claims["RQ2"]["details"] if d["kind"] == "direction")
    assert rq2["status"] == INCONCLUSIVE and why in rq2["evidence"][0]
    assert claims["RQ1"]["status"] == PASS and code == 0  # the OFF reruns are still valid evidence for RQ1


def test_a_vllm_on_run_served_no_cached_token_is_no_evidence_for_rq4(tmp_path, capsys):
    for k in (1, 2):
        write_bfcl_run(tmp_path, "off", k, OFF, engine="vllm")
    write_bfcl_run(tmp_path, "on", 1, ON1, engine="vllm", cache_n=0)
    code, _, claims, _ = check(tmp_path, capsys)
    assert claims["RQ4"]["status"] == INCONCLUSIVE
    assert "on-run1 was served no cached token" in claims["RQ4"]["details"][0]["evidence"][0]


# --- contents are validated ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"output_tokens": [1.0, 2, 3, 4, 5]}, "field 'output_tokens' must list token ids (integers >= 0)"),
        ({"output_tokens": ["1", 2, 3, 4, 5]}, "field 'output_tokens' must list token ids"),
        ({"top_logprobs": [[[1, -0.1], [2, -2.5]]] * 4}, "field 'top_logprobs' has 4 positions for 5 output_tokens"),
        ({"top_logprobs": [[[1, -0.1], [2, -2.5]]] * 5}, "position 1: the emitted token 2 is not the most likely"),
        (
            {"top_logprobs": [[[t, -2.5], [t + 1, -0.1]] for t in (1, 2, 3, 4, 5)]},
            "position 0 is not ordered best first",
        ),
        (
            {"top_logprobs": [[[1.5, -0.1], [2, -2.5]]] + [[[t, -0.1], [0, -2.5]] for t in (2, 3, 4, 5)]},
            "position 0 must be null or a list of [token id, logprob] pairs",
        ),
        (
            {"top_logprobs": [[[1, -0.1], [2, -2.5]]] + [[[t, -0.1], [0, -2.5]] for t in (2.0, 3, 4, 5)]},
            "position 1 must be null or a list of [token id, logprob] pairs",
        ),  # 2.0: as text the same number, not an id
        ({"request_index": -1}, "field 'request_index' must be >= 0"),
        ({"prompt_tokens": "100"}, "field 'prompt_tokens' must be int/null"),
    ],
)
def test_request_contents_are_validated(tmp_path, plan, capsys, fields, why):
    edit_request(plan[2], 0, **fields)  # ON run 1, first request: output [1, 2, 3, 4, 5]
    malformed(tmp_path, capsys, "on-run1/requests.jsonl:1: ", why)


GOOD = [[[t, -0.1], [t + 10, -2.5]] for t in (1, 2, 3, 4, 5)]  # ON run 1's first request: output [1, 2, 3, 4, 5]


def _at(i: int, position: list) -> list:
    return GOOD[:i] + [position] + GOOD[i + 1 :]


@pytest.mark.parametrize(
    "top, why",
    [
        (_at(2, [[3, 0.5], [13, -2.5]]), "position 2: log-probability 0.5 is above 0 (tolerance 1e-06)"),
        (_at(1, [[2, -0.1], [12, float("-inf")]]), "position 1: log-probability -inf is not finite"),
        (_at(0, [[1, float("nan")], [11, -2.5]]), "position 0: log-probability nan is not finite"),
        (_at(3, [[4, -0.1], [4, -2.5]]), "position 3: token 4 is listed twice"),
        (_at(4, [[5, -0.1], [15, -1.0]]), "position 4: the probabilities sum to 1.27271686 > 1 (tolerance 1e-06)"),
        (_at(0, [[1, -1e-300], [11, -1e-3]]), "position 0: the probabilities sum to 1.9990005 > 1"),
    ],
)
@pytest.mark.parametrize("decoder", ["typed", "strict"])
def test_log_probabilities_no_softmax_gives_are_corruption(tmp_path, plan, capsys, top, why, decoder):
    """Above 0, not finite, a token twice, probabilities past 1: exit 2 naming file, line, field and
    position, whichever decoder reads the line (an unknown field sends it to the strict one; -Infinity and NaN,
    which are not JSON, always go there), never a numpy warning."""
    extra = {"x_unlisted": 1} if decoder == "strict" else {}
    edit_request(plan[2], 0, top_logprobs=top, **extra)
    err = malformed(tmp_path, capsys, "on-run1/requests.jsonl:1: field 'top_logprobs' ", why)
    assert "Warning" not in err


def test_log_probabilities_within_the_rounding_tolerance_are_accepted(tmp_path, capsys):
    """float32 arithmetic: a top log-probability of +5e-7 or 0.0, and probabilities summing to 1 + 6e-8 (as the
    H200 evidence holds), are what a softmax gives."""
    lps = {("e0", 0): [[[1, 5e-7], [2, -20.0]], [[2, 0.0], [9, -16.63]]]}
    main_plan(tmp_path, {"e0": [[1, 2]]}, {"e0": [[1, 2]]}, {"e0": [[1, 2]]}, logprobs=lps)
    assert check(tmp_path, capsys)[0] in (0, 3)


def test_a_position_without_log_probabilities_and_a_tie_are_not_violations(tmp_path, capsys):
    lps = {
        ("e0", 0): [
            [[1, -0.1], [2, -2.5]],
            None,
            [[7, -0.75], [3, -0.75]],
            [[4, -0.1], [0, -3.0]],
            [[5, -0.1], [0, -3.0]],
        ]
    }
    main_plan(tmp_path, OFF, ON1, ON2, logprobs=lps)
    assert check(tmp_path, capsys)[0] == 0


@pytest.mark.parametrize(
    "damage, why",
    [
        ("missing", "field 'n_requests' is missing"),
        ("text", "field 'n_requests' must be int, not str"),
    ],
)
def test_an_episode_record_without_an_integer_n_requests_is_corruption(tmp_path, plan, capsys, damage, why):
    eps = records(plan[0].path / "episodes.jsonl")
    if damage == "missing":
        del eps[1]["n_requests"]
    else:
        eps[1]["n_requests"] = "2"
    rewrite(plan[0].path / "episodes.jsonl", eps)
    malformed(tmp_path, capsys, "off-run1/episodes.jsonl:2: ", why)


def test_request_indexes_that_do_not_run_0_to_n_minus_1_make_the_run_invalid(tmp_path, plan, capsys):
    edit_request(plan[0], 1, request_index=5)  # e0's requests: 0, 5
    code, _, claims, data = check(tmp_path, capsys)
    assert code == 1 and claims["RQ1"]["status"] == INVALID
    assert any(
        "off-run1 is marked complete but holds request_index values that do not run 0..n-1 for episode e0" in p
        for p in data["invalid"]
    )


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"finished_at": "2020-01-01T00:00:00+00:00"}, "field 'finished_at' (2020-01-01T00:00:00+00:00) is before"),
        ({"started_at": "yesterday"}, "field 'started_at' must be an ISO 8601 time with its UTC offset"),
        ({"wall_s": -1.0}, "field 'wall_s' must be >= 0"),
        ({"run": 0}, "field 'run' must be >= 1"),
    ],
)
def test_manifest_contents_are_validated(tmp_path, plan, capsys, fields, why):
    edit_manifest(plan[3], **fields)
    malformed(tmp_path, capsys, "on-run2/manifest.json: ", why)


@pytest.mark.parametrize(
    "where, text",
    [
        ("requests.jsonl", '{"episode_id": "e0", "episode_id": "e9"}'),
        ("episodes.jsonl", '{"episode_id": "e0", "n_requests": 2, "n_requests": 9}'),
        ("manifest.json", None),
    ],
)
def test_a_key_twice_in_one_json_object_is_corruption(tmp_path, plan, capsys, where, text):
    path = plan[0].path / where
    if where == "manifest.json":
        path.write_text(path.read_text().replace('"run": 1,', '"run": 1, "run": 2,'))
        malformed(tmp_path, capsys, "off-run1/manifest.json: a JSON object holds the key 'run' twice")
        return
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], text, *lines[1:]]) + "\n")
    malformed(tmp_path, capsys, f"off-run1/{where}:2: a JSON object holds the key", "twice")


def test_a_second_top_logprobs_key_is_found_behind_the_lazily_read_one(tmp_path, plan, capsys):
    path = plan[0].path / "requests.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = lines[0][:-1] + ', "top_logprobs": []}'
    path.write_text("\n".join(lines) + "\n")
    malformed(tmp_path, capsys, "off-run1/requests.jsonl:1: a JSON object holds the key 'top_logprobs' twice")


# --- the same data counted twice, or mislabelled -----------------------------------------------------------------


def test_a_run_directory_that_is_a_symbolic_link_is_refused(tmp_path, plan, capsys):
    other = tmp_path / "cfg" / "p2"
    other.mkdir()
    (other / "off-run1").symlink_to(plan[0].path)
    malformed(tmp_path, capsys, "cfg/p2/off-run1 is a symbolic link (a directory ->")


@pytest.mark.parametrize("name", ["requests.jsonl", "episodes.jsonl", "manifest.json"])
def test_a_record_file_that_is_a_symbolic_link_is_refused(tmp_path, plan, capsys, name):
    target = plan[1].path / name
    target.unlink()
    target.symlink_to(plan[0].path / name)
    malformed(tmp_path, capsys, f"off-run2/{name} is a symbolic link (a record file ->")


def test_a_pairing_fingerprint_not_made_from_its_inputs_is_corruption(tmp_path, plan, capsys):
    m = json.loads((plan[0].path / "manifest.json").read_text())
    edit_manifest(plan[3], pairing_inputs={**m["pairing_inputs"], "threads": 64})  # fingerprint kept
    malformed(
        tmp_path,
        capsys,
        "on-run2/manifest.json: field 'pairing_fingerprint'",
        "is not the digest of the manifest's pairing_inputs",
    )


@pytest.mark.parametrize(
    "change, why",
    [
        ({"model_sha256": "cd" * 32}, "pairing_inputs' names model_sha256 'cdcd"),
        (
            {"engine": {"engine": "vllm", "binary_sha256": "ee" * 32}},
            "names engine 'vllm', the manifest's engine is 'llama.cpp'",
        ),
        ({"units": ["e0"]}, "lists other units than the manifest's episodes"),
    ],
)
def test_pairing_inputs_must_agree_with_the_manifest(tmp_path, plan, capsys, change, why):
    """Another model's or engine's run re-labelled to pair: the fingerprint recomputed from the edited inputs
    matches, but the inputs no longer describe the run."""
    inputs = {**json.loads((plan[3].path / "manifest.json").read_text())["pairing_inputs"], **change}
    edit_manifest(plan[3], pairing_inputs=inputs, pairing_fingerprint=fingerprint(inputs))
    malformed(tmp_path, capsys, "on-run2/manifest.json: ", why)


def test_a_fingerprint_without_its_inputs_is_corruption(tmp_path, plan, capsys):
    edit_manifest(plan[3], pairing_inputs=None)
    m = json.loads((plan[3].path / "manifest.json").read_text())
    del m["pairing_inputs"]
    (plan[3].path / "manifest.json").write_text(json.dumps(m))
    malformed(tmp_path, capsys, "field 'pairing_inputs' is missing: the pairing_fingerprint cannot be verified")


# --- robustness --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["requests.jsonl", "episodes.jsonl", "manifest.json"])
def test_deeply_nested_json_is_a_one_line_error(tmp_path, plan, capsys, where):
    deep = "[" * 200_000 + "]" * 200_000
    path = plan[0].path / where
    if where == "manifest.json":
        path.write_text(path.read_text().rstrip()[:-1] + f', "deep": {deep}}}')
        malformed(tmp_path, capsys, "off-run1/manifest.json: JSON nested too deeply to decode")
    else:
        path.write_text(path.read_text() + json.dumps({"episode_id": "e0"})[:-1] + f', "deep": {deep}}}\n')
        malformed(tmp_path, capsys, f"off-run1/{where}:", "JSON nested too deeply to decode")


def test_text_that_is_not_utf8_is_a_one_line_error(tmp_path, plan, capsys):
    with open(plan[0].path / "requests.jsonl", "ab") as fh:
        fh.write(b'{"episode_id": "\xff"}\n')
    malformed(tmp_path, capsys, "off-run1/requests.jsonl: not UTF-8 text")


def test_a_results_path_that_is_a_file_or_holds_an_unreadable_entry_says_so(tmp_path, plan, capsys):
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert "is not a directory" in malformed(f, capsys)
    assert "does not exist" in malformed(tmp_path / "nope", capsys)
    (plan[1].path / "requests.jsonl").unlink()
    (plan[1].path / "requests.jsonl").mkdir()  # an entry that cannot be read as a file
    malformed(tmp_path, capsys, "cannot read", "off-run2/requests.jsonl (Is a directory)")
    (plan[1].path / "requests.jsonl").rmdir()
    (plan[1].path / "manifest.json").unlink()
    (plan[1].path / "manifest.json").mkdir()
    malformed(tmp_path, capsys, "cannot read", "off-run2/manifest.json (Is a directory)")


def test_a_lone_surrogate_in_model_text_still_writes_the_report(tmp_path, plan, capsys):
    edit_request(plan[2], 1, output_text="bad \ud800 text")  # JSON "\ud800": a lone surrogate once decoded
    code, _, _, data = check(tmp_path, capsys)
    assert code == 0 and data["exit_code"] == 0
    html = (tmp_path / "check" / "report.html").read_text(encoding="utf-8")
    assert html.endswith("</html>\n") or html.rstrip().endswith("</html>")


FULL_DISK = """
import resource, signal, sys
from artifact.check.run import run_check
from artifact.errors import ArtifactError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
try:
    sys.exit(run_check(sys.argv[1], quiet=True))
except ArtifactError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def test_a_failed_write_leaves_the_previous_outputs_whole(tmp_path, plan, capsys):
    assert check(tmp_path, capsys)[0] == 0
    out = tmp_path / "check"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # the next check would say RQ1 FAIL, exit 1
    edit_request(plan[0], 1, output_tokens=[6, 7, 9], top_logprobs=[[[t, -0.1], [t + 1, -2.5]] for t in (6, 7, 9)])
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path), "4096"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "cannot write the check outputs to" in done.stderr and "File too large" in done.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # whole, and still the previous ones
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg", "check"]  # no half-written folder left
    code, _, claims, _ = check(tmp_path, capsys)  # with room again: replaced whole
    assert code == 1 and json.loads((out / "check.json").read_text())["exit_code"] == 1


def test_an_out_folder_holding_other_files_is_not_replaced(tmp_path, plan, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["check", str(tmp_path), "--out", str(mine)]) == 2
    assert "refusing to replace" in capsys.readouterr().err and (mine / "notes.txt").read_text() == "keep"
    with pytest.raises(ArtifactError, match="it is not a directory"):
        from artifact.check.run import run_check

        run_check(tmp_path, mine / "notes.txt", quiet=True)


def test_a_complete_run_without_its_finish_time_is_corruption(tmp_path, plan, capsys):
    edit_manifest(plan[2], finished_at=None)
    malformed(tmp_path, capsys, "on-run1/manifest.json", "field 'finished_at' is null in a run marked complete")


def test_a_record_file_that_is_a_named_pipe_is_refused_without_blocking(tmp_path, plan, capsys):
    episodes = plan[0].path / "episodes.jsonl"
    episodes.unlink()
    os.mkfifo(episodes)  # reading it would block for ever
    malformed(tmp_path, capsys, "off-run1/episodes.jsonl: not a regular file")
