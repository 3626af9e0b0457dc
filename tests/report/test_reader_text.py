"""What a reader sees of a check never shows the code's own names: no constant, function or class of the artifact
(`BAND_RULE`, `QUANT_LEVELS`, `zero_contradicts`) in the rendered report's text or in check.json's claims (statement,
rule, observed, expected, band, minimum evidence, the exit code's meaning). Record fields, server fields and verdict
names are the reader's words and stay. The report opens with its one-glance summary, before the detail."""

from __future__ import annotations

import ast
import html
import json
import re
from functools import cache
from pathlib import Path

from artifact.config import REPO

EVIDENCE = REPO / "evidence"
# names the artifact defines that are also a reader's words: verdict name parts, a server's own field
READER_WORDS = {"TENANTS", "WEIGHTS", "build_info"}


@cache
def internal_names() -> frozenset[str]:
    """Every module-level constant, function and class name of artifact/ that reads as code (an underscore inside
    it or all capitals), its leading underscores dropped."""
    names = set()
    for path in (REPO / "artifact").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return (
        frozenset(n.lstrip("_") for n in names if len(n.strip("_")) > 3 and ("_" in n.strip("_") or n.isupper()))
        - READER_WORDS
    )


def report_text(page: str) -> str:
    """A report's visible prose: no style, no inlined figures, no quoted commands or model text (code elements)."""
    page = re.sub(r"<style.*?</style>|<code>.*?</code>|<pre>.*?</pre>", " ", page, flags=re.S)
    page = re.sub(r'data:image/[^"]*', " ", page)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def check_json_text(path: Path) -> str:
    data = json.loads(path.read_text(encoding="utf-8"))
    keys = ("statement", "rule", "observed", "expected", "band", "minimum_evidence")
    parts = [str(c.get(k, "")) for c in data["claims"] for k in keys]
    parts += [json.dumps(data.get("claim_rules")), str(data.get("exit_meaning"))]
    parts += [str(v.get(k, "")) for v in data.get("beyond", {}).get("verdicts", []) for k in ("claim", "observed")]
    return "\n".join(parts)


def internal_words(text: str) -> set[str]:
    return set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text)) & internal_names()


def test_no_internal_name_in_a_committed_report_or_check_json():
    bad = {}
    for folder in sorted(EVIDENCE.glob("*/check")):
        for path, text in (
            (folder / "report.html", report_text((folder / "report.html").read_text(encoding="utf-8"))),
            (folder / "check.json", check_json_text(folder / "check.json")),
        ):
            if found := internal_words(text):
                bad[str(path.relative_to(REPO))] = sorted(found)
    assert not bad, bad


def test_the_scan_knows_the_codes_names():
    names = internal_names()
    assert {"BAND_RULE", "QUANT_LEVELS", "zero_contradicts"} <= names
    assert internal_words(report_text("<p>magnitude: BAND_RULE</p><code>QUANT_LEVELS</code>")) == {"BAND_RULE"}
    assert not internal_words("cache_n = 0 on every OFF request; BEYOND-TENANTS FAIL")


def test_every_committed_report_opens_with_its_glance():
    for report in sorted(EVIDENCE.glob("*/check/report.html")):
        page = report.read_text(encoding="utf-8")
        body = page.split("<body>", 1)[1]
        assert body.index('id="glance"') < body.index('id="verdicts"') < body.index('id="provenance"'), report
        assert re.search(r'<h2 id="glance">.*?</table>', body, re.S), report
