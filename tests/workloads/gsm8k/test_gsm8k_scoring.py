"""Strict and numeric GSM8K scoring on tricky response texts, and answer-flip counting."""

import pytest

from artifact.workloads.gsm8k.scoring import (
    ANSWER_INSTRUCTION,
    ANSWER_LINE_RE,
    answer_flips,
    canonical,
    parse_number,
    score_numeric,
    score_strict,
)
from fractions import Fraction


def test_instruction_names_the_format_the_strict_regex_accepts():
    assert '"Answer: <number>"' in ANSWER_INSTRUCTION
    assert ANSWER_LINE_RE.fullmatch("Answer: 1,234").group(1) == "1,234"
    assert ANSWER_LINE_RE.fullmatch("Answer: $5") is None


# (response text, reference, strict extracted, numeric extracted, numeric rule)
CASES = [
    ("24 + 18 = 42 apples.\nAnswer: 42", "42", "42", "42", "answer_marker"),
    ("Answer: 1,234", "1234", "1234", "1234", "answer_marker"),
    ("Answer: $1,234.00", "1234", None, "1234", "answer_marker"),
    ("She pays 3 * 400 = 1200 dollars.\n1,200", "1200", None, "1200", "last_number"),
    ("The answer is 18 apples.", "18", None, "18", "last_number"),
    ("Answer: 5\nI hope this helps! Ask me if you want 2 more examples.", "5", None, "5", "answer_marker"),
    ("The temperature drops 10 - 13 degrees... it ends at -3.\nAnswer: -3", "-3", "-3", "-3", "answer_marker"),
    ("Each gets 25 / 2 = 12.5 liters.\nAnswer: 12.50", "12.5", "12.5", "12.5", "answer_marker"),
    ("Answer: 12.0", "12", "12", "12", "answer_marker"),
    ("Total: $1,234.50 in all.", "1234.5", None, "1234.5", "last_number"),
    ("So 3 + 4 = 7.\n#### 7", "7", None, "7", "hash_marker"),
    ("Thus \\boxed{1,000} pencils, from 20 * 50.", "1000", None, "1000", "boxed"),
    ("\\boxed{18 \\text{ apples}}", "18", None, "18", "boxed"),
    ("It is 25% of 80, so 20%.", "20", None, "20", "last_number"),
    ("**Answer:** 42", "42", None, "42", "answer_marker"),
    ("answer: 7 cookies", "7", None, "7", "answer_marker"),
    ("Answer: 18.", "18", None, "18", "answer_marker"),
    ("Answer: 7 apples", "7", None, "7", "answer_marker"),
    ("  Answer: 64  \n\n", "64", "64", "64", "answer_marker"),
    ("Answer: 1234567", "1,234,567", "1234567", "1234567", "answer_marker"),
    ("Answer:\n15", "15", None, "15", "last_number"),
]


@pytest.mark.parametrize("text,reference,strict,numeric,rule", CASES)
def test_extraction_and_correctness(text, reference, strict, numeric, rule):
    s = score_strict(text, reference)
    n = score_numeric(text, reference)
    assert (s.extracted, s.correct) == (strict, strict is not None)
    assert (n.extracted, n.correct, n.rule) == (numeric, True, rule)


def test_demanded_format_with_wrong_value_is_wrong_for_both():
    assert score_strict("Answer: 41", "42").correct is False
    assert score_strict("Answer: 41", "42").extracted == "41"
    assert score_numeric("I first got 42, but Answer: 41", "42").correct is False


def test_answer_marker_beats_later_numbers_and_last_marker_wins():
    text = "Answer: 10\nWait, recheck.\nAnswer: 12\nThat was 2 steps."
    assert score_numeric(text, "12").extracted == "12"
    assert score_strict(text, "12").correct is False  # the last line is chatter


def test_several_numbers_without_any_marker_takes_the_last():
    text = "Tom has 3 boxes of 12 eggs, that is 36 eggs; he sells 20 so 16 remain."
    assert score_numeric(text, "16").extracted == "16"
    assert score_numeric(text, "36").correct is False


def test_minus_between_numbers_is_not_a_sign():
    assert score_numeric("20 - 5", "5").extracted == "5"
    assert score_numeric("20-5", "5").extracted == "5"
    assert score_numeric("x = -5", "-5").correct is True


def test_empty_and_missing_text():
    for text in ("", None, "   \n", "no numbers here"):
        for scorer in (score_strict, score_numeric):
            result = scorer(text, "5")
            assert (result.extracted, result.correct) == (None, False)


def test_exact_comparison_without_float_fuzz():
    assert score_numeric("Answer: 0.30000000000000004", "0.3").correct is False
    assert score_numeric("Answer: 0.3", "0.30").correct is True
    assert parse_number("$1,234.50") == Fraction(2469, 2)
    assert canonical(Fraction(2469, 2)) == "1234.5"
    assert canonical(Fraction(-3)) == "-3"


def test_reference_must_be_a_number():
    with pytest.raises(ValueError):
        score_numeric("Answer: 3", "three")
    assert score_numeric("Answer: 3", 3).correct is True


def test_answer_flips_counts_each_direction():
    path_a = [True, True, False, False, True]
    path_b = [True, False, True, True, True]
    assert answer_flips(path_a, path_b) == (1, 2)  # b: A only, c: B only
    assert answer_flips(path_b, path_a) == (2, 1)
    assert answer_flips([], []) == (0, 0)
    with pytest.raises(ValueError):
        answer_flips([True], [True, False])


def test_strict_scoring_inflates_flips_on_format_drift():
    reference = "1234"
    cold = ["Answer: 1,234", "Answer: 1234", "Answer: 1234"]
    warm = ["Answer: $1,234", "The answer is 1234.", "Answer: 1234"]
    strict = answer_flips(
        [score_strict(t, reference).correct for t in cold], [score_strict(t, reference).correct for t in warm]
    )
    numeric = answer_flips(
        [score_numeric(t, reference).correct for t in cold], [score_numeric(t, reference).correct for t in warm]
    )
    assert strict == (2, 0)
    assert numeric == (0, 0)
