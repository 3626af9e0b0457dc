"""Plain-text summaries for the terminal: one comparison, or the paired-protocol table of a results directory."""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from artifact import workloads
from artifact.analysis.divergence import Comparison, paired_comparisons
from artifact.analysis.groups import cache_condition
from artifact.analysis.tables import is_paired_run, run_problems
from artifact.analysis.tables import run_row as table_row
from artifact.records.store import Run


def _fmt(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def comparison_row(name: str, c: Comparison) -> dict:
    return {
        "comparison": name,
        "diverged": f"{c.k}/{c.n}",
        "rate": f"{100 * c.k / c.n:.1f}%" if c.n else "-",
        # request numbers 1-based as in the paper ("the 1st-4th request"); token positions 0-based
        "median first request #": _fmt(None if c.median_first_request is None else c.median_first_request + 1),
        "median first token idx": _fmt(c.median_first_token),
    }


def run_row(run: Run) -> dict:
    """The terminal view of `tables.run_row` (one source for per-run numbers), with the workload's own columns."""
    r = table_row(run)
    workload = workloads.of_run(run)
    return {
        "run": f"{r['arm'].upper()} run {r['run']}",
        "status": r["status"],
        "valid": f"{r['valid']}/{len(run.episodes)}",
        **(workload.run_columns(run) if workload is not None else {}),
        "requests": r["requests"],
        "cached share": "-" if r["cached_share"] is None else f"{100 * r['cached_share']:.1f}%",
        "wall s": _fmt(r["wall_s"]),
        "server compute s": _fmt(r["server_compute_s"]),
    }


def render_comparison(c: Comparison) -> str:
    lines = [
        f"{c.a}  vs  {c.b}",
        f"  diverged episodes: {c.k}/{c.n}"
        + (
            f"  (median first diverging request #{_fmt(c.median_first_request + 1)}, "
            f"median first diverging token index {_fmt(c.median_first_token)})"
            if c.k
            else ""
        ),
    ]
    for d in c.diverged:
        tok = "-" if d.first_token is None else d.first_token
        lines.append(
            f"    {d.episode_id}: first diverging request #{d.first_request + 1} "
            f"(request_index {d.first_request}), token index {tok}, "
            f"requests {d.n_requests[0]} vs {d.n_requests[1]}"
        )
    if c.only_in_a or c.only_in_b:
        lines.append(f"  not compared (in one run only): {', '.join(c.only_in_a + c.only_in_b)}")
    if c.without_requests:
        lines.append(f"  not compared (a run holds no request of it): {', '.join(c.without_requests)}")
    if c.prompt_mismatches:
        lines.append(f"  WARNING identical outputs but different prompts in: {', '.join(c.prompt_mismatches)}")
    return "\n".join(lines)


def render_results(runs: list[Run]) -> str:
    """The paired protocol's block per configuration and plan, then each workload's own blocks."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        if is_paired_run(r):
            groups[(r.manifest["config"], r.manifest["plan"])].append(r)
    blocks = []
    for (config, plan), group in groups.items():
        head = group[0].manifest
        cache = cache_condition(group[0])["description"]
        variant = f", prompt variant {head['prompt_variant']}" if head.get("prompt_variant") else ""
        blocks.append(
            f"== {config} / plan {plan} ({head['lifecycle']} server, {cache}), "
            f"engine {head.get('engine_build')}, {len(head['episodes'])} episodes{variant}"
        )
        rows = [comparison_row(p.name, p.cmp) for p in paired_comparisons(group)]
        if rows:
            blocks.append(pd.DataFrame(rows).to_string(index=False))
        blocks.append(pd.DataFrame([run_row(r) for r in group]).to_string(index=False))
        problems = [p for r in group for p in run_problems(r)]
        blocks.extend(f"INVALID: {p}" for p in problems)
        blocks.append("")
    for workload, wruns in workloads.by_workload(runs).values():
        blocks.extend(workload.summary(wruns, workload.tables(wruns)))
    return "\n".join(blocks)
