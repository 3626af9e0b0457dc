"""Plain-text summaries for the terminal: one comparison, or the paired-protocol table of a results directory."""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from artifact.analysis.agent import agent_row
from artifact.analysis.compare import Comparison, paired_comparisons
from artifact.analysis.tables import run_problems
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
    """The terminal view of `tables.run_row` and `agent.agent_row` (one source for per-run numbers)."""
    r, a = table_row(run), agent_row(run)
    return {
        "run": f"{r['arm'].upper()} run {r['run']}",
        "status": r["status"],
        "BFCL valid": f"{r['bfcl_valid']}/{len(run.episodes)}",
        "episodes with a tool call": f"{a['episodes_with_tool_call']}/{a['episodes']}",
        "requests": r["requests"],
        "cached share": "-" if r["cached_share"] is None else f"{100 * r['cached_share']:.1f}%",
        "wall s": _fmt(r["wall_s"]),
        "server compute s": _fmt(r["server_compute_s"]),
    }


def render_comparison(c: Comparison) -> str:
    lines = [f"{c.a}  vs  {c.b}",
             f"  diverged episodes: {c.k}/{c.n}"
             + (f"  (median first diverging request #{_fmt(c.median_first_request + 1)}, "
                f"median first diverging token index {_fmt(c.median_first_token)})" if c.k else "")]
    for d in c.diverged:
        tok = "-" if d.first_token is None else d.first_token
        lines.append(f"    {d.episode_id}: first diverging request #{d.first_request + 1} "
                     f"(request_index {d.first_request}), token index {tok}, "
                     f"requests {d.n_requests[0]} vs {d.n_requests[1]}")
    if c.only_in_a or c.only_in_b:
        lines.append(f"  not compared (in one run only): {', '.join(c.only_in_a + c.only_in_b)}")
    if c.without_requests:
        lines.append(f"  not compared (a run holds no request of it): {', '.join(c.without_requests)}")
    if c.prompt_mismatches:
        lines.append(f"  WARNING identical outputs but different prompts in: {', '.join(c.prompt_mismatches)}")
    return "\n".join(lines)


def render_results(runs: list[Run]) -> str:
    from artifact.analysis.gsm8k_table import is_bridge_run, tab3

    bridge = [r for r in runs if is_bridge_run(r)]
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        if is_bridge_run(r):
            continue
        groups[(r.manifest["config"], r.manifest["plan"])].append(r)
    blocks = []
    for (config, plan), group in groups.items():
        head = group[0].manifest
        cache = (f"--cache-ram {head['plan_data']['cache_ram_mib']}" if head.get("engine") in (None, "llama.cpp")
                 else "prefix caching per arm's server")
        blocks.append(f"== {config} / plan {plan} ({head['lifecycle']} server, {cache}), "
                      f"engine {head.get('engine_build')}, "
                      f"{len(head['episodes'])} episodes, prompt variant {head['prompt_variant']}")
        rows = [comparison_row(p.name, p.cmp) for p in paired_comparisons(group)]
        if rows:
            blocks.append(pd.DataFrame(rows).to_string(index=False))
        blocks.append(pd.DataFrame([run_row(r) for r in group]).to_string(index=False))
        problems = [p for r in group for p in run_problems(r)]
        blocks.extend(f"INVALID: {p}" for p in problems)
        blocks.append("")
    if bridge:
        table = tab3(bridge)
        cols = [c for c in ("config", "data", "N", "identical_cold1_cold2", "identical_warm1_warm2",
                            "identical_cold1_warm1",
                            "acc_cold_numeric", "acc_warm_numeric", "flips_numeric", "mcnemar_p", "flagged_servings")
                if c in table.columns]
        blocks.append("== GSM8K bridge (Tab. 3): cold 1, cold 2 (cache_prompt=false), warm 1, warm 2 (cache hits); "
                      "identical_X_Y: items whose servings X and Y generated the same token ids, of N")
        blocks.append(table[cols].to_string(index=False))
        blocks.append("")
    return "\n".join(blocks)
