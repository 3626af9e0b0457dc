import json
import subprocess
import sys
from pathlib import Path

import pytest

from artifact.errors import ArtifactError
from artifact.records.store import DISCARDED, REQUESTS, RunWriter, _read_jsonl, find_runs, load_run, read_requests
from synthetic_runs import SHA, write_raw_run


REQ = {"episode_id": "e0", "request_index": 0, "prompt_sha256": SHA, "output_tokens": [1], "prompt_tokens": 5,
       "cache_n": 0, "error": None}


def test_manifest_is_incomplete_until_finished_and_lines_are_flushed_as_written(tmp_path):
    w = RunWriter(tmp_path / "r", {"config": "c", "plan": "p", "arm": "off", "run": 1, "episodes": ["e0"]})
    assert json.loads((tmp_path / "r/manifest.json").read_text())["status"] == "incomplete"
    w.request(REQ)
    # readable before the run ends: a crash loses nothing already written
    assert load_run(tmp_path / "r").requests == [REQ]
    w.finish(wall_s=2.5)
    m = load_run(tmp_path / "r").manifest
    assert m["status"] == "complete" and m["wall_s"] == 2.5 and m["finished_at"] and m["started_at"]


def test_writer_refuses_to_overwrite_an_existing_run(tmp_path, make_run):
    run = make_run("off", 1, {"e0": [[1]]})
    with pytest.raises(ArtifactError, match="already holds a run"):
        RunWriter(run.path, {"config": "c"})
    assert load_run(run.path).requests[0]["output_tokens"] == [1]


def test_truncated_last_line_of_an_interrupted_run_is_tolerated(make_run):
    run = make_run("on", 1, {"e0": [[1], [2]]}, complete=False)
    with open(run.path / "requests.jsonl", "a") as fh:
        fh.write('{"episode_id": "e0", "requ')
    assert len(load_run(run.path).requests) == 2
    assert not load_run(run.path).complete


def test_corrupt_line_in_the_middle_is_an_error_naming_file_and_line(make_run):
    run = make_run("on", 1, {"e0": [[1], [2]]})
    lines = (run.path / "requests.jsonl").read_text().splitlines()
    (run.path / "requests.jsonl").write_text("\n".join(["{broken", *lines]) + "\n")
    with pytest.raises(ArtifactError, match=r"requests.jsonl:1: not valid JSON"):
        load_run(run.path).requests


def test_find_runs_reads_manifests_in_protocol_order_and_skips_discarded(tmp_path, make_run):
    make_run("on", 2, {"e0": [[1]]})
    make_run("off", 1, {"e0": [[1]]})
    make_run("on", 1, {"e0": [[1]]})
    (tmp_path / "synthetic/main" / DISCARDED / "t").mkdir(parents=True)
    (tmp_path / "synthetic/main/on-run1").rename(tmp_path / "synthetic/main/elsewhere-name")
    make_run("off", 2, {"e0": [[1]]}, config="other")
    stale = tmp_path / "synthetic/main" / DISCARDED / "t" / "off-run2"
    stale.mkdir()
    (stale / "manifest.json").write_text(json.dumps({"config": "synthetic", "plan": "main", "arm": "off",
                                                     "run": 2, "status": "incomplete", "episodes": []}))
    labels = [r.label for r in find_runs(tmp_path)]
    assert labels == ["other/main/off-run2", "synthetic/main/off-run1", "synthetic/main/on-run1",
                      "synthetic/main/on-run2"]


def test_load_run_errors_are_one_line(tmp_path):
    with pytest.raises(ArtifactError, match="not a run directory"):
        load_run(tmp_path)
    (tmp_path / "manifest.json").write_text('{"config": "c"}')
    with pytest.raises(ArtifactError, match="manifest.json: field 'plan' is missing"):
        load_run(tmp_path)
    with pytest.raises(ArtifactError, match="does not exist"):
        find_runs(tmp_path / "nowhere")


def test_lazy_reader_returns_the_store_records(tmp_path):
    d = tmp_path / "r"
    records = [
        {"episode_id": "e0", "output_text": 'says "top_logprobs": [[1]] here', "top_logprobs": [[[1, -0.5], [2, -1e-9]]],
         "cache_n": 3},
        {"episode_id": "e0", "top_logprobs": [[[1, None], [2, -1.0]]], "cache_n": 0},  # not plain numbers
        {"episode_id": "e0", "top_logprobs": [], "cache_n": 0, "output_tokens": [4, 5]},
        {"episode_id": "e0", "cache_n": 1},  # no top_logprobs at all
    ]
    write_raw_run(d, {"config": "c", "plan": "main", "arm": "on", "run": 1, "episodes": ["e0"]}, records)
    with open(d / REQUESTS, "a") as fh:
        fh.write('{"episode_id": "e0", "top_log')  # a cut-short last line is dropped by both readers
    lazy, plain = read_requests(d / REQUESTS), _read_jsonl(d / REQUESTS)
    assert len(lazy) == len(plain) == 4
    for a, b in zip(lazy, plain):
        assert ("top_logprobs" in a) == ("top_logprobs" in b)
        assert a.get("top_logprobs") == b.get("top_logprobs") and a.get("cache_n") == b["cache_n"]
        assert dict(a) == b  # after access, the same dict


def test_sessions_group_runs_by_server_lifecycle():
    from artifact.catalog import load_plan
    from artifact.protocol.sessions import sessions

    shared = [[(s.arm, s.run, s.session) for s in sess] for sess in sessions(load_plan("main"))]
    assert shared == [[("off", 1, "off"), ("off", 2, "off")], [("on", 1, "on"), ("on", 2, "on")]]
    fresh = [[(s.arm, s.run, s.session) for s in sess] for sess in sessions(load_plan("fresh"))]
    assert fresh == [[("off", 1, "off-run1")], [("off", 2, "off-run2")], [("on", 1, "on-run1")],
                     [("on", 2, "on-run2")]]


BASE = json.dumps({**REQ, "output_tokens": [1, 2], "output_text": "t: x", "top_logprobs": [[[1, -0.1], [5, -2.5]],
                   [[2, -0.2], [6, -3.0]]], "engine_extra": {"k": "a:b", "n": {"m": 1}}})


@pytest.mark.parametrize("line, twice", [
    (BASE, None),
    (BASE.replace('"cache_n": 0', '"cache_n": 0, "cache_n": 2'), "cache_n"),
    (BASE.replace('"k": "a:b"', '"k": "a:b", "k": "c"'), "k"),  # in a nested object
    (BASE.replace('"output_text": "t: x"', '"output_text": "t: x:::", "output_text": "c"'), "output_text"),
    (BASE.replace('"output_text": "t: x"', '"output_text": "t\\u003a", "output_text": "c"'), "output_text"),
    (BASE.replace('"n": {"m": 1}', '"n": {"m": 1, "m": 2}'), "m"),
    (BASE.replace('"top_logprobs": [[[1', '"top_logprobs": [{"a": 1, "a": 2}], "x": [[[1'), "a"),
    (BASE[:-1] + ', "serving": "x: y"}', None),  # a field the schema does not list: kept
    (BASE.replace('"output_tokens": [1, 2]', '"output_tokens": [1.0, 2]'), None),  # refused later, by the schema
    (BASE.replace('"top_logprobs": [[[1, -0.1]', '"top_logprobs": [[[1, -Infinity]'), None),
    (BASE.replace('"output_text": "t: x"', '"output_text": "bad \\ud800 text"'), None),
])
def test_the_typed_decoder_reads_what_the_strict_decoder_reads(tmp_path, line, twice):
    """requests.jsonl's fast reader (msgspec, typed) gives the records json gives, and refuses a key written twice
    anywhere in a line as the strict reader does, the keys and colons it could miscount included."""
    d = tmp_path / "r"
    write_raw_run(d, {"config": "c", "plan": "main", "arm": "on", "run": 1, "episodes": ["e0"]}, [])
    (d / REQUESTS).write_text(line + "\n")
    if twice is not None:
        for reader in (read_requests, _read_jsonl):
            with pytest.raises(ArtifactError, match=f"requests.jsonl:1: a JSON object holds the key '{twice}' twice"):
                reader(d / REQUESTS)
        return
    (typed,), (strict,) = read_requests(d / REQUESTS), _read_jsonl(d / REQUESTS)
    assert typed.get("top_logprobs") == strict.get("top_logprobs") and dict(typed) == strict


def test_a_key_twice_inside_top_logprobs_text_is_corruption(tmp_path):
    """top_logprobs are kept as text by the typed decoder; an object in them holding a key twice is found when the
    run's records are validated, as the strict decoder would find it."""
    from artifact.records.store import validate_records

    d = tmp_path / "cfg" / "main" / "on-run1"
    write_raw_run(d, {"config": "c", "plan": "main", "arm": "on", "run": 1, "episodes": ["e0"]}, [])
    top = BASE[BASE.index('"top_logprobs": ') + 16:BASE.index(', "engine_extra"')]
    (d / REQUESTS).write_text(BASE.replace(top, '[{"a": 1, "a": 2}, null]') + "\n")
    (run,) = find_runs(tmp_path)
    with pytest.raises(ArtifactError, match="requests.jsonl:1: a JSON object holds the key 'a' twice; the record is "
                                            "corrupt"):
        validate_records(run)


def test_manifests_carry_the_schema_version_and_a_newer_one_is_refused_in_one_line(make_run):
    """Records written from schema 2 on say so; one without the field is version 1 (the committed evidence); one a
    newer artifact wrote is refused with what to do, never read as if its fields meant what they mean here."""
    from artifact.records.schema import MANIFEST, SCHEMA_VERSION

    run = make_run("off", 1, {"e0": [[1, 2, 3]]})
    manifest = json.loads((run.path / "manifest.json").read_text())
    legacy = {k: v for k, v in manifest.items() if k != "schema_version"}
    assert MANIFEST.problem(legacy) is None
    assert MANIFEST.problem({**legacy, "schema_version": SCHEMA_VERSION}) is None
    (run.path / "manifest.json").write_text(json.dumps({**manifest, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ArtifactError, match=f"schema_version' is {SCHEMA_VERSION + 1}: written by a newer version"):
        load_run(run.path)
    assert MANIFEST.problem({**legacy, "schema_version": 0}) == "field 'schema_version' must be >= 1, not 0"


def test_top2_parse_gives_writable_arrays_without_importing_pandas():
    """check's worker loads runs before it imports pandas: the top-2 parse must not pull it in (pyarrow's to_numpy
    does, ~0.5 s), and its arrays stay writable copies."""
    code = ("import sys\n"
            "from artifact.records.store import _parse_pairs\n"
            "ids, lps = _parse_pairs([b'[[[1, -0.5], [7, -2.25]]]', b'[[[3, -0.1], [9, -3]]]'])\n"
            "assert ids.tolist() == [[1, 7], [3, 9]] and lps.tolist() == [[-0.5, -2.25], [-0.1, -3.0]]\n"
            "assert str(ids.dtype) == 'int64' and ids.flags.writeable and lps.flags.writeable\n"
            "assert _parse_pairs([b'[[[1.5, -0.5], [7, -2.25]]]']) is None\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"
