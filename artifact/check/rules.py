"""The claims' rules as prose (artifact/check/claims/rules.toml): each claim's statement, hardness, rule and minimum
evidence, the value band's rule, and the fixed words of a claim's verdicts ([text.ID]). Read once; a claim module takes its own by its ID."""

from __future__ import annotations

from typing import Any
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

PATH = Path(__file__).resolve().parent / "claims" / "rules.toml"
with PATH.open("rb") as _fh:
    RULES: dict[str, Any] = tomllib.load(_fh)

BAND_RULE: str = RULES["band"]["rule"]


def rule(claim_id: str) -> dict[str, Any]:
    """statement, hard, rule, minimum_evidence of one claim (a copy: check.json carries it)."""
    return dict(RULES[claim_id])


def text(claim_id: str) -> dict[str, Any]:
    """The fixed words of one claim's verdicts ([text.ID]; none: {})."""
    return dict(RULES.get("text", {}).get(claim_id, {}))
