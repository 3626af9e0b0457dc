"""Field-by-field comparison of the records of two runs, builds or machines (`./run.sh compare A B`)."""

from artifact.analysis import compare


def test_exact_comparison_of_two_builds_names_the_differing_field_and_the_builds(make_run, tmp_path):
    a = make_run("off", 1, {"e0": [[1, 2], [3]]}, manifest={"binary": {"sha256": "s", "files": {"libggml.so": "1"}}})
    same = compare.compare_records(a, a)
    assert same.exact and same.fields == [] and same.provenance == []
    from synthetic_runs import write_bfcl_run

    b = write_bfcl_run(
        tmp_path / "other",
        "off",
        1,
        {"e0": [[1, 2], [3]]},
        config="synthetic",
        cache_n=0,
        logprobs={("e0", 1): [[[3, -0.5], [4, -2.0]]]},
        manifest={"binary": {"sha256": "s", "files": {"libggml.so": "2"}}},
    )
    diff = compare.compare_records(a, b)
    assert not diff.exact and [(f.file, f.name, f.differ, f.of) for f in diff.fields] == [
        ("requests.jsonl", "top_logprobs", 1, 2)
    ]
    assert (
        diff.fields[0].first
        == "episode e0, request 1, position 0 (A: [[3, -0.1], [4, -2.5]], B: [[3, -0.5], [4, -2.0]])"
    )
    assert any("1 of 1 binaries and libraries differ" in p for p in diff.provenance)
    assert "prompt_ms (requests.jsonl)" in diff.timing  # listed, never compared


def test_values_are_equal_only_as_json_values_of_the_same_type():
    assert compare.same([1, 2], [1, 2]) and not compare.same([75], [75.0]) and not compare.same(1, True)
    assert compare.same({"a": [None]}, {"a": [None]}) and not compare.same({"a": 1}, {"a": 1, "b": 2})
    assert compare.same(float("nan"), float("nan"))
    assert compare.first_position([1, 2, 3], [1, 2]) == 2 and compare.first_position("abc", "abd") == 2
    assert compare.first_position("abc", "xbc") is None


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


def test_compare_says_the_same_machine_only_where_its_digests_are_recorded_and_equal(tmp_path):
    """Without the machine, boot and GPU digests on both sides, compare names them as not recorded and
    says that whether the runs ran on the same machine is not known; with them recorded and equal it says the same."""
    from synthetic_runs import write_bfcl_run

    eps = {"e0": [[1, 2]]}
    a = write_bfcl_run(tmp_path / "a", "off", 1, eps)
    b = write_bfcl_run(tmp_path / "b", "off", 1, eps)
    d = compare.compare_records(a, b)
    assert d.exact and not d.provenance
    line = compare.render([d], [], [])
    assert "the same host" not in line and "machine-id" in d.unknown
    assert "whether the runs ran on the same machine is not known" in line
    host = {
        "cpu": "Test CPU",
        "cpu_count": 2,
        "gpus": [],
        "os": "Linux-test",
        "python": "3.11",
        "hostname_sha256": "h",
        "machine_id_sha256": "m",
        "boot_id_sha256": "b",
        "gpu_uuid_sha256": [],
        "cuda_mps": False,
    }
    a = write_bfcl_run(tmp_path / "c", "off", 1, eps, manifest={"host": host, "binary": {"sha256": "s"}})
    b = write_bfcl_run(tmp_path / "d", "off", 1, eps, manifest={"host": host, "binary": {"sha256": "s"}})
    line = compare.render([compare.compare_records(a, b)], [], [])
    assert "machine-id, boot, GPU UUID" in line and "not known" not in line and "not recorded" not in line


def test_the_answering_servers_build_label_is_what_produced_a_record_not_its_outcome(tmp_path):
    """An OpenAI-style system_fingerprint (a server's build label) differs between two builds that answered alike:
    it is reported with the engine build, never as a differing outcome; a differing token still is one."""
    import json

    from artifact.records.store import load_run
    from synthetic_runs import write_bfcl_run

    runs = {}
    for side, label, tokens in (
        ("a", "b10434-7e4c0a968", [1, 2]),
        ("b", "b10435-9e40df63", [1, 2]),
        ("c", "x", [1, 9]),
    ):
        d = write_bfcl_run(tmp_path / side, "off", 1, {"e0": [tokens]}).path
        path = d / "requests.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for r in rows:
            r["engine_extra"] = {**(r.get("engine_extra") or {}), "system_fingerprint": label}
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs[side] = load_run(d)
    same = compare.compare_records(runs["a"], runs["b"])
    assert same.exact, [f.name for f in same.fields]
    assert "requests' system_fingerprint: b10434-7e4c0a968 vs b10435-9e40df63" in same.provenance
    other = compare.compare_records(runs["a"], runs["c"])
    assert not other.exact and "output_tokens" in [f.name for f in other.fields]
    assert "engine_extra.system_fingerprint" not in [f.name for f in other.fields]
