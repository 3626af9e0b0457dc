"""docs/paper-vs-here.md is made by `./run.sh evidence-summary` from the committed evidence and expected/paper.toml
(artifact/paper_vs_here.py), never by hand: the committed page is what the generator makes of them, `--check` fails
when it is not, a new evidence folder (one that decides RQ5 on GSM8K, say) appears on it without being named
anywhere, and the counts it shows of a configuration are those of its folder's summary (made from the records)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import shutil

from artifact import cli, evidence, paper_vs_here
from artifact.check.expected import load_document
from artifact.config import REPO

EVIDENCE = REPO / "evidence"


def test_the_committed_page_is_what_the_evidence_gives():
    made = paper_vs_here.render(paper_vs_here.collect())
    assert paper_vs_here.PAGE.read_text(encoding="utf-8") == made, "./run.sh evidence-summary remakes it"


def test_a_page_out_of_date_is_caught_and_remade(tmp_path):
    page = tmp_path / "paper-vs-here.md"
    made = paper_vs_here.render(paper_vs_here.collect())
    page.write_text(made.replace("PASS", "FAIL", 1), encoding="utf-8")
    assert paper_vs_here.main(check_only=True, page=page) == 1
    assert page.read_text(encoding="utf-8") != made  # --check writes nothing
    assert paper_vs_here.main(page=page) == 0 and page.read_text(encoding="utf-8") == made
    assert paper_vs_here.main(check_only=True, page=page) == 0


def test_evidence_summary_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "main", lambda folders, check_only=False: 0)  # the summaries: another test's
    monkeypatch.setattr(paper_vs_here, "PAGE", tmp_path / "missing.md")
    assert cli.cmd_evidence_summary(argparse.Namespace(folders=[], check=True)) == 1
    assert not (tmp_path / "missing.md").exists()
    assert cli.cmd_evidence_summary(argparse.Namespace(folders=[], check=False)) == 0
    assert cli.cmd_evidence_summary(argparse.Namespace(folders=[], check=True)) == 0


def _table(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_a_new_folder_that_decides_rq5_appears_on_its_own(tmp_path):
    """A folder nobody names (here a copy of a folder whose bridge ran, its items relabelled GSM8K and RQ5 decided)
    is read because it has a summary: RQ5 gets its rows, its verdict and its link."""
    src, new = EVIDENCE / "h200-smollm2", tmp_path / "gsm8k-bridge"
    (new / "check").mkdir(parents=True)
    shutil.copy(src / evidence.SUMMARY_JSON, new / evidence.SUMMARY_JSON)
    for name in ("tab2.csv", "fig2_trend.csv"):
        shutil.copy(src / "check" / name, new / "check" / name)
    rows = _table((src / "check" / "tab3.csv").read_text(encoding="utf-8"))
    for r in rows:
        r["data"] = "gsm8k"
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    (new / "check" / "tab3.csv").write_text(out.getvalue(), encoding="utf-8")
    check = json.loads((src / "check" / "check.json").read_text(encoding="utf-8"))
    for claim in check["claims"]:
        if claim["id"] == "RQ5":
            claim["status"] = "PASS"
            claim["details"] = [{"scope": r["config"], "status": "PASS"} for r in rows]
    (new / "check" / "check.json").write_text(json.dumps(check), encoding="utf-8")

    data = paper_vs_here.collect(tmp_path)
    rq5 = next(c for c in data["claims"] if c["id"] == "RQ5")
    assert [g["folders"] for g in rq5["groups"]] == [["gsm8k-bridge"]]
    assert [row[0] for row in rq5["groups"][0]["rows"]] == [r["config"] for r in rows]  # the pooled row last
    assert all("(gsm8k)" in row[1] for row in rq5["groups"][0]["rows"])
    assert rq5["tally"] == {"PASS": ["gsm8k-bridge"]} and rq5["comparable"].startswith("by direction")
    page = paper_vs_here.render(data)
    assert '[PASS](../evidence/gsm8k-bridge/summary.md "claims/RQ5")' in page


def test_the_counts_shown_are_the_summaries():
    """Each configuration-plan's ON-vs-OFF, ON-rerun and OFF-rerun count on the page (RQ2, RQ4) is its folder's
    summary's (summary.json `divergence`, made from the records: tests/test_docs_numbers.py)."""
    data = paper_vs_here.collect()
    seen = 0
    for claim in data["claims"]:
        if claim["id"] not in ("RQ2", "RQ4"):
            continue
        order = (
            ("on_vs_off", "on_rerun", "off_rerun") if claim["id"] == "RQ2" else ("off_rerun", "on_vs_off", "on_rerun")
        )
        for g in claim["groups"]:
            for folder in g["folders"]:
                summary = json.loads((EVIDENCE / folder / evidence.SUMMARY_JSON).read_text(encoding="utf-8"))
                for row in g["rows"]:
                    config, plan = re.match(r"(\S+) \((\S+)\)", row[0]).groups()
                    counts = summary["divergence"][f"{config}:{plan}"]
                    for kind, cell in zip(order, row[1:4]):
                        assert cell.split(" = ")[0] == counts.get(kind, "-"), (folder, config, plan, kind)
                        seen += 1
    assert seen > 50


def test_a_rate_is_shown_with_its_wilson_interval():
    assert paper_vs_here.rate(10, 80) == "10/80 = 12.5 % (6.9-21.5 %)"
    assert paper_vs_here.rate("0.0", "400.0") == "0/400 = 0.0 % (0.0-1.0 %)"
    assert paper_vs_here.rate("", "") == "-"


def test_every_paper_value_the_page_quotes_is_in_expected():
    values = load_document()["value"]
    keys = {k for pairs in paper_vs_here.PAPER_VALUES.values() for k, _ in pairs}
    keys |= {k for _, ks in paper_vs_here.HEADLINES.values() for k in ks}
    assert keys <= set(values), keys - set(values)
    assert paper_vs_here.paper_value(values["on_vs_off_qwen2.5-7b_Q4_K_M"]) == "75.0 %"
    assert paper_vs_here.paper_value(values["gsm8k_discordant_rate"]) == "20/1300 = 1.54 %"
    assert paper_vs_here.paper_value(values["on_vs_off_qwen2.5-7b_Q8_0"]) == "not in the summary"


def test_the_front_pages_say_which_claims_compare_by_value_and_which_by_direction():
    """README.md and ARTIFACT.md state up front what the page derives from the evidence: which claims compare with
    the paper by value, which by direction only, which are not decided here."""
    phrase = paper_vs_here.comparability(paper_vs_here.collect())
    for doc in (REPO / "README.md", REPO / "ARTIFACT.md"):
        text = " ".join(doc.read_text(encoding="utf-8").split())
        assert f"The claims compare with the paper {phrase}." in text, doc.name
        assert "docs/paper-vs-here.md" in text and "workflow 3) has not run" in text, doc.name


def test_rq5_shows_the_real_items_that_decided_nothing_with_their_counts():
    """A folder whose bridge served the paper's own items but stayed INCONCLUSIVE (too little power) is shown with
    its counts, accuracies, power and the check's reason, yet decides nothing: no tally, RQ5 stays "not decided"."""
    data = paper_vs_here.collect()
    rq5 = next(c for c in data["claims"] if c["id"] == "RQ5")
    shown = [g for g in rq5["groups"] if "h100-qwen2.5-coder-gsm8k" in g["folders"]]
    assert len(shown) == 1 and shown[0]["verdict"] == "INCONCLUSIVE"
    assert all(v in ("PASS", "FAIL", "OUT-OF-BAND") for v in rq5["tally"]) and rq5["comparable"] == "not decided here"
    summary = json.loads((EVIDENCE / "h100-qwen2.5-coder-gsm8k" / evidence.SUMMARY_JSON).read_text(encoding="utf-8"))
    cols = shown[0]["columns"]
    for row in shown[0]["rows"]:
        counts = summary["bridge"][row[0]]
        cell = dict(zip(cols, row))
        assert cell["cold vs warm differ"].split(" = ")[0] == counts["cold_warm_diverged"]
        recompute, cache = cell["accuracy: recompute, cache"].split("; ")
        assert (
            recompute.split(" = ")[0] == counts["correct_recompute"]
            and cache.split(" = ")[0] == counts["correct_cache"]
        )
        assert cell["flips: to cache, to recompute"] == f"{counts['flips_to_cache']}, {counts['flips_to_recompute']}"
    assert f"about {-(-summary['bridge']['pooled']['items_for_power_1pp'] // 100) * 100:,} items" in shown[0]["note"]
    # synthetic items never stand in for the paper's: a folder with only those is not shown
    assert not [g for g in rq5["groups"] if "h200-smollm2" in g["folders"]]
