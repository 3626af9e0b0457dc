"""The status words and the one verdict type, for the paper's claims (artifact/check/) and the verdicts beyond the
paper (artifact/analysis/) alike. A low module: it imports nothing of the artifact's.

A status is one of
  PASS          the claim holds on these results, on at least the evidence its rule names as its minimum;
  FAIL          the results contradict it (evidence against the claim, not merely too little evidence for it);
  OUT-OF-BAND   (paper claims) the direction holds but a rate differs from the paper's value for the same
                configuration by more than sampling error allows; a statement about magnitude, never a failure;
  INCONCLUSIVE  the runs the claim needs are there and valid, but hold less evidence than the claim's minimum;
  INVALID       the runs the claim needs are there but cannot be used as evidence;
  NOT-RUN       the runs the claim needs are not in the results.
A claim that needs runs which did not happen is NOT-RUN, never PASS (artifact/check/core.py says how each paper
claim's status is rolled up from its scopes').
"""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, OUT, INCONCLUSIVE, INVALID, NOT_RUN = "PASS", "FAIL", "OUT-OF-BAND", "INCONCLUSIVE", "INVALID", "NOT-RUN"

STATUSES = (PASS, FAIL, OUT, INCONCLUSIVE, INVALID, NOT_RUN)

SEVERITY = (FAIL, INVALID, INCONCLUSIVE, OUT, PASS, NOT_RUN)  # a claim takes the first of its scopes' statuses

TESTED = (PASS, FAIL, OUT)  # statuses of a claim that was tested (judged on enough valid evidence)


@dataclass
class Verdict:
    """One verdict row: a claim on one scope (a configuration-plan, a model series, a paper value, or 'all').

    A paper claim's row (artifact/check/claims/) has its `kind` (direction | band | hard | trend | pooled), the
    expected value and the band; its statement is its Claim's. A verdict beyond the paper (artifact/analysis/)
    carries its own `statement` and no kind. `as_dict` gives each the form check.json has always had."""

    id: str  # RQ1 ... RQ5, or BEYOND-...
    scope: str
    status: str
    observed: str
    evidence: list[str] = field(default_factory=list)
    statement: str = ""  # beyond the paper: what is claimed
    kind: str = ""  # paper claims only
    expected: str = ""
    band: str = ""

    @classmethod
    def of_claim(
        cls,
        claim: str,
        scope: str,
        kind: str,
        status: str,
        observed: str,
        expected: str,
        band: str,
        evidence: list[str] | None = None,
    ) -> "Verdict":
        """A paper claim's row."""
        return cls(claim, scope, status, observed, list(evidence or []), kind=kind, expected=expected, band=band)

    @classmethod
    def beyond(
        cls, id: str, statement: str, scope: str, status: str, observed: str, evidence: list[str] | None = None
    ) -> "Verdict":
        """A verdict beyond the paper."""
        return cls(id, scope, status, observed, list(evidence or []), statement=statement)

    @property
    def claim(self) -> str:
        """A paper claim's row names its claim by id; a verdict beyond the paper by its statement."""
        return self.id if self.kind else self.statement

    def as_dict(self) -> dict:
        if self.kind:  # check.json claims[].details[]
            return {
                "claim": self.id,
                "scope": self.scope,
                "kind": self.kind,
                "status": self.status,
                "observed": self.observed,
                "expected": self.expected,
                "band": self.band,
                "evidence": list(self.evidence),
            }
        return {
            "id": self.id,
            "claim": self.statement,
            "scope": self.scope,
            "status": self.status,  # beyond.verdicts
            "observed": self.observed,
            "evidence": list(self.evidence),
        }
