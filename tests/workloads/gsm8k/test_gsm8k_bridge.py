"""The GSM8K bridge end to end with the real llama-server (b10434) and SmolLM2-135M on this machine's CPU.

The first three items of the GSM8K test split the artifact carries, four servings each, short outputs; the run's
records held against the split (tampered copies beside the real run); plus prompt/item checks that need no server.
"""

from __future__ import annotations

import json

import pytest

from artifact.workloads.gsm8k.scoring import ANSWER_INSTRUCTION
from artifact.workloads.gsm8k.table import tab3, tab3_row
from artifact.catalog import load_config, load_plan
from artifact.errors import ArtifactError
from artifact.records.store import DISCARDED, MANIFEST, find_runs, load_run
from artifact.workloads.gsm8k import prompts as gsm8k
from artifact.workloads.gsm8k.data import load_gsm8k_bundled, synthetic_items
from artifact.workloads.gsm8k.records import record_problem
from budget import with_workload

N_ITEMS, N_PREDICT = 3, 48
SERVING_ORDER = ["cold1", "cold2", "warm1", "warm2"]


# ---------------------------------------------------------------- no server


def test_prompt_is_one_chatml_user_turn_with_the_answer_format():
    item = synthetic_items(1)[0]
    prompt = gsm8k.build_prompt(item, "qwen")
    assert prompt == (
        f"<|im_start|>user\n{item.question}\n\n{ANSWER_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    )  # BFCL's QwenHandler adds no system message
    assert gsm8k.build_prompt(item, "qwen_fc") == prompt
    assert gsm8k.build_prompt(item, "llama").startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    with pytest.raises(ArtifactError, match="function-calling"):
        gsm8k.build_prompt(item, "llama_3_1")


def test_synthetic_items_are_labelled_synthetic():
    cfg = with_workload(load_config("demo-smollm2-q4_1-cpu-gsm8k"), episodes=4)
    items, prov = gsm8k.load_items(cfg.workload.episodes, "synthetic")
    assert [i.item_id for i in items] == [f"synthetic_{k:04d}" for k in range(4)]
    assert prov["synthetic"] is True and prov["data"] == "synthetic" and prov["n_items"] == 4
    assert prov["items_sha256"] == gsm8k.items_sha256(synthetic_items(4))


def test_cache_check():
    assert gsm8k.cache_check("cold1", 0, 80) == gsm8k.cache_check("warm2", 79, 80) == "ok"
    assert gsm8k.cache_check("cold2", 3, 80) != "ok" and gsm8k.cache_check("warm1", 78, 80) != "ok"


# ---------------------------------------------------------------- real server


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    from artifact.protocol.runner import execute_plan as execute_bridge

    cfg = with_workload(load_config("demo-smollm2-q4_1-cpu-gsm8k"), episodes=N_ITEMS, n_predict=N_PREDICT)
    results = tmp_path_factory.mktemp("results")
    dirs = execute_bridge(cfg, load_plan("bridge"), results)
    return cfg, results, dirs


@pytest.mark.server
def test_one_complete_run_with_bridge_manifest(bridge):
    cfg, results, dirs = bridge
    assert dirs == [results / cfg.name / "bridge" / "bridge-run1"]
    m = load_run(dirs[0]).manifest
    assert m["status"] == "complete" and m["finished_at"] and m["flagged_servings"] == 0
    assert (m["workload"], m["arm"], m["run"], m["session"], m["plan"]) == ("gsm8k", "bridge", 1, "bridge", "bridge")
    assert m["episodes"] == [f"gsm8k_test_{k:04d}" for k in range(N_ITEMS)]
    assert m["data"] == "gsm8k" and m["items_provenance"]["synthetic"] is False
    assert m["items_source"] == "bundled" and m["engine_build"] == "b10434-7e4c0a968"
    prov = m["items_provenance"]
    assert (
        prov["sha256"] == "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14" and prov["lines"] == 1319
    )
    assert prov["rows_sha256"].startswith("545c5bec3d31") and prov["commit"].startswith("3101c7d")
    assert m["model"]["sha256"] == cfg.model.sha256 and m["host"] and m["packages"] and m["fingerprint"]
    cmd = m["server_cmd"]
    assert cmd[cmd.index("-np") + 1] == "1" and cmd[cmd.index("--cache-ram") + 1] == "8192"
    assert (dirs[0].parent / m["server_log"]).is_file()


@pytest.mark.server
def test_servings_cold_identical_and_warm_hits(bridge):
    _, _, dirs = bridge
    run = load_run(dirs[0])
    by_item = run.requests_by_episode()
    assert list(by_item) == run.manifest["episodes"]
    for item_id, reqs in by_item.items():
        assert [r["serving"] for r in reqs] == SERVING_ORDER and [r["request_index"] for r in reqs] == [0, 1, 2, 3]
        assert all(r["item_id"] == r["episode_id"] == item_id and r["error"] is None for r in reqs)
        assert len({r["prompt_sha256"] for r in reqs}) == 1
        s = {r["serving"]: r for r in reqs}
        for r in reqs:
            assert r["cache_check"] == "ok", (item_id, r["serving"], r["cache_check"])
            assert r["output_tokens"] and 0 < r["n_predict"] <= N_PREDICT
            if r["serving"].startswith("cold"):
                assert r["cache_n"] == 0 and r["prompt_n"] == r["prompt_tokens"]
            else:
                assert r["cache_n"] >= r["prompt_tokens"] - 1
        assert s["cold1"]["output_tokens"] == s["cold2"]["output_tokens"], item_id  # recompute is deterministic
    eps = run.episodes
    assert [e["item_id"] for e in eps] == run.manifest["episodes"]
    refs = {i.item_id: i.answer for i in load_gsm8k_bundled(N_ITEMS)[0]}
    for e in eps:
        assert e["reference"] == refs[e["item_id"]] and e["flagged_servings"] == []
        assert sorted(e["servings"]) == sorted(SERVING_ORDER)
        assert all({"strict_correct", "numeric_correct", "extracted_numeric"} <= set(v) for v in e["servings"].values())


@pytest.mark.server
def test_tab3_row_from_the_run(bridge):
    _, results, _ = bridge
    df = tab3(find_runs(results))
    assert list(df["config"]) == ["demo-smollm2-q4_1-cpu-gsm8k", "pooled"]
    row = df.iloc[0].to_dict()
    print("\nTab. 3 row:", json.dumps({k: v for k, v in row.items()}, default=str))
    assert row["data"] == "gsm8k" and df.iloc[1]["data"] == "gsm8k"
    assert (row["N"], row["flagged_servings"], row["flagged_items"]) == (N_ITEMS, 0, 0)
    assert row["identical_cold1_cold2"] == f"{N_ITEMS}/{N_ITEMS}"
    assert 0 <= row["flips_numeric"] <= N_ITEMS and 0.0 <= row["mcnemar_p"] <= 1.0


@pytest.mark.server
def test_complete_run_is_reused_and_incomplete_run_rerun_whole(bridge):
    from artifact.protocol.runner import execute_plan as execute_bridge

    cfg, results, dirs = bridge
    before = (dirs[0] / "requests.jsonl").read_bytes()
    assert execute_bridge(cfg, load_plan("bridge"), results) == dirs  # complete: reused, no server started
    assert (dirs[0] / "requests.jsonl").read_bytes() == before

    one = with_workload(cfg, episodes=1, n_predict=8)
    res1 = results.parent / (results.name + "-resume")
    [d] = execute_bridge(one, load_plan("bridge"), res1)
    mf = json.loads((d / MANIFEST).read_text())
    (d / MANIFEST).write_text(json.dumps({**mf, "status": "incomplete"}))  # as if interrupted
    assert execute_bridge(one, load_plan("bridge"), res1) == [d]
    assert load_run(d).complete and len(load_run(d).requests) == 4
    moved = list((d.parent / DISCARDED).glob("*/bridge-run1"))
    assert len(moved) == 1 and load_run(moved[0]).manifest["status"] == "incomplete"
    assert tab3_row(load_run(d))["N"] == 1


def _tampered(run_dir, tmp_path, edit_episodes=None, edit_requests=None):
    """A copy of the run with its episode or request records edited (the manifest's labels left as they are)."""
    import shutil

    copy = tmp_path / "copy" / run_dir.name
    shutil.copytree(run_dir, copy)
    for name, edit in (("episodes.jsonl", edit_episodes), ("requests.jsonl", edit_requests)):
        if edit is None:
            continue
        rows = [json.loads(line) for line in (copy / name).read_text().splitlines() if line.strip()]
        (copy / name).write_text("".join(json.dumps(edit(r)) + "\n" for r in rows))
    return load_run(copy)


@pytest.mark.server
def test_items_are_held_against_the_split_not_their_labels(bridge, tmp_path):
    """The real run is GSM8K's by its prompts; a copy whose reference or prompt is not the split's row is refused."""
    _, _, dirs = bridge
    assert record_problem(load_run(dirs[0])) is None  # control: the run as made

    wrong_ref = _tampered(
        dirs[0], tmp_path / "a", edit_episodes=lambda e: {**e, "reference": "999999"} if e["index"] == 1 else e
    )
    assert "test row 1 answers" in record_problem(wrong_ref)

    other_prompt = _tampered(
        dirs[0],
        tmp_path / "b",
        edit_requests=lambda r: {**r, "prompt_sha256": "0" * 64} if r.get("item_id") == "gsm8k_test_0002" else r,
    )
    assert "is not the one GSM8K's test row 2 gives" in record_problem(other_prompt)

    moved = _tampered(
        dirs[0],
        tmp_path / "c",
        edit_requests=lambda r: {**r, "item_id": "gsm8k_test_0001"} if r.get("item_id") == "gsm8k_test_0000" else r,
    )
    assert "is not the one GSM8K's test row 1 gives" in record_problem(moved)
