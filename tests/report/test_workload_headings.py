"""The report's per-workload words come from the workload (`Workload.wording`), never from the report's templates: a
registered FAKE workload with its own name gets its own Tab. 2 heading and validity columns, its own words in the
divergence example and in the network warning, and no word of BFCL's."""

from __future__ import annotations

import re
import sys
import types

import pytest

from artifact import workloads
from artifact.analysis.tables import build_tables
from artifact.check.run import run_check
from artifact.report.render import tab2_sections
from artifact.report.summary import render_results
from artifact.workloads.base import Workload, Wording
from synthetic_runs import OFF, ON1, write_bfcl_run


class ReportOnly(Workload):
    """A FAKE workload that only reads records (the report's side): it runs no units."""

    def prepare(self, cfg):
        raise NotImplementedError("a FAKE workload of the report tests runs nothing")

    def run_unit(self, cfg, prepared, index, arm, query, log):
        raise NotImplementedError("a FAKE workload of the report tests runs nothing")


class FakeAgent(ReportOnly):
    """An agent workload of the tests: its words are its own; its first divergences change a call."""

    name = "fake_agent"
    wording = Wording(
        title="FAKE agent suite", valid_column="FAKE solved", harness="the FAKE harness", executes_output=True
    )

    def divergence_change(self, run_a, run_b, unit_id, first_request):
        return "observation"

    def example_trajectory(self, run, reqs, unit_id, start):
        return [
            dict(t, calls=["fake_call()"], observations=["42"])
            for t in super().example_trajectory(run, reqs, unit_id, start)
        ]


class FakeScorer(ReportOnly):
    """A paired workload that executes nothing of the model's output, with the neutral words of the interface."""

    name = "fake_scorer"


WORKLOAD = FakeAgent()
SCORER = FakeScorer()


@pytest.fixture
def fakes(monkeypatch):
    """The FAKE workloads registered (this module is the agent's package; a second module object, the scorer's)."""
    monkeypatch.setitem(workloads.REGISTRY, "fake_agent", __name__)
    scorer = types.ModuleType("fake_scorer_package")
    scorer.__dict__["WORKLOAD"] = SCORER
    monkeypatch.setitem(sys.modules, "fake_scorer_package", scorer)
    monkeypatch.setitem(workloads.REGISTRY, "fake_scorer", "fake_scorer_package")


def write_pairs(root, workload: str | None, config: str = "cfg", **kwargs) -> list:
    """Two runs per arm of one configuration (ON diverges from OFF in e0 and e2), of `workload` (None: BFCL's)."""
    manifest = {"workload": workload} if workload else None
    return [
        write_bfcl_run(root, arm, k, episodes, config=config, valid={"e1"}, manifest=manifest, **kwargs)
        for k in (1, 2)
        for arm, episodes in (("off", OFF), ("on", ON1))
    ]


def report(root) -> str:
    run_check(root, quiet=True)
    return (root / "check" / "report.html").read_text()


def tab2(html: str) -> list[str]:
    """Each Tab. 2 section: its heading up to the next heading."""
    return re.findall(r'<h2 id="tab2[^"]*">.*?(?=<h2 )', html, re.S)


def test_a_FAKE_workload_gets_its_own_headings_columns_and_words(tmp_path, fakes):
    write_pairs(tmp_path, "fake_agent")
    html = report(tmp_path)
    [section] = tab2(html)
    assert section.startswith('<h2 id="tab2">Tab. 2: divergence per configuration and plan (FAKE agent suite)</h2>')
    assert "<th>FAKE solved OFF</th>" in section and "<th>FAKE solved ON</th>" in section
    assert 'id="tab2-table"' in section and "<td>2/8</td>" in section  # e1 valid in each run: 2 of 8 per arm pooled
    assert "the calls the FAKE harness's decoder read from it" in html
    assert "the FAKE harness's executor returned" in html and "<pre>fake_call()</pre>" in html
    assert '<p id="call-flip">The flip changed a tool call: the FAKE harness executed different calls' in html
    assert "bfcl" not in html.lower() and 'id="agent"' not in html  # no word of BFCL's, nor its own section


def test_the_network_warning_names_what_executed_the_output_if_anything(tmp_path, fakes):
    write_pairs(tmp_path / "agent", "fake_agent", isolation=None)
    html = report(tmp_path / "agent")
    assert 'id="unisolated-runs"' in html and "bfcl" not in html.lower()
    assert "evidence; model output was executed by the FAKE harness on a host that could reach the network." in html
    write_pairs(tmp_path / "scorer", "fake_scorer", isolation=None)
    html = report(tmp_path / "scorer")
    assert 'id="unisolated-runs"' in html and "bfcl" not in html.lower()
    assert "The numbers are still valid\n  evidence.\n" in html and "executed by" not in html
    # the neutral words: its registry name as its title, "valid" as its validity column
    assert "Tab. 2: divergence per configuration and plan (fake_scorer)</h2>" in html
    assert "<th>valid OFF</th>" in html and "<th>valid ON</th>" in html


def test_each_workload_of_the_paired_runs_has_its_own_tab2(tmp_path, fakes):
    write_pairs(tmp_path, None, config="bfcl-cfg")
    write_pairs(tmp_path, "fake_agent", config="fake-cfg")
    bfcl, fake = tab2(report(tmp_path))  # registry order: BFCL's first
    assert bfcl.startswith('<h2 id="tab2">Tab. 2: divergence per configuration and plan (BFCL multi_turn_base)</h2>')
    assert "<th>BFCL valid OFF</th>" in bfcl and "<td>bfcl-cfg<" in bfcl and "fake-cfg" not in bfcl
    assert fake.startswith(
        '<h2 id="tab2-fake_agent">Tab. 2: divergence per configuration and plan (FAKE agent suite)</h2>'
    )
    assert 'id="tab2-fake_agent-table"' in fake and "<th>FAKE solved ON</th>" in fake
    assert "<td>fake-cfg<" in fake and "BFCL" not in fake and "bfcl-cfg" not in fake


def test_without_paired_runs_tab2_names_no_workload():
    assert tab2_sections(build_tables([])) == [{"id": "tab2", "title": "", "valid_column": "valid", "rows": []}]


def test_the_terminal_summary_of_a_FAKE_workload_has_no_columns_of_bfcl(tmp_path, fakes):
    text = render_results(write_pairs(tmp_path, "fake_agent"))
    assert "== cfg / plan main" in text and "OFF run 1" in text and "2/4" in text  # e1 valid of 4 episodes
    assert "tool call" not in text and "bfcl" not in text.lower()  # BFCL's own column (Bfcl.run_columns) is BFCL's
