"""ARTIFACT.md's claims table is held to the claim modules' rules (artifact/check/claims/): the same claims, in the
same order, the hard one marked, each with its minimum evidence written down."""

import re

from artifact.check.claims import CLAIM_RULES, MODULES
from artifact.config import REPO

ARTIFACT = (REPO / "ARTIFACT.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = ARTIFACT.index(title)
    end = ARTIFACT.find("\n## ", start + 1)
    return ARTIFACT[start:end if end != -1 else None]


def test_the_claims_table_lists_every_claim_module_in_order_with_its_hard_marker():
    rows = re.findall(r"^\| \*\*(RQ\w+)\*\*( \(hard\))?:", section("## 2. Claims"), re.M)
    assert [cid for cid, _ in rows] == list(CLAIM_RULES) == [m.ID for m in MODULES]
    assert {cid: bool(hard) for cid, hard in rows} == {cid: r["hard"] for cid, r in CLAIM_RULES.items()}


def test_every_claim_has_its_minimum_evidence_in_artifact_md():
    text = section("## 2. Claims")
    minimum = text[text.index("**Minimum evidence**"):]
    for cid, rule in CLAIM_RULES.items():
        assert rule["minimum_evidence"] and re.search(rf"\b{cid}\b", minimum), cid
