import json
import subprocess
import sys
from pathlib import Path

import pytest

from artifact.errors import ArtifactError
from artifact.records.reading import read_jsonl, read_requests
from artifact.records.store import DISCARDED, REQUESTS, RunWriter, find_runs, load_run
from synthetic_runs import SHA, write_raw_run


REQ = {
    "episode_id": "e0",
    "request_index": 0,
    "prompt_sha256": SHA,
    "output_tokens": [1],
    "prompt_tokens": 5,
    "cache_n": 0,
    "error": None,
}


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
    (stale / "manifest.json").write_text(
        json.dumps(
            {"config": "synthetic", "plan": "main", "arm": "off", "run": 2, "status": "incomplete", "episodes": []}
        )
    )
    labels = [r.label for r in find_runs(tmp_path)]
    assert labels == [
        "other/main/off-run2",
        "synthetic/main/off-run1",
        "synthetic/main/on-run1",
        "synthetic/main/on-run2",
    ]


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
        {
            "episode_id": "e0",
            "output_text": 'says "top_logprobs": [[1]] here',
            "top_logprobs": [[[1, -0.5], [2, -1e-9]]],
            "cache_n": 3,
        },
        {"episode_id": "e0", "top_logprobs": [[[1, None], [2, -1.0]]], "cache_n": 0},  # not plain numbers
        {"episode_id": "e0", "top_logprobs": [], "cache_n": 0, "output_tokens": [4, 5]},
        {"episode_id": "e0", "cache_n": 1},  # no top_logprobs at all
    ]
    write_raw_run(d, {"config": "c", "plan": "main", "arm": "on", "run": 1, "episodes": ["e0"]}, records)
    with open(d / REQUESTS, "a") as fh:
        fh.write('{"episode_id": "e0", "top_log')  # a cut-short last line is dropped by both readers
    lazy, plain = read_requests(d / REQUESTS), read_jsonl(d / REQUESTS)
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
    assert fresh == [[("off", 1, "off-run1")], [("off", 2, "off-run2")], [("on", 1, "on-run1")], [("on", 2, "on-run2")]]


BASE = json.dumps(
    {
        **REQ,
        "output_tokens": [1, 2],
        "output_text": "t: x",
        "top_logprobs": [[[1, -0.1], [5, -2.5]], [[2, -0.2], [6, -3.0]]],
        "engine_extra": {"k": "a:b", "n": {"m": 1}},
    }
)


@pytest.mark.parametrize(
    "line, twice",
    [
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
    ],
)
def test_the_typed_decoder_reads_what_the_strict_decoder_reads(tmp_path, line, twice):
    """requests.jsonl's fast reader (msgspec, typed) gives the records json gives, and refuses a key written twice
    anywhere in a line as the strict reader does, the keys and colons it could miscount included."""
    d = tmp_path / "r"
    write_raw_run(d, {"config": "c", "plan": "main", "arm": "on", "run": 1, "episodes": ["e0"]}, [])
    (d / REQUESTS).write_text(line + "\n")
    if twice is not None:
        for reader in (read_requests, read_jsonl):
            with pytest.raises(ArtifactError, match=f"requests.jsonl:1: a JSON object holds the key '{twice}' twice"):
                reader(d / REQUESTS)
        return
    (typed,), (strict,) = read_requests(d / REQUESTS), read_jsonl(d / REQUESTS)
    assert typed.get("top_logprobs") == strict.get("top_logprobs") and dict(typed) == strict


def test_a_key_twice_inside_top_logprobs_text_is_corruption(tmp_path):
    """top_logprobs are kept as text by the typed decoder; an object in them holding a key twice is found when the
    run's records are validated, as the strict decoder would find it."""
    from artifact.records.store import validate_records

    d = tmp_path / "cfg" / "main" / "on-run1"
    write_raw_run(d, {"config": "c", "plan": "main", "arm": "on", "run": 1, "episodes": ["e0"]}, [])
    top = BASE[BASE.index('"top_logprobs": ') + 16 : BASE.index(', "engine_extra"')]
    (d / REQUESTS).write_text(BASE.replace(top, '[{"a": 1, "a": 2}, null]') + "\n")
    (run,) = find_runs(tmp_path)
    with pytest.raises(
        ArtifactError, match="requests.jsonl:1: a JSON object holds the key 'a' twice; the record is corrupt"
    ):
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
    code = (
        "import sys\n"
        "from artifact.records.reading import _parse_pairs\n"
        "ids, lps = _parse_pairs([b'[[[1, -0.5], [7, -2.25]]]', b'[[[3, -0.1], [9, -3]]]'])\n"
        "assert ids.tolist() == [[1, 7], [3, 9]] and lps.tolist() == [[-0.5, -2.25], [-0.1, -3.0]]\n"
        "assert str(ids.dtype) == 'int64' and ids.flags.writeable and lps.flags.writeable\n"
        "assert _parse_pairs([b'[[[1.5, -0.5], [7, -2.25]]]']) is None\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "False"


# --- the loader reads bytes as read_text reads text, and decides per line as the strict decoder would -------------

MAN = {"config": "c", "plan": "main", "arm": "on", "run": 1, "episodes": ["e0"]}


def _lines_file(tmp_path, data: bytes):
    d = tmp_path / "r"
    write_raw_run(d, MAN, [])
    (d / REQUESTS).write_bytes(data)
    return d / REQUESTS


@pytest.mark.parametrize(
    "space, blank",
    [
        ("", True),
        (" \t", True),
        ("\x0b\x0c", True),
        ("\x1c", True),
        (" \x1f ", True),
        ("\u00a0", True),
        ("\u3000 ", True),
        ("\u0085", True),
        ("\u2028", True),
        ("\u200b", False),
        ("\x00", False),
    ],
)
def test_a_line_is_blank_where_str_strip_finds_it_blank(tmp_path, space, blank):
    """The readers split bytes; a line of whitespace as str.strip() knows it (Unicode's too, and \\x1c-\\x1f, which
    bytes.strip() keeps) is skipped, in the middle of a file and at its end, and any other line is decoded."""
    assert (not space.strip()) is blank
    line = json.dumps(REQ).encode()
    path = _lines_file(tmp_path, line + b"\n" + space.encode() + b"\n" + line + b"\n" + space.encode() + b"\n")
    for reader in (read_requests, read_jsonl):
        if blank:
            assert reader(path) == [REQ, REQ]
        else:
            with pytest.raises(ArtifactError, match=r"requests.jsonl:2: not valid JSON"):
                reader(path)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_newlines_are_read_as_text_reads_them(tmp_path, newline):
    """'\\r\\n' and a lone '\\r' end a line, as Python's text files read them (universal newlines)."""
    path = _lines_file(tmp_path, newline.join([json.dumps(REQ).encode()] * 3) + newline)
    for reader in (read_requests, read_jsonl):
        assert reader(path) == [REQ] * 3


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe6\xbc"])
def test_bytes_that_are_not_utf8_are_named_by_their_offset_as_text_names_them(tmp_path, bad):
    from artifact.records.reading import read_text

    lines = [json.dumps({**REQ, "output_text": "é 漢字"}, ensure_ascii=False).encode()] * 40
    data = b"\n".join(lines) + b"\n"
    path = _lines_file(tmp_path, data[:5000] + bad + data[5000:])
    with pytest.raises(ArtifactError) as text:
        read_text(path)
    assert "not UTF-8 text (byte 5000)" in str(text.value)
    for reader in (read_requests, read_jsonl):
        with pytest.raises(ArtifactError) as lines_read:
            reader(path)
        assert str(lines_read.value) == str(text.value)


def test_one_line_dropping_a_key_among_many_is_found(tmp_path):
    """Whether the typed decoder dropped a key is told by the ':' of the whole file at once, and line by line only
    where that count does not add up: a key the schema does not list leaves that line (and only it) to the strict
    decoder; a key written twice is corruption naming its line, wherever it is."""
    base = [BASE] * 30
    extra = BASE[:-1] + ', "serving": "a: b"}'
    path = _lines_file(tmp_path, "\n".join(base[:7] + [extra] + base[7:]).encode() + b"\n")
    records = read_requests(path)
    assert [type(r).__name__ for r in records] == ["LazyRecord"] * 7 + ["dict"] + ["LazyRecord"] * 23
    assert records[7] == json.loads(extra) and records[0]["top_logprobs"] and dict(records[0]) == json.loads(BASE)
    twice = BASE.replace('"k": "a:b"', '"k": "a:b", "k": "c"')
    for at in (0, 17, 30):
        path.write_text("\n".join(base[:at] + [twice] + base[at:]) + "\n")
        with pytest.raises(ArtifactError, match=f"requests.jsonl:{at + 1}: a JSON object holds the key 'k' twice"):
            read_requests(path)


def test_the_text_fields_hold_every_colon_a_request_line_may_hold_in_a_value():
    """_all_keys_decoded counts one ':' per key and those in the values that may hold a string: the schema's field
    names hold none (a name with one is refused), and the numbers and token ids are left out."""
    from artifact.records.schema import REQUEST, Field, Schema, decoded_text_fields

    assert decoded_text_fields(REQUEST, ("top_logprobs",)) == (
        "episode_id",
        "prompt_sha256",
        "output_text",
        "stop_type",
        "error",
        "engine_extra",
    )
    assert not any(":" in f.name for f in REQUEST.fields)
    with pytest.raises(TypeError, match="a field name holds ':'"):
        decoded_text_fields(Schema("x", "x.jsonl", (Field("a:b", (str,), "a name with a colon"),)))


def _top2_run(tmp_path, texts: list[str]):
    d = tmp_path / "cfg" / "main" / "on-run1"
    reqs = [
        {
            **REQ,
            "request_index": i,
            "output_tokens": [1, 2],
            "top_logprobs": [[[1, -0.1], [5, -2.5]], [[2, -0.2], [6, -3.0]]],
        }
        for i in range(len(texts))
    ]
    write_raw_run(d, {**MAN, "episodes": ["e0"]}, reqs)
    lines = (d / REQUESTS).read_text().splitlines()
    (d / REQUESTS).write_text(
        "".join(line.replace(json.dumps(r["top_logprobs"]), t) + "\n" for line, r, t in zip(lines, reqs, texts))
    )
    (run,) = find_runs(tmp_path)
    return run


def test_top2_texts_spaced_otherwise_than_json_writes_them_are_left_to_the_rule(tmp_path):
    """The bulk parse takes a top_logprobs text whose pairs and positions are separated by '], [' and ']], [['
    (as json writes them; spaces around the numbers are free), and leaves any other to the rule itself, which
    reads it as json does: the same records, the same verdicts."""
    from artifact.records.store import validate_records

    texts = {
        "[[[1, -0.1], [5, -2.5]], [[2, -0.2], [6, -3.0]]]": True,
        "[[[ 1 , -0.1 ], [5,  -2.5]], [[2, -0.2], [6, -3.0] ]]": True,
        "[ [[1, -0.1], [5, -2.5]], [[2, -0.2], [6, -3.0]] ]": True,
        "[[[1, -0.1],[5, -2.5]], [[2, -0.2], [6, -3.0]]]": False,
        "[[[1, -0.1], [5, -2.5]],[[2, -0.2], [6, -3.0]]]": False,
        "[[[1, -0.1], [5, -2.5]] , [[2, -0.2], [6, -3.0]]]": False,
        "[[[1, -0.1], [5, -2.5] ], [[2, -0.2], [6, -3.0]]]": False,
        "[[[1, -0.1], [5, -2.5]], [ [2, -0.2], [6, -3.0]]]": False,
        "[[[1, -0.1], [5, -2.5]], [[2, -0.2] , [6, -3.0]]]": False,
        "[[[1, -0.1], [5, -2.5]], null]": False,
    }
    run = _top2_run(tmp_path, list(texts))
    validate_records(run)
    records, counts, ids, lps = run.top2_arrays()
    assert [r["request_index"] for r in records] == [i for i, bulk in enumerate(texts.values()) if bulk]
    assert counts == [2] * len(records) and ids.tolist() == [[1, 5], [2, 6]] * len(records)
    assert lps.tolist() == [[-0.1, -2.5], [-0.2, -3.0]] * len(records)
    assert [r["top_logprobs"] for r in run.requests] == [json.loads(t) for t in texts]


def test_top2_parse_of_texts_without_positions():
    from artifact.records.reading import _parse_pairs

    ids, lps = _parse_pairs([b"[]", b"[[[1, -0.5], [7, -2.25]]]", b"[]", b"[[[3, -0.1], [9, -3]]]"])
    assert ids.tolist() == [[1, 7], [3, 9]] and lps.tolist() == [[-0.5, -2.25], [-0.1, -3.0]]
    ids, lps = _parse_pairs([b"[]", b"[]"])
    assert ids.shape == lps.shape == (0, 2) and str(ids.dtype) == "int64"
    assert _parse_pairs([b"[[[1, -0.5],[7, -2.25]]]"]) is None  # not as json writes them: left to the rule
    assert _parse_pairs([b"[[[1, -0.5], [7, -2.25]]]", b"[[[1, 2.5], [75.0, -2.25]]]"]) is None


def test_check_worker_imports_only_what_loading_a_run_needs():
    """check's worker process starts by importing artifact.check.load (artifact.check.run.WORKER_MODULES), whose
    load_run and check_records are check's: without the analyses (and their facts) or pandas."""
    from artifact.check import load, run

    assert run.load_run is load.load_run and run.check_records is load.check_records
    assert run.WORKER_MODULES[0] == run.load_run.__module__ == "artifact.check.load"
    code = (
        "import sys\n"
        "import artifact.check.load\n"
        "print(sorted(m for m in sys.modules if m.startswith(('artifact.analysis', 'artifact.check.facts', "
        "'pandas'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]"
