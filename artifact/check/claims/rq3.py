"""RQ3: Coarser quantization amplifies ON-vs-OFF divergence (trend test significant at 0.05)."""

from __future__ import annotations

from typing import Any
import itertools

import pandas as pd

from artifact.analysis.stats import cochran_armitage
from artifact.analysis.tables import PAPER_PLAN, Tables
from artifact.check.core import (
    ALPHA,
    FAIL,
    INCONCLUSIVE,
    INVALID,
    NOT_RUN,
    PASS,
    Claim,
    Context,
    fmt_p,
    group_problems,
    make_claim,
    Paper,
    paper_configs_for,
    Verdict,
)
from artifact.check.rules import rule, text

ID = "RQ3"
RULE = rule(ID)  # statement, hard, rule, minimum_evidence: claims/rules.toml
TEXT = text(ID)
TESTED = ("trend_z_qwen2.5-7b", "trend_p_qwen2.5-7b")  # the paper's trend test (§IV-D)
RISING = tuple(f"on_vs_off_llama-3.1-8b_{q}" for q in ("Q8_0", "Q4_K_M", "Q3_K_M"))  # rates, no test (Tab. 2)


def series_of(paper: Paper, keys: tuple[str, ...]) -> str | None:
    """The paper's configuration ids of a series ("model/engine/"), from the configurations its values are of."""
    parts = [v["config"].split("/") for k in keys if (v := paper.value(k)) and v.get("config")]
    if not parts:
        return None
    common = (
        parts[0] if len(parts) == 1 else [p[0] for p in itertools.takewhile(lambda p: len(set(p)) == 1, zip(*parts))]
    )
    return "/".join(common) + "/"


def rq3(tables: Tables, paper: Paper) -> Claim:
    details = []
    tested, rising = series_of(paper, TESTED), series_of(paper, RISING)
    trend = tables.fig2_trend
    paper_n = int(paper.meta["episodes"])
    for _, t in trend.iterrows() if not trend.empty else []:
        rows = tables.fig2[tables.fig2["series"] == t["series"]]
        meta = {"engine": rows["engine"].iloc[0], "pinned_model": tables.series_pinned.get(t["series"])}
        ids = paper_configs_for(meta, paper.configs, with_quant=False)
        expected = "z > 0, p < 0.05"
        direction_only = False  # the paper's own rates for this series are not significant: ask only for z > 0
        if tested and any(i.startswith(tested) for i in ids):
            z, p = (paper.value(k) for k in TESTED)
            if z and p:
                expected = f"z = {z['value']}, p = {p['value']:.2g} ({z['source']}; levels F16, Q8_0, Q4_K_M, Q3_K_M)"
        elif rising and any(i.startswith(rising) for i in ids):
            expected = "rising: Q8_0 55.0% -> Q4_K_M 70.0% -> Q3_K_M 68.8% (Tab. 2; no test reported)"
            vals: list[Any] = [paper.value(k) for k in RISING]  # all(vals): none is None
            if all(vals):
                tz, tp = cochran_armitage([paper.k_of(v) for v in vals], [paper.n_of(v) for v in vals])
                expected += (
                    f"; computed here, the same test on those values gives z = {tz:.2f}, p = {tp:.2g}, "
                    "so this series would not reach 0.05 even at the paper's own rates"
                )
                direction_only = tp >= ALPHA
        obs = f"{t['levels']}: k = {t['k']} of n = {t['n']}" if t["n_levels"] else "no known quantization level"
        groups = [tables.group(c, PAPER_PLAN) for c in rows["config"]]
        invalid = [x for g in groups for x in group_problems(g)]
        at_scale = bool(len(rows)) and bool((rows["div_n"] >= paper_n).all())
        why = []
        testable = t["n_levels"] >= 3 and t["z"] is not None and not pd.isna(t["z"])
        # (a series holds only levels whose weights the artifact loaded and looked up by digest: `series_rows`)
        if invalid and testable:
            status, why = INVALID, invalid
        elif testable:
            obs += f"; Cochran-Armitage z = {t['z']:.2f}, p = {fmt_p(t['p'])}"
            if t["z"] > 0 and (direction_only or t["p"] < ALPHA):
                status = PASS
            elif t["z"] < 0 and t["p"] < ALPHA:
                status, why = FAIL, ["significant trend the other way (z < 0, p < 0.05)"]
            elif ids and at_scale:
                status, why = (
                    FAIL,
                    [
                        f"a series the paper measured, at the paper's scale (>= {paper_n} episodes per "
                        "level), without the paper's trend"
                    ],
                )
            else:
                status = INCONCLUSIVE
                why = [
                    ("trend not significant" if not direction_only else "no rising direction")
                    + (
                        f" on fewer than the paper's {paper_n} episodes per level"
                        if ids
                        else " on a model and engine the paper did not measure: no evidence against the paper"
                    )
                ]
        else:
            status = NOT_RUN
            obs += f" ({t['n_levels']} known level(s); the test needs >= 3)"
            if t.get("unknown_levels"):
                obs += f"; not in the quantization order: {t['unknown_levels']}"
        ev = why + [f"configs: {', '.join(rows['config'])} (plan main, ON run 1 vs OFF run 1)"]
        if t.get("unknown_levels"):
            ev.append(f"levels not in QUANT_LEVELS, left out: {t['unknown_levels']}")
        rule = (
            "z > 0 (direction only: the paper's own rates for this series are not significant)"
            if direction_only
            else "significance at 0.05, z > 0 (no band on z)"
        )
        details.append(Verdict.of_claim(ID, str(t["series"]), "trend", status, obs, expected, rule, ev))
    tested_details = [d for d in details if d.status != NOT_RUN]
    observed = (
        "; ".join(f"{d.scope}: {d.status}: {d.observed}" for d in tested_details)
        or "no model with >= 3 quantization levels run"
    )
    if len(tested_details) < len(details):
        observed += f" ({len(details) - len(tested_details)} series with < 3 levels not tested)"
    outside = tables.outside_series
    if outside:  # configurations whose weights' lineage the facts cannot decide: in no series (never by their name)
        observed += (
            f"; {len(outside)} configuration(s) in no series: which model their weights are a level of is "
            "not known from the records"
        )
    return make_claim(
        ID,
        RULE,
        details,
        observed,
        TEXT["expected"],
        "trend significant at 0.05 with >= 3 levels",
        [f"{d.scope}: {d.status}" for d in details] + [f"in no series: {x}" for x in outside],
    )


def judge(ctx: Context) -> Claim:
    return rq3(ctx.tables, ctx.paper)
