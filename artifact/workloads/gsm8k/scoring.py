"""GSM8K bridge scoring (RQ5): a strict and a numeric scorer, and answer flips between two paths.

The prompt demands a last line ``Answer: <number>`` (``ANSWER_INSTRUCTION``).

* ``score_strict`` counts only that format: the last non-empty line must be exactly
  ``Answer: <number>``, where <number> is an optional minus sign, digits with optional comma
  thousands separators, and an optional decimal part (no ``$``, units or trailing period).
* ``score_numeric`` re-derives the final number from the text by the first rule that finds one:
  the last ``Answer:`` marker with a number on its line (any case, anywhere), else GSM8K's
  ``#### N``, else the last ``\\boxed{N}``, else the last number in the text; ``$``, ``%``,
  units, commas and a trailing period are dropped.

Both compare values exactly as fractions.Fraction, so ``12.0`` == ``12`` and ``1,234.50`` ==
``1234.5`` without float rounding. The paper found that strict scoring alone inflated the
answer-flip count about fourfold; report both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction

ANSWER_INSTRUCTION = (
    "Solve the problem step by step. End your response with a last line of the form "
    '"Answer: <number>", where <number> is the final numeric answer, without units or currency signs.'
)

NUMBER_PATTERN = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# The demanded last line; use with fullmatch on the stripped last non-empty line.
ANSWER_LINE_RE = re.compile(rf"Answer:[ \t]*({NUMBER_PATTERN})")

# A number in free text: optional sign touching it (not after a word character, so "3-5" and
# "10 - 5" read as 3, 5 and 10, 5), optional "$", digits with optional comma thousands separators and decimal part.
_LOOSE_NUMBER_RE = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212]?)(?:\$\s?)?(?P<digits>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)(?!\d)"
)
_ANSWER_MARKER_RE = re.compile(r"answer\s*:", re.IGNORECASE)
_HASH_MARKER_RE = re.compile(r"####")
_BOXED_RE = re.compile(r"\\boxed\s*\{")


@dataclass(frozen=True)
class Score:
    """One scored response: ``extracted`` is the canonical number found (None if none),
    ``rule`` names how it was found (None if nothing was)."""

    extracted: str | None
    correct: bool
    rule: str | None = None


def parse_number(text: str) -> Fraction | None:
    """The first number in ``text`` as an exact Fraction (``"$1,234.50"`` -> 2469/2), else None."""
    match = _LOOSE_NUMBER_RE.search(text)
    if match is None:
        return None
    value = Fraction(match.group("digits").replace(",", ""))
    return -value if match.group("sign") else value


def canonical(value: Fraction) -> str:
    """Plain decimal string of a value: ``1234``, ``-3``, ``1234.5``."""
    if value.denominator == 1:
        return str(value.numerator)
    with localcontext() as ctx:
        ctx.prec = 60
        quotient = Decimal(value.numerator) / Decimal(value.denominator)
    return format(quotient.normalize(), "f")


def _reference_value(reference: str | int) -> Fraction:
    value = parse_number(str(reference))
    if value is None:
        raise ValueError(f"reference answer is not a number: {reference!r}")
    return value


def _result(value: Fraction | None, reference: str | int, rule: str | None) -> Score:
    if value is None:
        return Score(None, False, None)
    return Score(canonical(value), value == _reference_value(reference), rule)


def score_strict(text: str | None, reference: str | int) -> Score:
    """Correct only if the last non-empty line is exactly ``Answer: <number>`` with the right value."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    match = ANSWER_LINE_RE.fullmatch(lines[-1]) if lines else None
    value = Fraction(match.group(1).replace(",", "")) if match else None
    return _result(value, reference, "answer_line")


def _after_markers(text: str, marker: re.Pattern[str]) -> Fraction | None:
    """The number on the line after the last ``marker`` that has one."""
    for match in reversed(list(marker.finditer(text))):
        value = parse_number(text[match.end() :].split("\n", 1)[0])
        if value is not None:
            return value
    return None


def _boxed(text: str) -> Fraction | None:
    """The first number inside the last ``\\boxed{...}`` that has one (nested braces allowed)."""
    for match in reversed(list(_BOXED_RE.finditer(text))):
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        value = parse_number(text[match.end() : end - 1 if depth == 0 else end])
        if value is not None:
            return value
    return None


def _last_number(text: str) -> Fraction | None:
    matches = list(_LOOSE_NUMBER_RE.finditer(text))
    return parse_number(matches[-1].group(0)) if matches else None


def score_numeric(text: str | None, reference: str | int) -> Score:
    """Re-derive the final number from the text (see the module docstring) and compare exactly."""
    text = text or ""
    rules = (
        ("answer_marker", lambda t: _after_markers(t, _ANSWER_MARKER_RE)),
        ("hash_marker", lambda t: _after_markers(t, _HASH_MARKER_RE)),
        ("boxed", _boxed),
        ("last_number", _last_number),
    )
    for name, rule in rules:
        value = rule(text)
        if value is not None:
            return _result(value, reference, name)
    return Score(None, False, None)


def answer_flips(ref_correct: list[bool], other_correct: list[bool]) -> tuple[int, int]:
    """Discordant pairs between path A (``ref_correct``) and path B (``other_correct``), per item.

    Returns (b, c): b = items correct on path A only, c = items correct on path B only; these are
    the McNemar off-diagonal counts. Both lists must be aligned item by item.
    """
    if len(ref_correct) != len(other_correct):
        raise ValueError(f"paths differ in length: {len(ref_correct)} vs {len(other_correct)}")
    b = sum(1 for a, o in zip(ref_correct, other_correct) if a and not o)
    c = sum(1 for a, o in zip(ref_correct, other_correct) if o and not a)
    return b, c
