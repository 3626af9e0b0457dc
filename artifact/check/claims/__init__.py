"""The paper's claims, one module per claim, registered here in the order they are reported.

Each module (rq1.py ... rq5.py) holds its rule as data (`ID`, `RULE`: statement, hard, rule, minimum_evidence) and
`judge(ctx)`, which returns its `Claim` from a `core.Context` (the paired runs' tables, each workload's own tables,
the paper's values). `CLAIM_RULES` collects the rules: check.json carries them and a test holds ARTIFACT.md's claims
table to them. Adding a claim means adding its module and a line in REGISTRY. The statuses, `BAND_RULE` and
`EXIT_CODES` are the checker's vocabulary, importable from here.
"""

from __future__ import annotations

from typing import Any
import importlib
from pathlib import Path

from artifact.analysis.tables import PAPER_PLAN, Tables
from artifact.check.core import (  # besides what this module uses, the vocabulary its users import (`X as X`)
    BAND_RULE as BAND_RULE,
    FAIL as FAIL,
    INCONCLUSIVE as INCONCLUSIVE,
    INVALID as INVALID,
    NOT_RUN as NOT_RUN,
    OUT as OUT,
    PASS as PASS,
    SEVERITY as SEVERITY,
    STATUSES as STATUSES,
    TESTED as TESTED,
    Claim as Claim,
    Context as Context,
    Paper as Paper,
    Verdict as Verdict,
    paper_configs_for as paper_configs_for,
)
from artifact.check.exit_codes import EXIT_CODES as EXIT_CODES  # the text ARTIFACT.md quotes (re-exported)
from artifact.check.expected import load_document
from artifact.workloads import cache_bridges

REGISTRY = ("rq1", "rq2", "rq2b", "rq3", "rq4", "rq5")
MODULES = tuple(importlib.import_module(f"artifact.check.claims.{name}") for name in REGISTRY)
CLAIM_RULES: dict[str, dict[str, Any]] = {m.ID: m.RULE for m in MODULES}


def evaluate_claims(
    tables: Tables,
    workload_tables: dict[str, Any] | None = None,
    *,
    root: Path | None = None,
    expected_path: str | Path | None = None,
) -> list[Claim]:
    ctx = Context(tables, workload_tables or {}, Paper(load_document(expected_path)), root)
    return [m.judge(ctx) for m in MODULES]


def annotate_with_paper(
    tables: Tables, expected_path: str | Path | None = None, workload_tables: dict[str, Any] | None = None
) -> None:
    """Add the paper's value (and its source) beside the observed rates of Tab. 2, Fig. 1 and Fig. 2, and beside
    each cache bridge's rows of the paper's own items: the paper's Tab. 3 rate of cold-vs-warm divergence at the
    row's quantization level (the paper names no model or engine for it)."""
    paper = Paper(load_document(expected_path))
    tab3_rates = {
        v["quant"]: v["value"]
        for v in paper.values.values()
        if v.get("comparison") == "cold_vs_warm" and v.get("quant") and not v.get("config")
    }
    for name, (_, bridge) in cache_bridges().items():
        table = (workload_tables or {}).get(name, {}).get(bridge.table)
        if table is not None and not table.empty and {"quant", "data"} <= set(table.columns):
            table["paper_cold_vs_warm"] = [
                tab3_rates.get(q) if d == bridge.paper_data else None for q, d in zip(table["quant"], table["data"])
            ]

    def lookup(config: str, plan: str, kind: str) -> tuple[float | None, str | None]:
        g = tables.group(config, plan)
        vs = paper.for_group(g, kind) if g else []
        if not vs and g is None:  # a condition that did not run: look up by the configuration's identity
            other = next((x for x in tables.groups if x.config == config), None)
            if other is not None:
                ids = paper_configs_for(other.meta, paper.configs)
                vs = [v for cid in ids for v in paper.by_slot.get((cid, kind, plan), [])]
        return (vs[0]["value"], f"{vs[0]['source']} ({vs[0]['key']})") if vs else (None, None)

    if not tables.tab2.empty:
        tables.tab2["paper_config"] = [
            ", ".join(paper_configs_for(g.meta, paper.configs)) or None for g in tables.groups
        ]
        for kind in ("on_vs_off", "on_rerun"):
            vals = [lookup(g.config, g.plan, kind) for g in tables.groups]
            tables.tab2[f"paper_{kind}"] = [v for v, _ in vals]
    for df in (tables.fig1, tables.fig2):
        if df.empty:
            df["paper_value"], df["paper_source"] = [], []
            continue
        plan_col = df["plan"] if "plan" in df.columns else [PAPER_PLAN] * len(df)
        kind_col = df["comparison"] if "comparison" in df.columns else ["on_vs_off"] * len(df)
        vals = [lookup(c, p, k) for c, p, k in zip(df["config"], plan_col, kind_col)]
        df["paper_value"] = [v for v, _ in vals]
        df["paper_source"] = [s for _, s in vals]
