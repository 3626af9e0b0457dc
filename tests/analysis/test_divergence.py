from artifact.analysis.divergence import cache_exposure, compare_runs, first_difference, validity_problems


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix diverges where the shorter ends
    assert first_difference([], [5]) == 0


def test_identical_runs_do_not_diverge(make_run):
    eps = {"e0": [[1, 2], [3]], "e1": [[4]]}
    c = compare_runs(make_run("off", 1, eps), make_run("off", 2, eps))
    assert (c.k, c.n, c.flags) == (0, 2, [0, 0])
    assert c.median_first_request is None and c.prompt_mismatches == []


def test_token_divergence_reports_first_request_and_token(make_run):
    a = make_run("on", 1, {"e0": [[1, 2, 3], [4, 5]], "e1": [[1], [2, 3, 4]], "e2": [[7]]})
    b = make_run("off", 1, {"e0": [[1, 2, 3], [4, 6]], "e1": [[9], [2, 3, 4]], "e2": [[7]]})
    c = compare_runs(a, b)
    assert [(d.episode_id, d.first_request, d.first_token) for d in c.diverged] == [("e0", 1, 1), ("e1", 0, 0)]
    assert c.flags == [1, 1, 0]
    assert c.median_first_request == 0.5 and c.median_first_token == 0.5


def test_different_request_count_diverges_even_when_shared_requests_agree(make_run):
    c = compare_runs(make_run("on", 1, {"e0": [[1], [2]]}), make_run("on", 2, {"e0": [[1], [2], [3]]}))
    d = c.diverged[0]
    assert (d.first_request, d.first_token, d.n_requests) == (2, None, (2, 3))


def test_episodes_in_one_run_only_are_reported_not_compared(make_run):
    c = compare_runs(make_run("on", 1, {"e0": [[1]], "e1": [[2]]}), make_run("off", 1, {"e0": [[1]], "e2": [[3]]}))
    assert c.n == 1 and c.only_in_a == ["e1"] and c.only_in_b == ["e2"]


def test_identical_outputs_with_different_prompts_are_flagged(make_run):
    a = make_run("off", 1, {"e0": [[1], [2]]})
    b = make_run("off", 2, {"e0": [[1], [2]]}, prompts={("e0", 1): "something else"})
    c = compare_runs(a, b)
    assert c.k == 0 and c.prompt_mismatches == ["e0"]


def test_cache_exposure_and_off_run_validity(make_run):
    on = make_run("on", 1, {"e0": [[1], [2], [3]]}, cache_n=60)
    exp = cache_exposure(on)
    assert (exp.prompt_tokens, exp.cached_tokens, exp.requests_with_cache) == (300, 120, 2)
    assert abs(exp.share - 0.4) < 1e-12
    assert validity_problems(on) == []
    bad_off = make_run("off", 1, {"e0": [[1], [2]]}, cache_n=5)
    assert any("served cached tokens" in p for p in validity_problems(bad_off))
    unfinished = make_run("off", 2, {"e0": [[1]]}, complete=False)
    assert any("incomplete" in p for p in validity_problems(unfinished))
