"""The embedded agent model: its training data (BFCL oracle trajectories of held-out episodes only), the recipe that
derives it (pins consistent everywhere), the trajectories recorded per episode and what the analyses read from
them (tool-call share, the report's call flip), and the exact comparison of runs made by two builds."""

import io
import json

import pytest

from artifact.agent import data, derive
from artifact.analysis import reproduce
from artifact.analysis.agent import agent_row
from artifact.analysis.tables import call_flip, divergence_example, group_runs
from artifact.config import CONFIG_DIR, load_config
from artifact.errors import ArtifactError
from artifact.weights import sha256_file
from artifact.workloads import bfcl

RECIPE = "smollm2-135m-bfcl-agent"


def test_training_episodes_are_the_held_out_ones_only():
    ids = [e.id for e in data.held_out_episodes()]
    assert ids[0] == "multi_turn_base_80" and ids[-1] == "multi_turn_base_199" and len(ids) == 120
    evaluated = {e.id for e in bfcl.load_episodes(80)}
    assert not evaluated & set(ids)


def test_oracle_pairs_are_bfcls_own_prompts_with_ground_truth_replies():
    episodes = data.held_out_episodes()[:2]
    pairs, verdicts = data.oracle_pairs(episodes)
    turns = sum(len(e.ground_truth) for e in episodes)
    assert len(pairs) == 2 * turns  # every turn: the calls, then the closing reply
    first = pairs[0]
    assert first["prompt"].startswith("<|im_start|>system\n") and first["prompt"].endswith("<|im_start|>assistant\n")
    assert first["reply"] == bfcl.oracle_call_text(episodes[0].ground_truth[0])
    assert pairs[1]["reply"] == bfcl.ORACLE_CLOSING_REPLY and "<tool_response>" in pairs[1]["prompt"]
    assert set(verdicts) == {e.id for e in episodes}


def test_oracle_trajectory_is_recorded_per_request():
    episode = bfcl.load_episodes(2)[1]
    result = bfcl.run_episode(episode, "qwen", "ep_agent_1", bfcl.oracle_query(episode), prompt_variant="python",
                              max_steps_per_turn=20, log=io.StringIO())
    assert result.verdict == "valid" and len(result.steps) == result.n_requests
    assert [(s["turn"], s["step"]) for s in result.steps[:2]] == [(0, 0), (0, 1)]
    assert result.steps[0]["calls"] == episode.ground_truth[0] and result.steps[0]["observations"]
    assert result.steps[1]["calls"] is None and result.steps[1]["observations"] == []


def test_recipe_pins_the_adapter_and_every_configuration_agrees_with_its_products():
    recipe = derive.load_recipe(RECIPE)
    assert sha256_file(derive.RECIPES / recipe["adapter"]["file"]) == recipe["adapter"]["sha256"]
    assert recipe["data"]["pairs"] == 945 and "80..multi_turn_base_199" in recipe["data"]["episodes"]
    used = 0
    for path in sorted(CONFIG_DIR.rglob("*.toml")):
        if path.name == "plans.toml" or "derived:" not in path.read_text():
            continue
        cfg = load_config(str(path))
        name, level = derive.parse_source(cfg.model.source)
        assert name == RECIPE and cfg.model.sha256 == recipe["products"][level], path
        used += 1
    assert used >= 5  # the CPU demo and the four H200 levels


@pytest.mark.parametrize("source", ["derived:", "derived:x", "derived:x/", "derived:../x/F16", "derived:x/a/b"])
def test_a_malformed_derived_source_is_a_one_line_error(source):
    with pytest.raises(ArtifactError, match="derived:<recipe>/<LEVEL>"):
        derive.parse_source(source)


def test_an_unknown_recipe_or_level_is_refused():
    with pytest.raises(ArtifactError, match="unknown derived model recipe 'nope'"):
        derive.load_recipe("nope")
    with pytest.raises(ArtifactError, match="no pinned level Q2_K"):
        derive.make(derive.load_recipe(RECIPE), "Q2_K")


def test_products_are_named_after_their_adapter():
    recipe = derive.load_recipe(RECIPE)
    assert recipe["adapter"]["sha256"][:12] in derive.product_name(recipe, "Q4_K_M")


@pytest.mark.server
def test_derivation_makes_the_pinned_bytes_and_refuses_a_tampered_product(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_MODELS", str(tmp_path))
    recipe = derive.load_recipe(RECIPE)
    path, digests = derive.make(recipe, "Q4_K_M")
    assert digests == {k: recipe["products"][k] for k in ("base-F16", "F16", "Q4_K_M")}
    with open(path, "r+b") as fh:  # one flipped byte in the product
        fh.seek(4096)
        b = fh.read(1)
        fh.seek(4096)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(ArtifactError, match="derived smollm2-135m-bfcl-agent Q4_K_M has sha256"):
        derive.make(recipe, "Q4_K_M")
    assert not path.exists() and path.with_name(path.name + ".mismatch").exists()
    assert derive.make(recipe, "Q4_K_M")[0] == path  # made again from the pinned inputs


STEPS = {"e0": [{"calls": ["ls()"], "observations": ["a"]}, {"calls": None, "observations": []}],
         "e1": [{"calls": None, "observations": []}]}


def test_tool_call_share_and_requests_per_episode_come_from_the_trajectory(make_run):
    run = make_run("off", 1, {"e0": [[1], [2]], "e1": [[3]]}, steps=STEPS)
    a = agent_row(run)
    assert (a["episodes_with_tool_call"], a["calls_executed"], a["requests_per_episode"]) == (1, 1, 1.5)
    assert a["source"] == "steps" and a["requests_past_step_0"] == 1


def test_older_records_without_a_trajectory_count_requests_past_step_0(make_run):
    a = agent_row(make_run("off", 1, {"e0": [[1], [2]], "e1": [[3]]}))
    assert a["episodes_with_tool_call"] == 1 and a["calls_executed"] is None and a["source"].startswith("requests")


def test_the_report_prefers_a_flip_that_changed_a_call_and_what_the_model_saw_next(make_run):
    same = {"e0": [{"calls": ["ls()"], "observations": ["a"]}]}
    off = make_run("off", 1, {"e0": [[1, 2]], "e1": [[5, 6]]},
                   steps={**same, "e1": [{"calls": ["cd(folder='x')"], "observations": ["ok"]}]})
    on = make_run("on", 1, {"e0": [[1, 3]], "e1": [[5, 7]]},
                  steps={"e0": [{"calls": ["ls(a=True)"], "observations": ["a"]}],
                         "e1": [{"calls": ["cd(folder='y')"], "observations": ["no such folder"]}]})
    g = group_runs([off, on])[0]
    pair = g.headline("on_vs_off")
    kinds = {d.episode_id: call_flip(pair, d) for d in pair.cmp.diverged}
    assert kinds == {"e0": "call", "e1": "observation"}
    ex = divergence_example([g])
    assert ex["episode_id"] == "e1" and ex["call_flip"] == "observation"
    assert ex["sides"][0]["trajectory"][0]["observations"] in (["ok"], ["no such folder"])


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


def test_the_demo_rechecks_the_committed_gpu_evidence_beside_its_own_verdicts(tmp_path, capsys):
    import shutil

    from artifact import cli
    from artifact.check.run import run_check
    from synthetic_runs import write_bfcl_run

    live = tmp_path / "results"
    for arm in ("off", "on"):
        for k in (1, 2):
            write_bfcl_run(live, arm, k, {"e0": [[1, 2]]})
    run_check(live, quiet=True)
    cli.recheck_evidence(live)
    out = capsys.readouterr().out
    assert "committed H200 records (h200-agent, re-checked)" in out
    assert any(line.startswith("RQ3") and line.rstrip().endswith("PASS") for line in out.splitlines())
    assert (live / "check-evidence" / "check.json").exists()
    shutil.rmtree(live / "check-evidence")
