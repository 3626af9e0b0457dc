"""Results beyond the paper, for `./run.sh check`: margins, what the cache buys, reproducible cached serving,
which cache tier served each hit, why quantization amplifies divergence, and other tenants
(artifact.check.beyond_tenants).

`write_beyond(runs, out)` computes them from the records (artifact.analysis.margins, .benefit, .mitigation, .tiers,
.quantization; artifact.check.beyond_tenants), writes their CSVs and figures into the check directory, and returns a
`Beyond` holding the verdicts (BEYOND-FRESH, BEYOND-MITIGATION-<plan>, BEYOND-TIERS, BEYOND-QUANT-KERNEL,
BEYOND-QUANT-MARGIN, BEYOND-TENANTS-<plan>), a `check.json` section (`as_dict`) and the report's context
(`report_context`). These verdicts never change check's exit code: they are measurements beyond the paper's claims.

Files: margins.csv, first_divergence_margins.csv, flip_by_margin.csv, flip_trend.csv, margin_trend.csv,
benefit_runs.csv, benefit_arms.csv, benefit_ratios.csv, mitigation.csv, tiers.csv, tiers_requests.csv,
quant_mechanism.csv, quant_mechanism_pairs.csv, tenants.csv, tenants_runs.csv, beyond_verdicts.csv; flip_margin.png,
price.png, tiers.png, quant_mechanism.png and tenants.png when the runs allow them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from artifact import engines
from artifact.analysis import benefit, margins, mitigation, quantization, tiers
from artifact.analysis.figure import new_figure, text_room
from artifact.analysis.tenant_effect import tenant_plan
from artifact.check import beyond_tenants
from artifact.check.cells import safe_frame
from artifact.records.store import Run
from artifact.verdict import Verdict
from artifact.check.worker import Drawing


@dataclass
class Beyond:
    verdicts: list[Verdict]
    tables: dict[str, pd.DataFrame]
    recommendation: list[str]
    figures: dict[str, Path] = field(default_factory=dict)
    positions: dict[Any, Any] | None = (
        None  # the positions at risk per configuration and plan (artifact.analysis.quantization), for its figure
    )

    @property
    def files(self) -> list[str]:
        return list(self.tables) + list(self.figures)

    def as_dict(self) -> dict[str, Any]:
        def recs(name: str) -> list[dict[Any, Any]]:
            df = self.tables[name]
            return [{k: _plain(v) for k, v in row.items()} for row in df.to_dict("records")]

        return {
            "verdicts": [v.as_dict() for v in self.verdicts],
            "recommendation": self.recommendation,
            "margins": recs("margins.csv"),
            "first_divergence_margins": recs("first_divergence_margins.csv"),
            "flip_trend": recs("flip_trend.csv"),
            "margin_trend": recs("margin_trend.csv"),
            "benefit": recs("benefit_ratios.csv"),
            "mitigation": recs("mitigation.csv"),
            "tiers": recs("tiers.csv"),
            "quant_mechanism": recs("quant_mechanism.csv"),
            "quant_mechanism_pairs": recs("quant_mechanism_pairs.csv"),
            "tenants": recs("tenants.csv"),
            "tenants_runs": recs("tenants_runs.csv"),
        }

    def report_context(self, data_uri: Callable[[Path], str]) -> dict[str, Any]:
        """The report's `beyond` block; `data_uri(path)` inlines a figure."""
        t = self.tables
        cols = tier_columns(t["tiers.csv"]["tier"].unique() if "tier" in t["tiers.csv"] else ())
        return {
            "verdicts": [v.as_dict() for v in self.verdicts],
            "recommendation": self.recommendation,
            "figures": {name: data_uri(p) for name, p in self.figures.items()},
            "margins": _fmt(
                t["margins.csv"],
                [
                    "config",
                    "plan",
                    "quant",
                    "positions",
                    "median",
                    "q10",
                    *(f"share_below_{x:g}" for x in margins.THRESHOLDS),
                ],
            ),
            "thresholds": [f"{x:g}" for x in margins.THRESHOLDS],
            "first": _fmt(
                t["first_divergence_margins.csv"].head(30),
                ["config", "plan", "run", "episode_id", "request", "token", "margin_off", "margin_on"],
            ),
            "margin_trend": _fmt(t["margin_trend.csv"], ["model_name", "levels", "episodes", "L", "p_value", "note"]),
            "flip_trend": _fmt(t["flip_trend.csv"], ["config", "plan", "positions", "flips", "z", "p_value"]),
            "arms": _fmt(
                t["benefit_arms.csv"],
                [
                    "config",
                    "plan",
                    "arm",
                    "runs",
                    "prompt_tokens",
                    "cached_tokens",
                    "evaluated_tokens",
                    "cached_share",
                    "prompt_ms",
                    "ttft_ms_mean",
                    "wall_s",
                ],
            ),
            "ratios": [
                {
                    **r,
                    "prompt": _ci(r, "prompt_ms"),
                    "server": _ci(r, "server_ms"),
                    "evaluated": _ci(r, "evaluated_tokens"),
                    "wall": f"{_n(r['wall_ratio'])} ({_n(r['wall_ratio_min'])}-{_n(r['wall_ratio_max'])})",
                }
                for r in t["benefit_ratios.csv"].to_dict("records")
            ],
            "mitigation": [_mitigation_row(r) for r in t["mitigation.csv"].to_dict("records")],
            "tier_columns": [h for _, h in cols],
            "tiers": _tier_rows(t["tiers.csv"], cols),
            "quant": _fmt(
                t["quant_mechanism.csv"],
                [
                    "config",
                    "plan",
                    "quant",
                    "level",
                    "positions",
                    "flips",
                    "flip_rate",
                    "margin_median",
                    "delta_median",
                    "delta_q90",
                ],
            ),
            "quant_pairs": _fmt(
                t["quant_mechanism_pairs.csv"],
                [
                    "config",
                    "reference",
                    "plan",
                    "reference_kind",
                    "flip_rate",
                    "reference_flip_rate",
                    "margin_median",
                    "reference_margin_median",
                    "delta_median",
                    "reference_delta_median",
                    "margin_only_rate",
                    "kernel_only_rate",
                    "mh_odds_ratio",
                ],
            ),
            "tenants": beyond_tenants.report_rows(t["tenants.csv"]),
        }


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


def _n(v: Any, digits: int = 3) -> str:
    v = _plain(v)
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _fmt(df: pd.DataFrame, cols: list[str]) -> list[dict[str, Any]]:
    return [{c: _n(r.get(c)) for c in cols} for r in df.to_dict("records")]


def _ci(r: dict[Any, Any], name: str) -> str:
    lo, hi = _plain(r[f"{name}_lo"]), _plain(r[f"{name}_hi"])
    ci = f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
    return f"{_n(r[f'{name}_ratio'])}{ci}"


def _mitigation_row(r: dict[Any, Any]) -> dict[str, Any]:
    rate = _plain(r.get("on_vs_off_rate"))
    return {
        "config": r["config"],
        "plan": r["plan"],
        "setting": r["server_overrides"] or "(defaults)",
        "lifecycle": r["lifecycle"],
        "on_vs_off": (
            f"{int(r['on_vs_off_diverged'])}/{int(r['on_vs_off_episodes'])}" if r["on_vs_off_episodes"] else "-"
        )
        + ("" if rate is None else f" ({100 * rate:.0f}%)"),
        "gap": _n(r["on_vs_off_max_logprob_gap"]),
        "on_rerun": _rerun(r, "on"),
        "off_rerun": _rerun(r, "off"),
        "on_wall": _n(r["on_wall_s"]),
        "off_wall": _n(r["off_wall_s"]),
        "on_prompt_ms": _n(r["on_prompt_ms"]),
        "off_prompt_ms": _n(r["off_prompt_ms"]),
        "on_vs_main": _n(r["on_wall_s_vs_main"]),
        "on_vs_main_off": _n(r["on_wall_vs_main_off"]),
    }


def tier_columns(seen: Iterable[Any] = ()) -> list[tuple[str, str]]:
    """The report's tier columns, (tier, heading), from the engines' declared `cache_tiers` (registry order): "none",
    each engine's tiers, "<a>_or_<b>" for an engine with two, "unknown"; then any other tier the records name, so
    that an engine's new tier is shown, never dropped."""
    cols: dict[str, str] = {"none": "none"}
    for kind in engines.REGISTRY:
        tiers = engines.get(kind).capabilities.cache_tiers
        for t in (*tiers, *(["_or_".join(tiers)] if len(tiers) == 2 else [])):
            cols.setdefault(t, f"{t.replace('_or_', ' or ')} ({kind})")
    cols.setdefault("unknown", "unknown")
    for t in seen:
        cols.setdefault(str(t), str(t))
    return list(cols.items())


_TIER_KEYS = ("config", "plan", "run", "reference", "level")


def _tier_rows(df: pd.DataFrame, columns: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """tiers.csv for the report: one row per configuration, plan, run, reference and level (sorted; a row with a key
    missing left out), a cell per tier column (a tier listed twice: its last row). What `df.groupby(keys,
    sort=True)` gives, without pandas' cost per group (~3 ms each, on the report's critical path)."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in df.to_dict("records"):
        key = tuple(r[k] for k in _TIER_KEYS)
        if any(v is None or v != v for v in key):  # groupby leaves out rows whose key holds a NaN (dropna)
            continue
        groups.setdefault(key, {})[r["tier"]] = f"{int(r['differ'])}/{int(r['n'])} ({100 * r['rate']:.0f}%)"
    return [
        {**dict(zip(_TIER_KEYS, key)), "cells": [cells.get(t, "-") for t, _ in columns]}
        for key, cells in sorted(groups.items())
    ]  # keys are unique: the cells are never compared


def _rerun(r: dict[Any, Any], arm: str) -> str:
    n = _plain(r.get(f"{arm}_rerun_episodes"))
    return "-" if n is None else f"{int(r[f'{arm}_rerun_diverged'])}/{int(n)}"


def _no_lap(name: str) -> None:
    """Where check times its steps (`artifact.check.run.Laps`), each analysis ends with a call naming it."""


def _no_figures(name: str, fn: Callable[..., Any], *args: Any) -> None:
    """Where figures are wanted (`write_beyond`), each is asked for by name as soon as its tables are ready."""


def analyse(runs: list[Run], lap: Callable[[str], None] = _no_lap, draw: Callable[..., None] = _no_figures) -> Beyond:
    """The analyses' tables and verdicts; `draw(name, figure function, *its inputs)` is called for each figure as
    soon as its inputs are ready (check draws them in a worker while the analyses go on). The quantization
    analysis goes first: its figure is the costliest to draw, and the worker draws it while the others run."""
    # tiers and quantization on runs without a tenant server (several slots interleave the log; load is its own study)
    alone = [r for r in runs if not tenant_plan(r)]
    quant_tables, quant_verdicts, positions = quantization.analyse(alone)
    lap("beyond: quantization")
    draw(
        "quant_mechanism.png",
        quantization.draw_figure,
        quantization.figure_data(positions, quant_tables["quant_mechanism_pairs.csv"]),
    )
    lap("beyond: quantization figure data")
    curve = margins.flip_by_margin(runs)
    margin_tables = {
        "margins.csv": margins.margin_distribution(runs),
        "first_divergence_margins.csv": margins.first_divergence_margins(runs),
        "flip_by_margin.csv": curve,
        "flip_trend.csv": margins.flip_trend(curve),
        "margin_trend.csv": margins.margin_trend(runs),
    }
    lap("beyond: margins")
    draw("flip_margin.png", flip_margin_figure, curve)
    costs = benefit.costs_frame(runs)
    benefit_tables = {
        "benefit_runs.csv": costs,
        "benefit_arms.csv": benefit.arm_summary(costs),
        "benefit_ratios.csv": benefit.ratios_frame(runs),
    }
    lap("beyond: benefit")
    rows = mitigation.plan_rows(runs, costs)
    fresh = mitigation.fresh_verdicts(runs)
    lap("beyond: mitigation")
    draw("price.png", price_figure, rows, benefit_tables["benefit_ratios.csv"])
    tier_tables, tier_verdicts = tiers.analyse(alone)
    lap("beyond: tiers")
    draw("tiers.png", tiers.figure, tier_tables["tiers.csv"])
    load = beyond_tenants.section(runs)
    lap("beyond: tenants")
    draw("tenants.png", beyond_tenants.figure, load.plans)
    verdicts = fresh + mitigation.mitigation_verdicts(rows) + tier_verdicts + quant_verdicts + load.verdicts
    tables = {
        **margin_tables,
        **benefit_tables,
        "mitigation.csv": rows,
        **tier_tables,
        **quant_tables,
        "tenants.csv": load.plans,
        "tenants_runs.csv": load.runs,
        "beyond_verdicts.csv": pd.DataFrame(
            [{**v.as_dict(), "evidence": " | ".join(v.evidence)} for v in verdicts],
            columns=["id", "claim", "scope", "status", "observed", "evidence"],
        ),
    }
    b = Beyond(verdicts, tables, mitigation.recommendation(rows, fresh))
    b.positions = positions
    return b


# --- figures --------------------------------------------------------------------------------------------------


def flip_margin_figure(curve: pd.DataFrame, path: Path) -> Path | None:
    """Left: flip probability per margin bin (95% Wilson); right: where the at-risk positions lie."""
    ran = curve[curve["positions"] > 0] if not curve.empty else curve
    if ran.empty:
        return None

    labels = [str(b) for b in curve.drop_duplicates("bin").sort_values("bin")["margin_bin"]]
    fig = new_figure(10.0, 4.2, bottom=0.45 + text_room(labels, 7, 30))
    ax, ax2 = fig.subplots(1, 2)
    for (config, plan), g in ran.groupby(["config", "plan"], sort=True):
        g = g.sort_values("bin")
        rate = g["flip_rate"].astype(float)
        yerr = [
            (100 * (rate - g["wilson_lo"])).clip(lower=0).tolist(),
            (100 * (g["wilson_hi"] - rate)).clip(lower=0).tolist(),
        ]
        ax.errorbar(g["bin"], 100 * rate, yerr=yerr, marker="o", capsize=3, label=f"{config} [{plan}]")
        ax2.plot(g["bin"], 100 * g["positions"] / g["positions"].sum(), marker="s", label=f"{config} [{plan}]")
    for a in (ax, ax2):
        a.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
        a.set_xlabel("top-2 log-probability margin of the OFF arm (nats)")
    ax.set_ylabel("positions whose ON token differs (%)")
    ax.set_title("Flip probability against margin (95% Wilson)", fontsize=9)
    ax2.set_ylabel("share of positions at risk (%)")
    ax2.set_title("Where the margins lie", fontsize=9)
    ax.legend(fontsize=6, loc="upper right", frameon=False)
    fig.savefig(path, format="png")
    return path


def price_figure(rows: pd.DataFrame, ratios: pd.DataFrame, path: Path) -> Path | None:
    """Per configuration and plan: its ON arm's wall time against default recomputation (x) and divergence (y).

    x = ON wall / OFF wall of plan main in the same configuration (what a setting costs against turning the cache
    off); without a main plan, the plan's own ON/OFF wall ratio.
    """
    if rows.empty or ratios.empty:
        return None
    df = rows.merge(ratios[["config", "plan", "wall_ratio"]], on=["config", "plan"])
    df["x"] = df["on_wall_vs_main_off"].where(df["on_wall_vs_main_off"].notna(), df["wall_ratio"])
    df = df[(df["on_vs_off_episodes"] > 0) & df["x"].notna()]
    if df.empty:
        return None

    fig = new_figure(6.5, 4.4)
    ax = fig.add_subplot()
    for i, (_, r) in enumerate(df.iterrows()):
        rate = float(r["on_vs_off_rate"])
        err = [[100 * max(0.0, rate - r["on_vs_off_wilson_lo"])], [100 * max(0.0, r["on_vs_off_wilson_hi"] - rate)]]
        ax.errorbar([r["x"]], [100 * rate], yerr=err, marker="o", capsize=3)
        ax.annotate(
            f"{r['config']} [{r['plan']}]",
            (r["x"], 100 * rate),
            fontsize=6,
            xytext=(4, 4 + 9 * (i % 3)),
            textcoords="offset points",
        )
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("ON wall / wall with the cache off (plan main); < 1: the cache saves time", fontsize=9)
    ax.set_ylabel("ON vs OFF episode pairs diverging (%)")
    ax.set_ylim(-5, 105)
    ax.set_xlim(0, max(1.2, float(np.nanmax(df["x"])) * 1.15))
    ax.set_title("The price of each setting: time saved vs outputs changed (95% Wilson)", fontsize=9)
    fig.savefig(path, format="png")
    return path


BEYOND_FIGURES = ("flip_margin.png", "price.png", "tiers.png", "quant_mechanism.png", "tenants.png")


def write_beyond(
    runs: list[Run],
    out: Path,
    lap: Callable[[str], None] = _no_lap,
    drawing: Drawing | None = None,
    meanwhile: Callable[[], object] = lambda: None,
) -> Beyond:
    """Analyse, write the CSVs into `out` (which exists), and the figures, through `drawing` (asked for each as soon
    as its inputs are ready: artifact.check.worker; without one, drawn here once the CSVs are written). Returns
    once every figure asked of `drawing` is drawn; `meanwhile()` is done before waiting for them."""
    drawing = drawing if drawing is not None else Drawing()
    b = analyse(runs, lap, lambda name, fn, *args: drawing.draw(name, fn, *args, out / name))
    for name, df in b.tables.items():
        safe_frame(df).to_csv(out / name, index=False)
    lap("beyond: csv")
    meanwhile()
    drawn = drawing.results()
    lap("figures")
    b.figures = {name: path for name in BEYOND_FIGURES if (path := drawn.get(name, (None,))[0]) is not None}
    return b
