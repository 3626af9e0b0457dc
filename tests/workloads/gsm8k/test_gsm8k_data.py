"""GSM8K data: synthetic generator determinism, the GSM8K-format file loader, and the Hub loader offline."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from artifact.errors import ArtifactError
from artifact.workloads.gsm8k import data as gsm8k_data
from artifact.workloads.gsm8k.data import (
    GSM8K_FILENAME,
    GSM8K_REVISION,
    GSM8KItem,
    load_gsm8k,
    load_gsm8k_file,
    parse_reference,
    synthetic_items,
)

FIXTURE = Path(__file__).parent / "gsm8k_sample.jsonl"
FIXTURE_ANSWERS = ["5", "1234", "25", "24", "165", "1000"]
REPO_ROOT = Path(__file__).resolve().parents[3]


def write_parquet(path: Path) -> Path:
    """A tiny parquet copy of the JSON-lines fixture, in GSM8K's columns and row order."""
    import pandas as pd

    rows = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["question", "answer"]).to_parquet(path, index=False)
    return path


def fake_hub_cache(cache_dir: Path, revision: str = GSM8K_REVISION) -> Path:
    """Lay the parquet fixture out as huggingface_hub's cache holds a file at a commit."""
    snapshot = cache_dir / "datasets--openai--gsm8k" / "snapshots" / revision
    return write_parquet(snapshot / GSM8K_FILENAME)


# ---------------------------------------------------------------- synthetic generator


def test_synthetic_same_seed_same_items_and_prefix_stable():
    assert synthetic_items(30) == synthetic_items(30, seed=42)
    assert synthetic_items(30)[:10] == synthetic_items(10)
    assert synthetic_items(10, seed=7) != synthetic_items(10, seed=42)
    assert synthetic_items(0) == []


def test_synthetic_first_item_pinned():
    assert synthetic_items(1)[0] == GSM8KItem(
        item_id="synthetic_0000",
        question="Omar buys 2 notebooks for $10 each and 10 apples for $5 each. "
        "How many dollars does Omar spend in total?",
        answer="70",
        source="synthetic",
    )


def test_synthetic_first_50_items_digest_pinned():
    """Same digest on CPython 3.10-3.13; a change here changes every synthetic result."""
    rows = [[item.item_id, item.question, item.answer] for item in synthetic_items(50)]
    digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    assert digest == "2c42af0b732963dbb6eb17957056c2737c33bca6acddbb4fd10739d923f95ccf"


def test_synthetic_items_are_well_formed():
    items = synthetic_items(200)
    ids = [item.item_id for item in items]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"synthetic_\d{4}", i) for i in ids)
    assert ids[7] == "synthetic_0007"
    assert all(re.fullmatch(r"\d+", item.answer) for item in items)  # non-negative integers
    assert all(item.source == "synthetic" and item.question.endswith("?") for item in items)
    assert len({item.question for item in items}) == len(items)
    assert sum(int(item.answer) > 1000 for item in items) >= 20  # commas matter
    assert sum("$" in item.question for item in items) >= 50  # money problems


def test_synthetic_rejects_bad_count():
    with pytest.raises(ArtifactError):
        synthetic_items(-1)


# ---------------------------------------------------------------- GSM8K-format files


@pytest.mark.parametrize(
    "text,expected",
    [("... so 5.\n#### 1,234", "1234"), ("#### -3", "-3"), ("x\n####  72 ", "72"), ("#### 2.5", "2.5")],
)
def test_parse_reference(text, expected):
    assert parse_reference(text) == expected


@pytest.mark.parametrize("text", ["The answer is 5", "#### five", "####"])
def test_parse_reference_rejects(text):
    with pytest.raises(ValueError):
        parse_reference(text)


def test_fixture_is_in_gsm8k_format():
    rows = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    assert 5 <= len(rows) <= 8
    for row in rows:
        assert list(row) == ["question", "answer"]
        assert re.search(r"<<[^>]+=[^>]+>>", row["answer"])
        assert re.search(r"\n#### \S+$", row["answer"])


def test_load_jsonl_fixture():
    items, provenance = load_gsm8k_file(FIXTURE, 6)
    assert [item.answer for item in items] == FIXTURE_ANSWERS  # "#### 1,234" -> "1234"
    assert [item.item_id for item in items][:2] == ["gsm8k_test_0000", "gsm8k_test_0001"]
    assert {item.source for item in items} == {"gsm8k"}
    assert items[0].question.startswith("Nadia bakes 48 muffins")
    assert provenance["sha256"] == hashlib.sha256(FIXTURE.read_bytes()).hexdigest()
    assert load_gsm8k_file(FIXTURE, 2)[0] == items[:2]


def test_load_parquet_matches_jsonl(tmp_path):
    path = write_parquet(tmp_path / "test.parquet")
    assert load_gsm8k_file(path, 6)[0] == load_gsm8k_file(FIXTURE, 6)[0]


def test_file_errors_are_one_line_artifact_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q?", "answer": "no marker"}\n', encoding="utf-8")
    cases = [(FIXTURE, 7), (FIXTURE, 0), (tmp_path / "missing.jsonl", 1), (bad, 1)]
    for path, n in cases:
        with pytest.raises(ArtifactError) as info:
            load_gsm8k_file(path, n)
        assert "\n" not in str(info.value)


# ---------------------------------------------------------------- Hub loader, offline


def test_hub_loader_reads_pinned_revision_from_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    local = fake_hub_cache(tmp_path)
    items, provenance = load_gsm8k(4, cache_dir=tmp_path, expected_sha256=None)
    assert [item.answer for item in items] == FIXTURE_ANSWERS[:4]
    assert provenance == {
        "repo": "openai/gsm8k",
        "config": "main",
        "split": "test",
        "revision": GSM8K_REVISION,
        "filename": GSM8K_FILENAME,
        "sha256": hashlib.sha256(local.read_bytes()).hexdigest(),
        "lines": len(FIXTURE_ANSWERS),
        "rows_sha256": gsm8k_data.rows_sha256(
            [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
        ),
    }  # rows_sha256: what a run from the Hub compares with the carried split's


def test_hub_loader_checks_pinned_sha256(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub_cache(tmp_path)
    with pytest.raises(ArtifactError, match="sha256"):
        load_gsm8k(4, cache_dir=tmp_path)


def test_hub_loader_offline_without_cache_says_how_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ArtifactError) as info:
        load_gsm8k(5, cache_dir=tmp_path / "empty")
    message = str(info.value)
    assert "\n" not in message
    assert f"hf download openai/gsm8k {GSM8K_FILENAME} --repo-type dataset" in message
    assert GSM8K_REVISION in message


def test_hub_loader_connection_error(tmp_path, monkeypatch):
    import huggingface_hub
    import requests
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    errors = [
        LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub\nand..."),
        requests.ConnectionError("Failed to resolve 'huggingface.co'\nmore"),
    ]
    for error in errors:

        def fail(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(huggingface_hub, "hf_hub_download", fail)
        with pytest.raises(ArtifactError) as info:
            load_gsm8k(5, cache_dir=tmp_path)
        assert "\n" not in str(info.value)


def test_hub_loader_offline_in_fresh_process_with_empty_hf_home(tmp_path):
    """As a user would hit it: HF_HUB_OFFLINE=1 and an empty HF_HOME, read at import time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"), PYTHONPATH=str(REPO_ROOT))
    code = (
        "from artifact.errors import ArtifactError\n"
        "from artifact.workloads.gsm8k.data import load_gsm8k\n"
        "try:\n    load_gsm8k(5)\nexcept ArtifactError as exc:\n    print(exc)\n"
        "else:\n    print('NO ERROR')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr
    assert len(lines) == 1 and "hf download openai/gsm8k" in lines[0], result.stdout
    assert not (tmp_path / "hf_home" / "hub" / "datasets--openai--gsm8k" / "snapshots").exists()


def test_revision_is_pinned_to_a_commit():
    assert re.fullmatch(r"[0-9a-f]{40}", gsm8k_data.GSM8K_REVISION)
    assert re.fullmatch(r"[0-9a-f]{64}", gsm8k_data.GSM8K_SHA256)


# ---------------------------------------------------------------- the split the artifact carries


def test_bundled_split_is_the_public_file_and_the_hub_split():
    record = json.loads((REPO_ROOT / "data" / "gsm8k" / "PROVENANCE.json").read_text())
    data = (REPO_ROOT / "data" / "gsm8k" / "test.jsonl").read_bytes()
    assert (
        hashlib.sha256(data).hexdigest()
        == record["sha256"]
        == ("3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14")
    )  # openai/grade-school-math's grade_school_math/data/test.jsonl
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == record["source"]["git_blob"]
    assert len(data) == record["bytes"] and data.count(b"\n") == record["lines"] == 1319
    licence = (REPO_ROOT / "data" / "gsm8k" / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "Copyright (c) 2021 OpenAI" in licence
    items, prov = gsm8k_data.load_gsm8k_bundled(1319)
    assert (
        prov["rows_sha256"]
        == record["hub_split"]["rows_sha256"]
        == ("545c5bec3d319576ea8c954a297c2383889096a91fbfa140e8a533c7b7c48430")
    )  # the published content hash of the Hub parquet's 1,319 decoded rows
    assert items[0].item_id == "gsm8k_test_0000" and items[0].answer == "18" and items[-1].source == "gsm8k"


def test_bundled_split_is_checked_before_anything_is_read(tmp_path):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    src = REPO_ROOT / "data" / "gsm8k"
    (folder / "PROVENANCE.json").write_text((src / "PROVENANCE.json").read_text())
    lines = (src / "test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "test.jsonl").write_text("".join(lines[:5]), encoding="utf-8")  # a shortened copy
    with pytest.raises(ArtifactError, match="sha256 .*not the pinned"):
        gsm8k_data.load_gsm8k_bundled(3, folder)
    (folder / "test.jsonl").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        gsm8k_data.load_gsm8k_bundled(3, folder)


def test_rows_hash_is_gos_encoding_of_sorted_keys():
    rows = [{"question": "a <b> & c", "answer": "x\u2028y #### 1"}]
    want = '{"answer":"x\\u2028y #### 1","question":"a \\u003cb\\u003e \\u0026 c"}\n'
    assert gsm8k_data.rows_sha256(rows) == hashlib.sha256(want.encode()).hexdigest()
