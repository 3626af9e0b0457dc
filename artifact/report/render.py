"""The checker's figures (matplotlib, Agg, PNG) and its single self-contained HTML report (jinja2).

The report inlines its figures as base64 data URIs and loads nothing else: no scripts, stylesheets, fonts or
images from anywhere, and a Content-Security-Policy that forbids them. Model output is untrusted text: the jinja2
environment escapes every value (autoescape is switched on explicitly, since the template's `.j2` name would
defeat jinja2's extension-based default), and nothing in the template is marked safe.
"""

from __future__ import annotations

import base64
import math
import shlex
from functools import cache
from pathlib import Path

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from artifact import workloads
from artifact.analysis.groups import cache_condition
from artifact.analysis.figure import legend_rows, new_figure, overhang, text_room
from artifact.analysis.fmt import num, pct, rate_cell, records
from artifact.analysis.tables import FIG1_CONDITIONS, QUANT_LEVELS, USER_SERVER_UNOBSERVED, Tables, as_dict, relative
from artifact.records.store import Run
from artifact.report.example import divergence_example
from artifact.report.shown import config_now, glance, shown_path
from artifact.workloads.base import Wording
from artifact.verdict import STATUSES

TEMPLATES = Path(__file__).resolve().parent / "templates"
WORKLOAD_TEMPLATES = Path(__file__).resolve().parents[1] / "workloads"
TEMPLATE = "report.html.j2"


# --- figures --------------------------------------------------------------------------------------------------


def _yerr(df: pd.DataFrame, prefix: str):
    rate = df[f"{prefix}_rate"].astype(float)
    lo = (rate - df[f"{prefix}_wilson_lo"].astype(float)).clip(lower=0)
    hi = (df[f"{prefix}_wilson_hi"].astype(float) - rate).clip(lower=0)
    return [(100 * lo).tolist(), (100 * hi).tolist()]  # lists: a (2, 1) array trips a NumPy deprecation in matplotlib


def fig1_figure(fig1: pd.DataFrame, path: Path) -> Path | None:
    ran = fig1[fig1["ran"]] if not fig1.empty else fig1
    if ran.empty:
        return None
    configs = list(dict.fromkeys(ran["config"]))
    conds = [c for c in FIG1_CONDITIONS if ((ran["comparison"] == c[0]) & (ran["plan"] == c[1])).any()]
    fig_w, fig_h = min(14.0, max(6.5, 1.2 * len(configs) * len(conds) / 2 + 2.5)), 4.8
    fig = new_figure(fig_w, fig_h)
    ax = fig.add_subplot()
    width = 0.8 / len(conds)
    colors = ["#4c72b0", "#55a868", "#8172b2", "#dd8452", "#c44e52"]
    paper_label = True
    for j, (kind, plan, label) in enumerate(conds):
        sub = ran[(ran["comparison"] == kind) & (ran["plan"] == plan)].set_index("config").reindex(configs)
        ok = sub["div_rate"].notna().to_numpy()
        xs = [i + (j - (len(conds) - 1) / 2) * width for i in range(len(configs))]
        xs_ok = [x for x, m in zip(xs, ok) if m]
        part = sub[ok]
        ax.bar(
            xs_ok,
            100 * part["div_rate"].astype(float),
            width,
            yerr=_yerr(part, "div"),
            capsize=3,
            label=f"{label} [{plan}]",
            color=colors[j % len(colors)],
        )
        for x, (_, r) in zip(xs_ok, part.iterrows()):
            ax.annotate(
                f"{int(r['div_k'])}/{int(r['div_n'])}",
                (x, 100 * float(r["div_wilson_hi"]) + 1.5),
                ha="center",
                fontsize=7,
            )
            pv = r.get("paper_value")
            if pv is not None and not (isinstance(pv, float) and math.isnan(pv)):
                ax.plot(
                    [x],
                    [100 * pv],
                    marker="D",
                    color="black",
                    linestyle="none",
                    label="paper (same configuration)" if paper_label else None,
                )
                paper_label = False
    rotation = 20 if len(configs) > 4 else 0
    ax.set_xticks(range(len(configs)), configs, rotation=rotation, ha="right" if rotation else "center", fontsize=7)
    ax.set_ylabel("episodes diverging (%)")
    ax.set_ylim(0, 112)
    ax.set_title("Fig. 1: cause isolation (bars: observed, 95% Wilson intervals)")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    fig.subplots_adjust(
        left=(0.7 + overhang(configs[0], 7, rotation)) / fig_w,
        bottom=(0.2 + text_room(configs, 7, rotation) + legend_rows(len(labels))) / fig_h,
    )
    fig.savefig(path, format="png")
    return path


def fig2_figure(fig2: pd.DataFrame, trend: pd.DataFrame, path: Path) -> Path | None:
    known = fig2[fig2["rank"].notna()] if not fig2.empty else fig2
    if known.empty:
        return None
    ranks = sorted(set(known["rank"].astype(int)))
    names = {q.rank: q.name for q in reversed(QUANT_LEVELS)}  # F16 over BF16 for a shared rank
    pos = {r: i for i, r in enumerate(ranks)}
    fig_w, fig_h = max(6.0, 1.1 * len(ranks) + 3), 4.8
    fig = new_figure(fig_w, fig_h)
    ax = fig.add_subplot()
    tr = trend.set_index("series") if not trend.empty else None
    for series, df in known.groupby("series", sort=True):
        df = df.sort_values("rank")
        xs = [pos[int(r)] for r in df["rank"]]
        label = str(series)
        if tr is not None and series in tr.index and pd.notna(tr.loc[series, "z"]):
            label += f" (z = {tr.loc[series, 'z']:.2f}, p = {tr.loc[series, 'p']:.2g})"
        line = ax.errorbar(
            xs, 100 * df["div_rate"].astype(float), yerr=_yerr(df, "div"), marker="o", capsize=3, label=label
        )
        pv = df["paper_value"].astype(float) if "paper_value" in df else None
        if pv is not None and pv.notna().any():
            m = pv.notna().to_numpy()
            ax.plot(
                [x for x, k in zip(xs, m) if k],
                100 * pv[m],
                marker="D",
                markerfacecolor="none",
                color=line[0].get_color(),
                linestyle="none",
                label=f"{series}: paper",
            )
    ax.set_xticks(range(len(ranks)), [names[r] for r in ranks])
    ax.set_xlabel("quantization level (finer -> coarser)")
    ax.set_ylabel("ON vs OFF episodes diverging (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Fig. 2: ON-vs-OFF divergence by quantization level (95% Wilson)")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    fig.subplots_adjust(bottom=(0.6 + legend_rows(len(labels))) / fig_h)
    fig.savefig(path, format="png")
    return path


PAPER_FIGURES = ("fig1.png", "fig2.png")


def draw_figures(tables: Tables, out: Path, drawing) -> None:
    """Ask `drawing` (artifact.check.worker) for fig1.png and fig2.png in `out` (drawn when the runs allow)."""
    drawing.draw("fig1.png", fig1_figure, tables.fig1, out / "fig1.png")
    drawing.draw("fig2.png", fig2_figure, tables.fig2, tables.fig2_trend, out / "fig2.png")


def tab2_rows(tables: Tables) -> list[dict]:
    out = []
    for r in records(tables.tab2):
        mr, mt = r.get("median_first_request"), r.get("median_first_token")
        out.append(
            {
                "config": r["config"],
                "plan": r["plan"],
                "plan_detail": f"{r.get('lifecycle') or '?'} server, {r.get('cache_condition') or 'cache condition not recorded'}",
                "model": f"{r.get('model_name') or r.get('model_family') or '?'} {r.get('quant') or ''} on "
                f"{r.get('engine')}",
                "episodes": r.get("episodes"),
                "off_rerun": rate_cell(r, "off_rerun"),
                "on_rerun": rate_cell(r, "on_rerun"),
                "on_vs_off": rate_cell(r, "on_vs_off"),
                "all_pairs": r.get("on_vs_off_all_pairs") or "-",
                "first": f"{num(mr)} / {num(mt)}" if mr is not None else "-",
                "acc_off": f"{r['valid_off']}/{r['episodes_off']}" if r.get("episodes_off") else "-",
                "acc_on": f"{r['valid_on']}/{r['episodes_on']}" if r.get("episodes_on") else "-",
                "cached_on": pct(r.get("cached_share_on")) if r.get("cache_reported_on") else "not reported",
                "cached_off": pct(r.get("cached_share_off")) if r.get("cache_reported_off") else "not reported",
                "paper": pct(r.get("paper_on_vs_off")),
                "paper_config": r.get("paper_config") or "-",
                "invalid": r.get("invalid"),
            }
        )
    return out


def _group_workload(runs: list[Run]) -> tuple[str, Wording]:
    """The workload of a configuration-plan's runs, by name, and its words (neutral ones for a workload this version
    does not know)."""
    w = workloads.of_run(runs[0]) if runs else None
    if w is None:
        return str((runs[0].manifest.get("workload") if runs else None) or "unknown workload"), Wording()
    return w.name, w.wording


def tab2_sections(tables: Tables) -> list[dict]:
    """Tab. 2 once per workload of the paired runs, in registry order: its rows, its title and the name of its
    validity column (the workload's `Wording`); one section, untitled and empty, where no paired runs were checked."""
    of_group = {(g.config, g.plan): _group_workload(g.runs) for g in tables.groups}
    by_name: dict[str, tuple[Wording, list[dict]]] = {}
    for row in tab2_rows(tables):
        name, wording = of_group.get((row["config"], row["plan"])) or _group_workload([])
        by_name.setdefault(name, (wording, []))[1].append(row)
    order = [n for n in workloads.REGISTRY if n in by_name] + [n for n in by_name if n not in workloads.REGISTRY]
    out = []
    for i, name in enumerate(order):
        wording, rows = by_name[name]
        out.append(
            {
                "id": "tab2" if i == 0 else f"tab2-{name}",
                "title": wording.title or name,
                "valid_column": wording.valid_column,
                "rows": rows,
            }
        )
    return out or [{"id": "tab2", "title": "", "valid_column": Wording.valid_column, "rows": []}]


def unisolated_harnesses(runs: list[Run], labels: list[str]) -> list[str]:
    """What executed the model's output in the runs that were not network-isolated (their workloads'
    `Wording.harness`, where it executes it), each once; none where their workloads execute none of it."""
    at = set(labels)
    found = (workloads.of_run(r) for r in runs if r.label in at)
    return list(dict.fromkeys(w.wording.harness for w in found if w is not None and w.wording.executes_output))


def fig1_rows(tables: Tables) -> list[dict]:
    return [
        {
            "config": r["config"],
            "condition": r["condition"],
            "plan": r["plan"],
            "ran": r["ran"],
            "rate": rate_cell(r, "div"),
            "paper": pct(r.get("paper_value")),
            "source": r.get("paper_source") or "",
        }
        for r in records(tables.fig1)
    ]


def fig2_rows(tables: Tables) -> list[dict]:
    return [
        {
            "series": r["series"],
            "config": r["config"],
            "quant": r.get("quant"),
            "level": r.get("level") or "unknown",
            "bpw": num(r.get("bpw"), 3),
            "rate": rate_cell(r, "div"),
            "paper": pct(r.get("paper_value")),
        }
        for r in records(tables.fig2)
    ]


def trend_rows(tables: Tables) -> list[dict]:
    return [
        {
            "series": r["series"],
            "levels": r["levels"],
            "k": r["k"],
            "n": r["n"],
            "z": num(r.get("z"), 3),
            "p": num(r.get("p"), 2),
            "unknown": r.get("unknown_levels") or "",
        }
        for r in records(tables.fig2_trend)
    ]


def _gpus(host: dict) -> str:
    gpus = host.get("gpus") or []
    if not isinstance(gpus, list) or not gpus:
        return "none (CPU only)"
    return "; ".join(", ".join(f"{k} {v}" for k, v in g.items()) for g in gpus if isinstance(g, dict))


def _cmd(cmd) -> str:
    if isinstance(cmd, list):
        return shown_path(shlex.join(str(c) for c in cmd))
    return "-" if cmd is None else shown_path(str(cmd))


def provenance(runs: list[Run], root: Path) -> list[dict]:
    """Per configuration: model, engine build, host, key packages; per plan: lifecycle and each run's server."""
    out: dict[str, dict] = {}
    for run in runs:
        m = run.manifest
        cfg = out.get(m["config"])
        if cfg is None:
            model = as_dict(m.get("model")) or as_dict(as_dict(m.get("config_data")).get("model"))
            host = as_dict(m.get("host"))
            pk = as_dict(as_dict(m.get("packages")).get("key"))
            cfg = out[m["config"]] = {
                "config": m["config"],
                "engine": m.get("engine") or "-",
                "engine_build": m.get("engine_build") or "-",
                "build_flags": ", ".join(
                    f"{k}={v}"
                    for k, v in as_dict(m.get("engine_build_flags")).items()
                    if not isinstance(v, (dict, list))
                )
                or "-",
                "model": ", ".join(f"{k} {model.get(k)}" for k in ("family", "name", "quant") if model.get(k)) or "-",
                "sha256": model.get("sha256") or "-",
                "source": model.get("source") or "-",
                "cpu": f"{host.get('cpu', '-')} ({host.get('cpu_count', '?')} cores)",
                "gpus": _gpus(host),
                "os": host.get("os") or "-",
                "python": host.get("python") or "-",
                "packages": ", ".join(f"{k} {v}" for k, v in pk.items()) or "-",
                "prompt_variant": m.get("prompt_variant") or "-",
                "workload": m.get("workload") or "-",
                "config_path": config_now(m.get("config_path")),
                "plans": {},
            }
        pd_ = as_dict(m.get("plan_data"))
        plan = cfg["plans"].setdefault(
            m["plan"],
            {
                "plan": m["plan"],
                "lifecycle": m.get("lifecycle") or "-",
                "cache": cache_condition(run)["description"],
                "description": pd_.get("description") or "",
                "runs": [],
            },
        )
        plan["runs"].append(
            {
                "label": f"{m['arm']} run {m['run']}",
                "session": m.get("session") or "-",
                "status": m.get("status"),
                "episodes": len(m["episodes"]),
                "server_cmd": _cmd(m.get("server_cmd")),
                "server_log": shown_path(str(m.get("server_log") or "-")),
                "path": relative(run.path, root),
                "started": m.get("started_at") or "-",
                "finished": m.get("finished_at") or "-",
                "wall_s": m.get("wall_s"),
                "engine_build": m.get("engine_build") or "-",
            }
        )
    for cfg in out.values():
        cfg["plans"] = list(cfg["plans"].values())
    return list(out.values())


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


@cache
def environment() -> Environment:
    """The report's templates, and the workloads' own sections (`<workload package>/<file>.j2`): one environment per
    process, which keeps each template compiled (and compiles it again where its file has changed)."""
    return Environment(
        loader=FileSystemLoader([str(TEMPLATES), str(WORKLOAD_TEMPLATES)]),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def compile_templates() -> None:
    """Compile every template of the report now (~0.07 s): check does it while its worker draws the last figures,
    before the report can be written."""
    env = environment()
    for name in env.list_templates(extensions=["j2"]):
        env.get_template(name)


def workload_sections(runs: list[Run], workload_tables: dict) -> list[dict]:
    """Each workload's section of the report (its template and context), in registry order."""
    out = []
    for name, (workload, wruns) in workloads.by_workload(runs).items():
        section = workload.report_section(wruns, workload_tables.get(name, {}))
        if section is not None:
            out.append(section)
    return out


def records_time(runs: list[Run]) -> str:
    """When the newest of the runs finished, from their manifests: the report's date, so that checking the same
    records twice writes the same page (never the clock of the check)."""
    times = sorted(str(t) for run in runs if (t := run.manifest.get("finished_at") or run.manifest.get("started_at")))
    return times[-1] if times else "unknown"


def render_report(
    *,
    root: Path,
    runs: list[Run],
    tables: Tables,
    workload_tables: dict,
    claims: list,
    problems: list[str],
    exit_code: int,
    exit_meaning: str,
    band_rule: str,
    figures: dict[str, Path],
    warnings: dict[str, list[str]] | None = None,
    beyond=None,
    label: str | None = None,
) -> str:
    """The report page. What it says of the check comes from check itself (artifact.check.run, above this module):
    its claims (artifact.check.core.Claim), the exit code's meaning and the band rule in words."""
    counts = {s: sum(c.status == s for c in claims) for s in STATUSES}
    unisolated = [label for label, ws in (warnings or {}).items() if ws]
    context = {
        "title": "Prefix caching and serving reproducibility: check report",
        "generated": records_time(runs),
        "results_dir": label or str(root),
        "n_runs": len(runs),
        "exit_code": exit_code,
        "counts": counts,
        "exit_meaning": exit_meaning,
        "warnings": warnings or {},
        "unisolated": unisolated,
        "unisolated_harnesses": unisolated_harnesses(runs, unisolated),
        "user_server": tables.user_server,
        "user_server_unobserved": USER_SERVER_UNOBSERVED,
        "claims": claims,
        "glance": glance(claims, beyond),
        "problems": problems,
        "band_rule": band_rule,
        "tab2": tab2_sections(tables),
        "workload_sections": workload_sections(runs, workload_tables),
        "fig1": fig1_rows(tables),
        "fig2": fig2_rows(tables),
        "trend": trend_rows(tables),
        "figures": {name: _data_uri(p) for name, p in figures.items()},
        "provenance": provenance(runs, root),
        "example": divergence_example(tables.groups),
        "quant_levels": [
            {"name": q.name, "rank": q.rank, "bpw": q.bpw, "ppl": num(q.ppl_increase, 4)} for q in QUANT_LEVELS
        ],
        "beyond": beyond.report_context(_data_uri) if beyond is not None else None,  # artifact.check.beyond
    }
    return environment().get_template(TEMPLATE).render(**context)


def write_report(path: Path, **kwargs) -> Path:
    path = Path(path)
    # model text is untrusted: a lone surrogate (a JSON escape) is written as its escape, never a failed write
    path.write_text(render_report(**kwargs), encoding="utf-8", errors="backslashreplace")
    return path
