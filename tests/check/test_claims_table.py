"""The claims tables are held to the claim modules' rules (artifact/check/claims/): docs/claims.md's sections and
the README's table list the same claims, in the same order, the hard one marked, and docs/claims.md writes down
each claim's minimum evidence."""

import re

from artifact.check.claims import CLAIM_RULES, MODULES
from artifact.config import REPO

CLAIMS = (REPO / "docs" / "claims.md").read_text(encoding="utf-8")
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_claims_table_lists_every_claim_module_in_order_with_its_hard_marker():
    rows = re.findall(r"^### \*\*(RQ\w+)\*\*( \(hard\))?:", CLAIMS, re.M)
    assert [cid for cid, _ in rows] == list(CLAIM_RULES) == [m.ID for m in MODULES]
    assert {cid: bool(hard) for cid, hard in rows} == {cid: r["hard"] for cid, r in CLAIM_RULES.items()}


def test_the_front_page_lists_every_claim_in_order_with_its_hard_marker():
    rows = re.findall(r"^\| \*\*(RQ\w+)\*\*( \(hard\))?:", README, re.M)
    assert [cid for cid, _ in rows] == list(CLAIM_RULES)
    assert {cid: bool(hard) for cid, hard in rows} == {cid: r["hard"] for cid, r in CLAIM_RULES.items()}


def test_every_claim_has_its_minimum_evidence_in_the_claims_page():
    minimum = CLAIMS[CLAIMS.index("**Minimum evidence**") :]
    for cid, rule in CLAIM_RULES.items():
        assert rule["minimum_evidence"] and re.search(rf"\b{cid}\b", minimum), cid
