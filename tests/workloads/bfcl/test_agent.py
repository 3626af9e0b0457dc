"""The embedded agent model's workload side: its training data (BFCL oracle trajectories of held-out episodes only),
the trajectories recorded per episode, and what the analyses read from them (tool-call share, the report's call
flip)."""

import io

from artifact.analysis.tables import group_runs
from artifact.report.example import call_flip, divergence_example
from artifact.workloads.bfcl import driver as bfcl
from artifact.workloads.bfcl import oracle as data
from artifact.workloads.bfcl.tables import agent_row


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
    result = bfcl.run_episode(
        episode,
        "qwen",
        "ep_agent_1",
        bfcl.oracle_query(episode),
        prompt_variant="python",
        max_steps_per_turn=20,
        log=io.StringIO(),
    )
    assert result.verdict == "valid" and len(result.steps) == result.n_requests
    assert [(s["turn"], s["step"]) for s in result.steps[:2]] == [(0, 0), (0, 1)]
    assert result.steps[0]["calls"] == episode.ground_truth[0] and result.steps[0]["observations"]
    assert result.steps[1]["calls"] is None and result.steps[1]["observations"] == []


STEPS = {
    "e0": [{"calls": ["ls()"], "observations": ["a"]}, {"calls": None, "observations": []}],
    "e1": [{"calls": None, "observations": []}],
}


def test_tool_call_share_and_requests_per_episode_come_from_the_trajectory(make_run):
    run = make_run("off", 1, {"e0": [[1], [2]], "e1": [[3]]}, steps=STEPS)
    a = agent_row(run)
    assert (a["episodes_with_tool_call"], a["calls_executed"], a["requests_per_episode"]) == (1, 1, 1.5)
    assert a["source"] == "steps" and a["requests_past_step_0"] == 1


def test_older_records_without_a_trajectory_count_requests_past_step_0(make_run):
    a = agent_row(make_run("off", 1, {"e0": [[1], [2]], "e1": [[3]]}))
    assert a["episodes_with_tool_call"] == 1 and a["calls_executed"] is None and a["source"].startswith("requests")
    assert a["calls_returned_error"] is None and a["episodes_with_successful_call"] is None


def test_executed_is_not_worked_calls_that_returned_an_error_are_counted(make_run):
    """A call BFCL's executor could not run (`Error during execution: ...`) and one whose tool answered an error
    object are executed calls that returned an error; an episode counts as having a successful call only with a call
    that returned neither."""
    steps = {
        "e0": [
            {
                "calls": ["move()", "cd(folder='x')"],
                "observations": [
                    "Error during execution: name 'move' is not defined",
                    '{"error": "cd: \'x\': No such file or directory"}',
                ],
            }
        ],
        "e1": [{"calls": ["ls()"], "observations": ['{"current_directory_content": []}']}],
        "e2": [{"calls": None, "observations": []}],
    }
    a = agent_row(make_run("off", 1, {"e0": [[1]], "e1": [[2]], "e2": [[3]]}, steps=steps))
    assert (a["episodes_with_tool_call"], a["calls_executed"], a["calls_returned_error"], a["calls_raised"]) == (
        2,
        3,
        2,
        1,
    )
    assert a["episodes_with_successful_call"] == 1


def test_the_report_prefers_a_flip_that_changed_a_call_and_what_the_model_saw_next(make_run):
    same = {"e0": [{"calls": ["ls()"], "observations": ["a"]}]}
    off = make_run(
        "off",
        1,
        {"e0": [[1, 2]], "e1": [[5, 6]]},
        steps={**same, "e1": [{"calls": ["cd(folder='x')"], "observations": ["ok"]}]},
    )
    on = make_run(
        "on",
        1,
        {"e0": [[1, 3]], "e1": [[5, 7]]},
        steps={
            "e0": [{"calls": ["ls(a=True)"], "observations": ["a"]}],
            "e1": [{"calls": ["cd(folder='y')"], "observations": ["no such folder"]}],
        },
    )
    g = group_runs([off, on])[0]
    pair = g.headline("on_vs_off")
    kinds = {d.episode_id: call_flip(pair, d) for d in pair.cmp.diverged}
    assert kinds == {"e0": "call", "e1": "observation"}
    ex = divergence_example([g])
    assert ex["episode_id"] == "e1" and ex["call_flip"] == "observation"
    assert ex["sides"][0]["trajectory"][0]["observations"] in (["ok"], ["no such folder"])
