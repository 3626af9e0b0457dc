"""BFCL driver with the real bfcl_eval package: ordering, namespaces, prompt variants, an oracle episode."""

import io

import pytest

from artifact.workloads.bfcl import driver as bfcl
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils


def cached_instances():
    return [k for k in vars(multi_turn_utils) if k.endswith("_instance")]


def oracle(episode, log=None):
    """Feeds the ground-truth calls of each turn as the model's text, then a non-call reply to end the turn."""
    prompts = []

    def query(prompt, turn, step):
        prompts.append((turn, step, prompt))
        text = "[" + ", ".join(episode.ground_truth[turn]) + "]" if step == 0 else "Done."
        return text, 0, 0

    return query, prompts


def test_first_episodes_follow_bfcl_numeric_id_order():
    ids = [e.id for e in bfcl.load_episodes(12)]
    assert ids == [f"multi_turn_base_{i}" for i in range(12)]  # not 0, 1, 10, 100, ... (lexicographic)


def test_max_turns_cuts_question_and_ground_truth_alike():
    full, cut = bfcl.load_episodes(1)[0], bfcl.load_episodes(1, max_turns=2)[0]
    assert len(full.ground_truth) == 4 and len(cut.ground_truth) == 2
    assert cut.entry["question"] == full.entry["question"][:2]


def test_oracle_episode_scores_valid_through_the_driver_and_leaves_no_instances():
    episode = bfcl.load_episodes(2)[1]  # multi_turn_base_1: keyword-argument ground truth
    query, prompts = oracle(episode)
    result = bfcl.run_episode(
        episode, "qwen", "ep_t_1", query, prompt_variant="default", max_steps_per_turn=20, log=io.StringIO()
    )
    assert result.verdict == "valid" and result.error is None
    assert result.n_turns == len(episode.ground_truth) and result.n_requests == 2 * len(episode.ground_truth)
    assert [(t, s) for t, s, _ in prompts][:3] == [(0, 0), (0, 1), (1, 0)]
    assert prompts[0][2].startswith("<|im_start|>system\nYou are an expert in composing functions.")
    assert "<tool_response>" in prompts[1][2]  # BFCL's QwenHandler renders tool results
    assert cached_instances() == []


def test_a_wrong_episode_is_not_valid_and_does_not_leak_state_into_the_next():
    episode = bfcl.load_episodes(2)[1]

    def wrong(prompt, turn, step):
        return ("[mkdir(dir_name='leftover')]" if step == 0 else "Done.", 0, 0)

    r1 = bfcl.run_episode(
        episode, "qwen", "ep_t_2", wrong, prompt_variant="default", max_steps_per_turn=20, log=io.StringIO()
    )
    assert r1.verdict.startswith("multi_turn:")
    query, prompts = oracle(episode)
    r2 = bfcl.run_episode(
        episode, "qwen", "ep_t_3", query, prompt_variant="default", max_steps_per_turn=20, log=io.StringIO()
    )
    assert r2.verdict == "valid"
    assert not any("leftover" in p for _, _, p in prompts)
    assert cached_instances() == []


def test_purge_removes_only_its_own_namespace():
    vars(multi_turn_utils)["ep_x_1_foo_instance"] = object()
    vars(multi_turn_utils)["ep_x_10_foo_instance"] = object()
    try:
        assert bfcl.purge_instances("ep_x_1") == 1
        assert "ep_x_10_foo_instance" in vars(multi_turn_utils)
    finally:
        bfcl.purge_instances("ep_x_10")


def test_python_prompt_variant_is_bfcls_shorter_function_doc_format():
    episode = bfcl.load_episodes(1)[0]
    lengths = {}
    for variant in ("default", "python"):
        query, prompts = oracle(episode)
        bfcl.run_episode(
            episode, "qwen", f"ep_v_{variant}", query, prompt_variant=variant, max_steps_per_turn=20, log=io.StringIO()
        )
        lengths[variant] = len(prompts[0][2])
        if variant == "default":
            assert "Here is a list of functions in json format" in prompts[0][2]
        else:
            assert "Here is a list of functions in python format" in prompts[0][2]
    assert 2.0 < lengths["default"] / lengths["python"] < 3.0


def test_step_limit_force_terminates_like_bfcl_and_is_restored():
    episode = bfcl.load_episodes(2)[1]

    def always_call(prompt, turn, step):
        return ("[ls(a=True)]", 0, 0)

    result = bfcl.run_episode(
        episode, "qwen", "ep_t_4", always_call, prompt_variant="default", max_steps_per_turn=2, log=io.StringIO()
    )
    assert result.verdict == "multi_turn:force_terminated"
    assert result.n_requests == 3  # BFCL quits when the step count exceeds the limit
    assert bfcl.base_handler.MAXIMUM_STEP_LIMIT == bfcl.BFCL_STEP_LIMIT == 20


def test_request_failure_ends_the_episode_as_bfcl_inference_error():
    episode = bfcl.load_episodes(1)[0]

    def failing(prompt, turn, step):
        raise RuntimeError("context overflow")

    result = bfcl.run_episode(
        episode, "qwen", "ep_t_5", failing, prompt_variant="default", max_steps_per_turn=20, log=io.StringIO()
    )
    assert result.verdict == "multi_turn:inference_error"
    assert "context overflow" in result.error and result.n_requests == 1
    assert cached_instances() == []


@pytest.mark.parametrize(
    "messages, expected",
    [
        ([{"role": "system"}, {"role": "user"}], (0, 0)),
        ([{"role": "system"}, {"role": "user"}, {"role": "assistant"}, {"role": "tool"}], (0, 1)),
        (
            [
                {"role": "user"},
                {"role": "assistant"},
                {"role": "user"},
                {"role": "assistant"},
                {"role": "ipython"},
                {"role": "assistant"},
                {"role": "tool"},
            ],
            (1, 2),
        ),
    ],
)
def test_position_counts_turns_and_steps(messages, expected):
    assert bfcl.position(messages) == expected


def test_a_server_failure_is_fatal_for_the_run_not_an_episode_error():
    from artifact.errors import ArtifactError

    def server_gone(prompt, turn, step):
        raise ArtifactError("llama-server stopped answering")

    with pytest.raises(ArtifactError, match="stopped answering"):
        bfcl.run_episode(
            bfcl.load_episodes(1)[0],
            "qwen",
            "ep_t_6",
            server_gone,
            prompt_variant="default",
            max_steps_per_turn=20,
            log=io.StringIO(),
        )
    assert cached_instances() == []


def test_the_reused_handler_carries_no_prompt_variant_into_the_next_episode():
    episode = bfcl.load_episodes(1, max_turns=1)[0]

    def first(variant):
        return oracle_first_prompt(episode, variant)

    default_before = first("default")
    python = first("python")
    assert python != default_before
    assert first("default") == default_before  # the python variant did not stick to the shared handler


def oracle_first_prompt(episode, variant):
    query, prompts = oracle(episode)
    bfcl.run_episode(
        episode, "qwen", f"ep_v_{variant}", query, prompt_variant=variant, max_steps_per_turn=20, log=io.StringIO()
    )
    return prompts[0][2]
