"""The "Other tenants" block of the beyond-the-paper section (artifact.check.beyond): tables, figure, report rows.

section(runs)            -> Section: verdicts (BEYOND-TENANTS-<plan>), tables tenants.csv (per configuration and
                            tenant plan) and tenants_runs.csv (per run: load and divergence from the isolated run)
figure(plans, path)      -> tenants.png, or None without tenant plans
"""

from __future__ import annotations

from typing import Any
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from artifact.analysis import tenant_effect
from artifact.analysis.figure import new_figure

RUN_COLUMNS = [
    "config",
    "plan",
    "arm",
    "run",
    "tenants",
    "prefix",
    "slots",
    "tenant_requests",
    "tenant_failed",
    "tenant_prompt_n",
    "tenant_cache_n",
    "tenant_predicted_n",
    "measured_requests",
    "measured_overlapped",
    "overlap_share",
    "cached_tokens",
    "wall_s",
    "vs_isolated_diverged",
    "vs_isolated_episodes",
    "vs_isolated",
    "refused",
]
PLAN_COLUMNS = [
    "config",
    "plan",
    "tenants",
    "prefix",
    "slots",
    "runs",
    "off_vs_isolated_diverged",
    "off_vs_isolated_episodes",
    "off_vs_isolated_rate",
    "off_vs_isolated_wilson_lo",
    "off_vs_isolated_wilson_hi",
    "off_vs_isolated_detail",
    "on_vs_isolated_diverged",
    "on_vs_isolated_episodes",
    "on_vs_isolated_rate",
    "on_vs_isolated_wilson_lo",
    "on_vs_isolated_wilson_hi",
    "on_vs_isolated_detail",
    "off_rerun",
    "off_rerun_diverged",
    "off_rerun_episodes",
    "isolated_off_rerun",
    "on_rerun",
    "on_rerun_diverged",
    "on_rerun_episodes",
    "isolated_on_rerun",
    "on_vs_off",
    "isolated_on_vs_off",
    "tenant_requests",
    "tenant_failed",
    "measured_requests",
    "measured_overlapped",
    "overlap_share_mean",
    "off_cached_tokens",
    "on_cached_tokens",
    "refused",
]


@dataclass
class Section:
    verdicts: list[Any]
    runs: pd.DataFrame
    plans: pd.DataFrame


def section(runs: list[Any]) -> Section:
    rows = tenant_effect.run_rows(runs)
    plans = tenant_effect.plan_rows(runs, rows)
    return Section(
        tenant_effect.verdicts(plans),
        pd.DataFrame(rows, columns=RUN_COLUMNS),
        pd.DataFrame(plans, columns=PLAN_COLUMNS),
    )


def _n(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _frac(k: Any, n: Any) -> str:
    return "-" if n is None or (isinstance(n, float) and math.isnan(n)) or not n else f"{int(k)}/{int(n)}"


def report_rows(plans: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for r in plans.to_dict("records"):
        share = r["overlap_share_mean"]
        prefix = r["prefix"] if isinstance(r["prefix"], str) else "prefix not known"  # derived: analysis.tenant_effect
        out.append(
            {
                "config": r["config"],
                "plan": r["plan"],
                "load": f"{r['tenants']} ({prefix})" if r["tenants"] else f"0 ({r['slots']} slots)",
                "off_vs_iso": _frac(r["off_vs_isolated_diverged"], r["off_vs_isolated_episodes"]),
                "on_vs_iso": _frac(r["on_vs_isolated_diverged"], r["on_vs_isolated_episodes"]),
                "off_rerun": f"{_n(r['off_rerun'])} (isolated {_n(r['isolated_off_rerun'])})",
                "on_rerun": f"{_n(r['on_rerun'])} (isolated {_n(r['isolated_on_rerun'])})",
                "on_vs_off": f"{_n(r['on_vs_off'])} (isolated {_n(r['isolated_on_vs_off'])})",
                "load_sent": f"{int(r['tenant_requests'])} ({int(r['tenant_failed'])} failed)",
                "overlap": f"{int(r['measured_overlapped'])}/{int(r['measured_requests'])}"
                + ("" if share is None or share != share else f", {100 * share:.0f}% of their time"),
                "refused": r["refused"] or "",
            }
        )
    return out


def figure(plans: pd.DataFrame, path: Path) -> Path | None:
    """Left: measured episodes diverging from the isolated baseline against the number of tenants, per arm and
    prefix (95% Wilson); right: reruns under load (OFF and ON) against the number of tenants."""
    plans = plans.copy()
    for col in [c for c in plans.columns if c.endswith(("_episodes", "_diverged", "_rate", "_lo", "_hi"))]:
        plans[col] = pd.to_numeric(plans[col], errors="coerce").astype(float)
    loaded = plans[plans["tenants"] > 0] if not plans.empty else plans
    if loaded.empty or not (
        loaded["off_vs_isolated_episodes"].fillna(0).any() or loaded["on_vs_isolated_episodes"].fillna(0).any()
    ):
        return None

    fig = new_figure(10.0, 4.2)
    ax, ax2 = fig.subplots(1, 2)
    for config, g in plans.groupby("config", sort=True):
        control = g[g["tenants"] == 0]
        for prefix, marker in (("shared", "o"), ("unshared", "s")):
            part = pd.concat([control, g[(g["tenants"] > 0) & (g["prefix"] == prefix)]]).sort_values("tenants")
            if part.empty or not (part["tenants"] > 0).any():
                continue
            for arm, style in (("off", "-"), ("on", "--")):
                ok = part[part[f"{arm}_vs_isolated_episodes"].fillna(0) > 0]
                if ok.empty:
                    continue
                rate = ok[f"{arm}_vs_isolated_rate"].astype(float)
                yerr = [
                    (100 * (rate - ok[f"{arm}_vs_isolated_wilson_lo"])).clip(lower=0).tolist(),
                    (100 * (ok[f"{arm}_vs_isolated_wilson_hi"] - rate)).clip(lower=0).tolist(),
                ]
                ax.errorbar(
                    ok["tenants"],
                    100 * rate,
                    yerr=yerr,
                    marker=marker,
                    linestyle=style,
                    capsize=3,
                    label=f"{config}: {arm.upper()}, {prefix} prefix",
                )
                rr = part[part[f"{arm}_rerun_episodes"].fillna(0) > 0]
                if not rr.empty:
                    ax2.plot(
                        rr["tenants"],
                        100 * rr[f"{arm}_rerun_diverged"] / rr[f"{arm}_rerun_episodes"],
                        marker=marker,
                        linestyle=style,
                        label=f"{config}: {arm.upper()} rerun, {prefix} prefix",
                    )
    for a in (ax, ax2):
        a.set_xlabel("background tenants (0: the same server, no load)")
        a.set_ylim(-5, 105)
        a.xaxis.get_major_locator().set_params(integer=True)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=6, loc="upper left", frameon=False)
    ax.set_ylabel("measured episodes diverging from isolated (%)")
    ax.set_title("Run k under load vs run k isolated (plan main), 95% Wilson", fontsize=9)
    ax2.set_ylabel("episodes diverging, run 1 vs run 2 (%)")
    ax2.set_title("Reruns under load", fontsize=9)
    fig.savefig(path, format="png")
    return path
