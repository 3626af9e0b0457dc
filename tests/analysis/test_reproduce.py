"""Exact comparison of the records of two builds or machines (`./run.sh compare RESULTS_A RESULTS_B`)."""

from artifact.analysis import reproduce


def test_exact_comparison_of_two_builds_counts_every_field(make_run, tmp_path):
    a = make_run("off", 1, {"e0": [[1, 2], [3]]}, manifest={"binary": {"sha256": "s", "files": {"libggml.so": "1"}}})
    same = reproduce.compare_records(a, a)
    assert same.exact and same.matched == 2 and same.provenance == []
    from synthetic_runs import write_bfcl_run
    b = write_bfcl_run(tmp_path / "other", "off", 1, {"e0": [[1, 2], [3]]}, config="synthetic", cache_n=0,
                       logprobs={("e0", 1): [[[3, -0.5], [4, -2.0]]]},
                       manifest={"binary": {"sha256": "s", "files": {"libggml.so": "2"}}})
    diff = reproduce.compare_records(a, b)
    assert not diff.exact and diff.identical["output_tokens"] == 2 and diff.identical["top_logprobs"] == 1
    assert diff.first_difference == "episode e0 request 1: top_logprobs"
    assert any("1 of 1 binaries and libraries differ" in p for p in diff.provenance)


def test_compare_of_two_results_directories_exits_0_only_when_every_matched_run_is_identical(tmp_path):
    from artifact.cli import main
    from synthetic_runs import write_bfcl_run

    for side in ("a", "b"):
        write_bfcl_run(tmp_path / side, "off", 1, {"e0": [[1, 2]]})
    write_bfcl_run(tmp_path / "a", "on", 1, {"e0": [[1, 2]]})  # only in a: listed, not a difference
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    write_bfcl_run(tmp_path / "c", "off", 1, {"e0": [[1, 9]]})
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 1
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "nowhere")]) == 2
