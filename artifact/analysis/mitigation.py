"""Reproducible cached serving, measured: which plans make the cached path agree with recomputation, at what cost.

Two questions, each answered per configuration from the plans that ran:

* **State reset at run boundaries** (a plan with lifecycle "fresh": a new server per run). Its ON reruns should
  be identical: the cache then only ever holds this run's own prefixes. Verdict `fresh_verdicts`.
* **Mitigation plans** (a plan whose `server_overrides` change the server, e.g. `-ub 1`). Both arms run with the
  setting; it mitigates when ON run k equals OFF run k in every episode. Token identity is the verdict; the largest
  log-probability difference at positions the two arms generated from the same text says whether it is also
  bit-exact. Its cost is its arms' time next to the plain plan ("main") of the same configuration.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from artifact.analysis.divergence import first_difference
from artifact.analysis.groups import (
    cache_condition,
    by_plan,
    comparison,
    manifest_table,
    on_off_pairs,
    same_prompt_requests,
)
from artifact.analysis.margins import top2
from artifact.analysis.stats import wilson_interval
from artifact.analysis.tenant_effect import tenant_plan
from artifact.records.store import Run
from artifact.verdict import FAIL, NOT_RUN, PASS, Verdict

BASELINE_PLAN = "main"


def plan_overrides(run: Run) -> dict:
    overrides = manifest_table(run, "plan_data").get("server_overrides")
    return dict(overrides) if isinstance(overrides, dict) else {}


def is_fresh(run: Run) -> bool:
    return (run.manifest.get("lifecycle") or manifest_table(run, "plan_data").get("lifecycle")) == "fresh"


def max_logprob_gap(a: Run, b: Run) -> float:
    """Largest |logprob difference| of the top-2 entries over positions both runs generated from the same text.

    Positions count while the request's prompt and every earlier token agree, for entries naming the same token id
    in both runs; 0.0 means the two runs computed bit-identical top-2 log-probabilities wherever they can be
    compared. NaN when no position is comparable.
    """
    gap, seen = 0.0, False
    for qa, qb in same_prompt_requests(a, b):
        ta, tb = qa["output_tokens"], qb["output_tokens"]
        xa, xb = top2(a, qa), top2(b, qb)
        if xa is None or xb is None:
            continue
        diff = first_difference(ta, tb)
        n = min(len(xa), len(xb), len(ta), len(tb), diff if diff is not None else len(ta))
        xa, xb = xa[:n], xb[:n]
        for i, j in ((0, 0), (0, 2), (2, 0), (2, 2)):  # the same token id in either place of the two
            same = xa[:, i] == xb[:, j]
            if same.any():
                gap, seen = max(gap, float(np.abs(xa[same, i + 1] - xb[same, j + 1]).max())), True
    return gap if seen else float("nan")


def _divergence(pairs: list[tuple[Run, Run]], gaps: bool = True) -> dict:
    cmps = [comparison(x, y) for x, y in pairs]  # made once per pair (the paper tables made the reruns)
    n, k = sum(c.n for c in cmps), sum(c.k for c in cmps)
    lo, hi = wilson_interval(k, n) if n else (float("nan"), float("nan"))
    gaps = [max_logprob_gap(x, y) for x, y in pairs] if gaps else []
    gaps = [g for g in gaps if not np.isnan(g)]
    return {
        "pairs": len(pairs),
        "episodes": n,
        "diverged": k,
        "rate": k / n if n else float("nan"),
        "wilson_lo": lo,
        "wilson_hi": hi,
        "max_logprob_gap": max(gaps) if gaps else float("nan"),
        "detail": [f"{c.a} vs {c.b}: {c.k}/{c.n} diverged" for c in cmps],
    }


def plan_rows(runs: list[Run], costs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and plan: ON vs OFF and rerun divergence, and each arm's cost next to the main plan's."""
    # (config, plan, arm) -> {cost: the mean over the arm's runs}, as plain floats (looked up ~13 times a plan)
    arm_cost: dict[tuple, dict[str, float]] = {}
    if not costs.empty:
        means = costs.groupby(["config", "plan", "arm"])[["prompt_ms", "wall_s", "ttft_ms_mean"]].mean()
        arm_cost = {key: dict(zip(means.columns, row)) for key, row in zip(means.index, means.to_numpy().tolist())}
    rows = []
    plans = by_plan(runs)
    for (config, plan), by in plans.items():
        any_run = next(iter(by.values()))
        if tenant_plan(any_run):  # background tenants: a load, not a mitigation (analysis.tenant_effect)
            continue
        # Wall and prompt times are per-run totals: a plan is set against main only over the same episodes.
        eps, main_eps = _episode_set(by), _episode_set(plans.get((config, BASELINE_PLAN), {}))
        same_episodes = bool(main_eps) and eps == main_eps
        row = {
            "config": config,
            "plan": plan,
            "lifecycle": "fresh" if is_fresh(any_run) else "shared",
            "server_overrides": ", ".join(f"{k}={v}" for k, v in sorted(plan_overrides(any_run).items())),
            "cache_ram_mib": cache_condition(any_run)["settings"].get("cache_ram_mib"),
        }
        # The log-probability gap tells bit-exact from token-identical; it is read for mitigation plans only.
        d = _divergence([(on, off) for _, on, off in on_off_pairs(by)], gaps=bool(plan_overrides(any_run)))
        row.update({f"on_vs_off_{key}": v for key, v in d.items() if key != "detail"})
        for arm in ("on", "off"):
            rr = _divergence([(by[(arm, 1)], by[(arm, 2)])] if (arm, 1) in by and (arm, 2) in by else [], gaps=False)
            row[f"{arm}_rerun_diverged"] = rr["diverged"] if rr["pairs"] else None
            row[f"{arm}_rerun_episodes"] = rr["episodes"] if rr["pairs"] else None
        for arm in ("on", "off"):
            for what in ("prompt_ms", "wall_s", "ttft_ms_mean"):
                mine = _cost(arm_cost, config, plan, arm, what)
                base = _cost(arm_cost, config, BASELINE_PLAN, arm, what)
                row[f"{arm}_{what}"] = mine
                row[f"{arm}_{what}_vs_main"] = (
                    mine / base if same_episodes and base and not np.isnan(mine) else float("nan")
                )
        base_off = _cost(arm_cost, config, BASELINE_PLAN, "off", "wall_s")
        row["on_wall_vs_main_off"] = row["on_wall_s"] / base_off if same_episodes and base_off else float("nan")
        row["episodes"], row["main_episodes"] = len(eps), len(main_eps)
        rows.append(row)
    return pd.DataFrame(rows)


def _episode_set(by: dict) -> set:
    return {str(e) for r in by.values() for e in (r.manifest.get("episodes") or [])}


def _cost_text(r) -> str:
    if np.isnan(r["on_wall_s_vs_main"]) and r["main_episodes"]:
        within = r["on_wall_s"] / r["off_wall_s"] if r["off_wall_s"] else float("nan")
        return (
            f"cost not set against the main plan: this plan ran {int(r['episodes'])} episodes, main "
            f"{int(r['main_episodes'])} (times are per run); ON wall {_x(within)} its own OFF wall"
        )
    return f"ON wall {_x(r['on_wall_s_vs_main'])}, OFF wall {_x(r['off_wall_s_vs_main'])} the main plan's"


def _cost(table: dict, config, plan, arm, what) -> float:
    row = table.get((config, plan, arm))
    return float("nan") if row is None else float(row[what])


def fresh_verdicts(runs: list[Run]) -> list[Verdict]:
    """Per configuration and fresh-lifecycle plan: ON run 1 and run 2 identical in every episode."""
    claim = "State reset at run boundaries (a new server per run) makes cached (ON) reruns identical"
    out = []
    for (config, plan), by in by_plan(runs).items():
        if not is_fresh(next(iter(by.values()))) or tenant_plan(next(iter(by.values()))):
            continue
        scope = f"{config}/{plan}"
        if ("on", 1) not in by or ("on", 2) not in by:
            out.append(Verdict.beyond("BEYOND-FRESH", claim, scope, NOT_RUN, "ON run 1 and run 2 not both complete"))
            continue
        c = comparison(by[("on", 1)], by[("on", 2)])
        status = PASS if c.n and c.k == 0 else FAIL if c.n else NOT_RUN
        out.append(
            Verdict.beyond(
                "BEYOND-FRESH",
                claim,
                scope,
                status,
                f"ON rerun diverged in {c.k}/{c.n} episodes",
                [f"{c.a} vs {c.b}"]
                + [f"{e.episode_id}: request {e.first_request}, token {e.first_token}" for e in c.diverged[:5]],
            )
        )
    if not out:
        out.append(
            Verdict.beyond(
                "BEYOND-FRESH",
                claim,
                "-",
                NOT_RUN,
                "no run of a fresh-lifecycle plan (./run.sh run CONFIG --plan fresh)",
            )
        )
    return out


def mitigation_verdicts(rows: pd.DataFrame) -> list[Verdict]:
    """Per configuration and mitigation plan (one with server overrides): ON run k == OFF run k in every episode."""
    out = []
    if not rows.empty:
        for _, r in rows[rows["server_overrides"] != ""].iterrows():
            claim = f"Serving with {r['server_overrides']} makes cached (ON) outputs equal recomputed (OFF) outputs"
            scope = f"{r['config']}/{r['plan']}"
            if not r["on_vs_off_episodes"]:
                out.append(
                    Verdict.beyond(
                        f"BEYOND-MITIGATION-{r['plan']}", claim, scope, NOT_RUN, "no ON run k with its OFF run k"
                    )
                )
                continue
            k, n = int(r["on_vs_off_diverged"]), int(r["on_vs_off_episodes"])
            gap = r["on_vs_off_max_logprob_gap"]
            exact = "bit-exact top-2 log-probabilities" if gap == 0 else f"max |log-prob difference| {gap:.3g}"
            cost = _cost_text(r)
            out.append(
                Verdict.beyond(
                    f"BEYOND-MITIGATION-{r['plan']}",
                    claim,
                    scope,
                    PASS if k == 0 else FAIL,
                    f"ON run k vs OFF run k diverged in {k}/{n} episode pairs; {exact}",
                    [cost],
                )
            )
    if not out:
        out.append(
            Verdict.beyond(
                "BEYOND-MITIGATION",
                "Some server setting makes cached outputs equal recomputed outputs",
                "-",
                NOT_RUN,
                "no run of a mitigation plan (./run.sh run CONFIG --plan ub1)",
            )
        )
    return out


def recommendation(rows: pd.DataFrame, fresh: list[Verdict]) -> list[str]:
    """What a practitioner should set, per configuration, from the measured rows (plain sentences)."""
    lines = []
    if rows.empty:
        return ["No ON/OFF runs: nothing to recommend from."]
    for config, g in rows.groupby("config", sort=True):
        main = g[g["plan"] == BASELINE_PLAN]
        if not main.empty and main.iloc[0]["on_vs_off_episodes"]:
            m = main.iloc[0]
            lines.append(
                f"{config}: with the default settings, caching changed the output of "
                f"{int(m['on_vs_off_diverged'])}/{int(m['on_vs_off_episodes'])} episode pairs "
                f"(ON run k vs OFF run k) and ran at "
                f"{_x(m['on_wall_s'] / m['off_wall_s'] if m['off_wall_s'] else float('nan'))} the wall "
                f"time of recomputing every prompt."
            )
        ok = g[(g["server_overrides"] != "") & (g["on_vs_off_episodes"] > 0) & (g["on_vs_off_diverged"] == 0)]
        bad = g[(g["server_overrides"] != "") & (g["on_vs_off_diverged"] > 0)]
        if not ok.empty:
            best = ok.sort_values("on_wall_s").iloc[0]
            cost = (
                f"its ON arm takes {_x(best['on_wall_s_vs_main'])} the wall time of default caching and "
                f"{_x(best['on_wall_vs_main_off'])} that of default recomputation"
                if not np.isnan(best["on_wall_s_vs_main"])
                else _cost_text(best)
            )
            lines.append(
                f"{config}: to make cached serving reproduce recomputation, set {best['server_overrides']} "
                f"(plan {best['plan']}): ON == OFF in all {int(best['on_vs_off_episodes'])} episode pairs; "
                f"{cost}."
            )
        for _, b in bad.iterrows():
            lines.append(
                f"{config}: {b['server_overrides']} (plan {b['plan']}) does not suffice: ON vs OFF diverged "
                f"in {int(b['on_vs_off_diverged'])}/{int(b['on_vs_off_episodes'])} episode pairs."
            )
        if ok.empty and bad.empty:
            lines.append(f"{config}: no mitigation plan ran (./run.sh run CONFIG --plan ub1).")
    for v in fresh:
        if v.status == PASS:
            lines.append(
                f"{v.scope}: for identical reruns, restart the server (or clear its cache) at run "
                f"boundaries: {v.observed}."
            )
        elif v.status == FAIL:
            lines.append(
                f"{v.scope}: even with a fresh server per run, {v.observed}: the engine itself is "
                f"not run-to-run deterministic here."
            )
    return lines


def _x(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.2f}x"
