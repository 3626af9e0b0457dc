"""The engine walkthrough of docs/extending.md, run as written: its code block becomes an engine package, registered
by one line, and serves the protocol and check against a FAKE SGLang server (tests/engines/fake_sglang.py; SGLang
itself needs a GPU and its own environment). What it shows: the engine seam is the five required members, the
shared OpenAI client and the server process; nothing outside the new package learns its name."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from artifact import engines
from artifact.catalog import load_config, load_plan
from artifact.check.run import run_check
from artifact.config import REPO
from artifact.engines.base import Engine
from artifact.errors import ArtifactError
from artifact.protocol.runner import execute_plan
from artifact.records.store import find_runs
from budget import with_workload

GUIDE = REPO / "docs" / "extending.md"
FAKE = Path(__file__).parent / "fake_sglang.py"


def guide_code() -> str:
    """The one python block of the SGLang walkthrough."""
    text = GUIDE.read_text()
    section = text[text.index("### Walkthrough: SGLang") :]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the walkthrough has one code block: the whole engine package"
    return blocks[0]


@pytest.fixture
def sglang(tmp_path, monkeypatch):
    """The walkthrough's package, registered by its one registry line."""
    pkg = tmp_path / "pkgs" / "sglang_walkthrough"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(guide_code())
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setitem(engines.REGISTRY, "sglang", "sglang_walkthrough")
    yield engines.get("sglang")
    sys.modules.pop("sglang_walkthrough", None)


def fake_cfg(**settings):
    cfg = load_config("demo-smollm2-agent-cpu")
    engine = dataclasses.replace(
        cfg.engine,
        kind="sglang",
        binary="",
        settings={"launcher": [sys.executable, str(FAKE)], **settings},
        startup_timeout_s=30,
    )
    cfg = dataclasses.replace(cfg, engine=engine)
    return with_workload(cfg, episodes=2, max_turns=1, max_steps_per_turn=1, n_predict=12)


def test_fake_sglang_the_walkthrough_engine_has_only_the_required_core_of_its_own(sglang):
    assert isinstance(sglang, Engine) and sglang.kind == "sglang"
    required = set(Engine.__abstractmethods__)
    assert required == {"identity", "describe_cache", "open_session"}  # with kind and capabilities: five members
    own = {k for k, v in vars(type(sglang)).items() if not k.startswith("_") and k not in ("kind", "capabilities")}
    assert own <= required | {"settings_type", "server_family"}
    assert sglang.builds is None  # no build facet: `./run.sh all` does not run it
    assert type(sglang.audit).__name__ == "RecordAudit"  # the default audit


def test_fake_sglang_runs_the_protocol_and_check_reads_its_records(sglang, tmp_path):
    results = tmp_path / "results"
    execute_plan(fake_cfg(), load_plan("main"), results)
    runs = {(r.manifest["arm"], r.manifest["run"]): r for r in find_runs(results)}
    assert sorted(runs) == [("off", 1), ("off", 2), ("on", 1), ("on", 2)]
    for (arm, _), run in runs.items():
        m = run.manifest
        assert m["engine"] == "sglang" and run.complete
        assert ("--disable-radix-cache" in m["server_cmd"]) == (arm == "off")
        assert m["server_cmd"][:2] == [sys.executable, str(FAKE)]
        cached = [r["cache_n"] for r in run.requests]
        assert all(isinstance(n, int) for n in cached)
        if arm == "off":
            assert set(cached) == {0}
    on_cached = [r["cache_n"] for r in runs["on", 1].requests][1:]
    assert any(n > 0 for n in on_cached)  # the second episode shares the first one's system prompt
    off = [[r["output_tokens"] for r in runs["off", k].requests] for k in (1, 2)]
    assert off[0] == off[1]  # OFF reruns are bit-identical

    code = run_check(results, results / "check", quiet=True)
    doc = json.loads((results / "check" / "check.json").read_text())
    claims = {c["id"]: c for c in doc["claims"]}
    assert doc["runs"] and not doc["invalid"] and not doc["hard_failures"], doc["exit_meaning"]
    assert claims["RQ1"]["status"] == "PASS"  # its records were admitted and judged: reruns identical, OFF uncached
    assert code == doc["exit_code"]


def test_fake_sglang_settings_are_validated_in_one_line(sglang, tmp_path):
    with pytest.raises(ArtifactError, match=r"unknown key 'engine.settings.port'"):
        execute_plan(fake_cfg(port=1), load_plan("main"), tmp_path / "results")
