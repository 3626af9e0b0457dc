"""The paper's values beside this artifact's, per claim: `docs/paper-vs-here.md`, made by `./run.sh evidence-summary`.

Made from the committed evidence only (each folder's `summary.json`, made by `artifact/evidence.py` from its records,
and its check outputs: `check/check.json`, `tab2.csv`, `fig2_trend.csv`, `tab3.csv`) and the paper's values with
their sources (`expected/paper.toml`); never typed by hand. Every evidence folder with a summary is read: a new one
(say, GSM8K bridge runs that decide RQ5) appears on the page when its summary and check outputs are committed. Per
claim the page gives the paper's values and section, what each model family and engine measured here with Wilson 95 %
intervals (`artifact/analysis/stats.py`), the verdict, whether the claim is comparable by value or by direction only,
and why the two can differ. `tests/test_paper_vs_here.py` holds the committed page to what this module makes of the
committed evidence; `./run.sh evidence-summary --check` exits 1 when it is out of date.

One module: one page, read top to bottom: the paper's values per claim, how each claim's measured values are read
from a folder's check outputs, how folders are grouped, and the page's facts; no part is used by anything else.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import jinja2

from artifact import evidence
from artifact.analysis.stats import wilson_interval
from artifact.check.expected import load_document
from artifact.config import REPO
from artifact.workloads import cache_bridges

PAGE = REPO / "docs" / "paper-vs-here.md"
TEMPLATE = Path(__file__).with_name("paper_vs_here.md.j2")
DECIDED = ("PASS", "FAIL", "OUT-OF-BAND")  # verdicts that decide a claim (INVALID, INCONCLUSIVE, NOT-RUN do not)
# RQ5 shows, beside the folders that decide it, those whose bridge ran the paper's own items and stayed INCONCLUSIVE:
# their flips, accuracies and the pooled test's power are the measurement, even where it decides nothing
MEASURED_UNDECIDED = {"RQ5": ("INCONCLUSIVE",)}

# Per claim, the paper's values the page quotes (keys of expected/paper.toml) and what each one is.
PAPER_VALUES: dict[str, tuple[tuple[str, str], ...]] = {
    "RQ1": (
        ("off_rerun_divergence_all", "OFF reruns diverging, all ten configurations"),
        ("off_rerun_ceiling_95ci", "95 % upper bound on any other source of nondeterminism"),
    ),
    "RQ2": (
        ("on_vs_off_divergence_min", "ON vs OFF diverging, lowest configuration"),
        ("on_vs_off_divergence_max", "ON vs OFF diverging, highest configuration"),
        ("on_rerun_divergence_min", "ON reruns diverging, lowest configuration"),
        ("on_rerun_divergence_max", "ON reruns diverging, highest configuration"),
        ("on_vs_off_qwen2.5-7b_F16", "ON vs OFF diverging"),
        ("on_vs_off_qwen2.5-7b_Q4_K_M", "ON vs OFF diverging"),
        ("on_vs_off_llama-3.1-8b_Q8_0", "ON vs OFF diverging"),
        ("on_vs_off_llama-3.1-8b_Q4_K_M", "ON vs OFF diverging"),
        ("on_vs_off_llama-3.1-8b_Q3_K_M", "ON vs OFF diverging"),
        ("on_rerun_llama.cpp_16bit", "ON reruns diverging"),
    ),
    "RQ2b": (
        ("fig1_on_rerun_cram0", "ON reruns diverging, host prompt cache off"),
        ("fig1_on_rerun_default", "ON reruns diverging, host prompt cache on (default)"),
        ("fig1_off_rerun", "OFF reruns diverging"),
        ("fig1_on_vs_off_within_run", "ON vs OFF within one run"),
    ),
    "RQ3": (
        ("trend_z_qwen2.5-7b", "Cochran-Armitage trend over four levels, z"),
        ("trend_p_qwen2.5-7b", "Cochran-Armitage trend over four levels, p"),
        ("on_vs_off_llama-3.1-8b_Q8_0", "ON vs OFF diverging"),
        ("on_vs_off_llama-3.1-8b_Q3_K_M", "ON vs OFF diverging"),
    ),
    "RQ4": (
        ("on_rerun_vllm_16bit", "ON reruns diverging, one session"),
        ("on_rerun_vllm_16bit_other_session", "ON reruns diverging, the other session"),
        ("on_vs_off_vllm_16bit", "ON vs OFF diverging"),
    ),
    "RQ5": (
        ("gsm8k_cold_vs_warm_F16", "cold vs warm answers differ"),
        ("gsm8k_cold_vs_warm_Q8_0", "cold vs warm answers differ"),
        ("gsm8k_cold_vs_warm_Q4_K_M", "cold vs warm answers differ"),
        ("gsm8k_cold_vs_warm_Q3_K_M", "cold vs warm answers differ"),
        ("gsm8k_flips_favor_cache", "answer flips favouring the cache path"),
        ("gsm8k_flips_favor_recompute", "answer flips favouring recomputation"),
        ("gsm8k_mcnemar_p", "exact McNemar test on the flips, p"),
        ("gsm8k_cold_internal_agreement", "cold path identical to itself, per configuration"),
        ("gsm8k_accuracy_min", "accuracy, lowest configuration"),
        ("gsm8k_accuracy_max", "accuracy, highest configuration"),
    ),
}


def _csv(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")))) if path.exists() else []


def _int(value) -> int | None:
    return None if value in (None, "") else int(float(value))


def rate(k, n) -> str:
    """'k/n = r % (Wilson 95 % lo-hi %)', or '-' where the comparison did not run."""
    k, n = _int(k), _int(n)
    if k is None or not n:
        return "-"
    lo, hi = wilson_interval(k, n)
    return f"{k}/{n} = {100 * k / n:.1f} % ({100 * lo:.1f}-{100 * hi:.1f} %)"


def paper_value(v: dict) -> str:
    """A paper value as the summary prints it: a rate in %, k/n where stated; z, p, counts as numbers."""
    if not v.get("reported", True):
        return "not in the summary"
    x = v["value"]
    if v["unit"] == "fraction":  # printed to one decimal, or as many as the summary gives (1.54 %)
        shown = f"{100 * x:.1f}" if round(100 * x, 1) == round(100 * x, 6) else f"{100 * x:g}"
        shown += " %"
        return f"{v['k']}/{v['n']} = {shown}" if "k" in v and "n" in v else shown
    return f"{x:g}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


class Folder:
    """One evidence folder as the page reads it: its summary and its check outputs."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.summary = json.loads((path / evidence.SUMMARY_JSON).read_text(encoding="utf-8"))
        check = path / "check" / "check.json"
        self.claims = (
            {c["id"]: c for c in json.loads(check.read_text(encoding="utf-8")).get("claims") or []}
            if check.exists()
            else {}
        )
        self.tab2 = {f"{r['config']} / {r['plan']}": r for r in _csv(path / "check" / "tab2.csv")}
        self.trends = {r["series"]: r for r in _csv(path / "check" / "fig2_trend.csv")}
        self.tab3 = _csv(path / "check" / "tab3.csv")  # a row per bridge run, then the pooled row

    def verdict(self, claim: str) -> str:
        return (self.claims.get(claim) or {}).get("status", "NOT-RUN")

    def hardware(self) -> str:
        host = self.summary["host"]
        if host["gpus"] != ["none"]:
            return ", ".join(host["gpus"])
        return f"CPU only ({', '.join(map(str, host['cpu']))}, {', '.join(map(str, host['cpu_count']))} cores)"

    def details(self, claim: str) -> list[dict]:
        return (self.claims.get(claim) or {}).get("details") or []


def _family(rows: list[dict]) -> tuple[str, str]:
    """(model, engine) of the tab2/tab3 rows a group shows."""
    models = sorted({r.get("model_name") or r.get("model") or "-" for r in rows})
    engines = sorted({r.get("engine") or "-" for r in rows})
    return "; ".join(models), ", ".join(engines)


def _scope_rows(folder: Folder, claim: str) -> list[tuple[dict, dict]]:
    """(tab2 row, detail) for each configuration-plan scope the claim judged in this folder."""
    return [(folder.tab2[d["scope"]], d) for d in folder.details(claim) if d["scope"] in folder.tab2]


def _label(row: dict) -> str:
    return f"{row['config']} ({row['plan']})"


def measured(folder: Folder, claim: str) -> tuple[list[str], list[list[str]], list[dict]]:
    """The columns and rows a claim's table shows for one folder, and the records (tab2/tab3 rows) they come from."""
    if claim == "RQ1":
        pairs = [(r, d) for r, d in _scope_rows(folder, claim) if _int(r.get("off_rerun_n"))]
        if not pairs:
            return [], [], []
        k = sum(_int(r["off_rerun_k"]) or 0 for r, _ in pairs)
        n = sum(_int(r["off_rerun_n"]) or 0 for r, _ in pairs)
        cols = ["OFF reruns diverging, all configuration-plans (Wilson 95 %)", "configuration-plans"]
        return cols, [[rate(k, n), str(len(pairs))]], [r for r, _ in pairs]
    if claim in ("RQ2", "RQ4"):
        pairs = _scope_rows(folder, claim)
        cols = ["configuration (plan)", "ON vs OFF", "ON reruns", "OFF reruns", "verdict"]
        if claim == "RQ4":
            cols = ["configuration (plan)", "OFF reruns", "ON vs OFF", "ON reruns", "verdict"]
        rows = []
        for r, d in pairs:
            vals = [rate(r.get(f"{c}_k"), r.get(f"{c}_n")) for c in ("on_vs_off", "on_rerun", "off_rerun")]
            if claim == "RQ4":
                vals = [vals[2], vals[0], vals[1]]
            paper = f"; paper, same configuration: {r['paper_on_vs_off']}" if r.get("paper_on_vs_off") else ""
            rows.append([_label(r) + paper, *vals, d["status"]])
        return cols, rows, [r for r, _ in pairs]
    if claim == "RQ2b":
        pairs = _scope_rows(folder, claim)
        cols = ["configuration (plan)", "ON reruns diverging", "default ON reruns (plan main)", "verdict"]
        rows, used = [], []
        for r, d in pairs:
            main = folder.tab2.get(f"{r['config']} / main", {})
            rows.append(
                [
                    _label(r),
                    rate(r.get("on_rerun_k"), r.get("on_rerun_n")),
                    rate(main.get("on_rerun_k"), main.get("on_rerun_n")),
                    d["status"],
                ]
            )
            used += [r, main]
        return cols, rows, used
    if claim == "RQ3":
        cols = ["series", "levels", "ON vs OFF diverging per level", "Cochran-Armitage z, p", "verdict"]
        rows, used = [], []
        for d in folder.details(claim):
            t = folder.trends.get(d["scope"])
            if t is None or d["status"] == "NOT-RUN":
                continue
            ks, ns = t["k"].split(), t["n"].split()
            z, p = float(t["z"]), float(t["p"])
            rows.append(
                [d["scope"], t["levels"], ", ".join(f"{k}/{n}" for k, n in zip(ks, ns)), f"{z:.2f}, {p:.2g}"]
                + [d["status"]]
            )
            model, _, engine = d["scope"].rpartition(" / ")
            used.append({"model_name": model, "engine": engine})
        return cols, rows, used
    # RQ5: the GSM8K bridge's rows (Tab. 3), whatever their items, labelled with them
    cols = [
        "configuration",
        "items",
        "cold vs warm differ",
        "cold, warm identical",
        "accuracy: recompute, cache",
        "flips: to cache, to recompute",
        "McNemar p",
        "power (1 pp)",
        "verdict",
    ]
    status = {d["scope"]: d["status"] for d in folder.details(claim)}
    status["pooled"] = next((d["status"] for d in folder.details(claim) if d["scope"].startswith("pooled")), "-")
    rows = []
    for r in folder.tab3:
        n = _int(r.get("n"))
        differ = _int(r["cold_warm_diverged"])
        rows.append(
            [
                r["config"],
                f"{n} ({r['data']})",
                rate(differ, n),
                f"{r['cold_identical']}/{n}, {r['warm_identical']}/{n}",
                f"{rate(r['cold_numeric_correct'], n)}; {rate(r['warm_numeric_correct'], n)}",
                f"{r['flips_numeric_cache']}, {r['flips_numeric_recompute']}",
                f"{float(r['mcnemar_p']):.2g}" if r.get("mcnemar_p") else "-",
                f"{float(r['power_1pp']):.2f}" if r.get("power_1pp") else "-",
                status.get(r["config"], folder.verdict(claim)),
            ]
        )
    return cols, rows, [r for r in folder.tab3 if r["config"] != "pooled"]


def groups(folders: list[Folder], claim: str) -> list[dict]:
    """The claim's measured values, one group per model family, engine, build and hardware; folders whose groups
    show the same values (the same runs remade, `compare.txt`) are listed together."""
    out: list[dict] = []
    for f in folders:
        verdict = f.verdict(claim)
        if verdict not in DECIDED and not (verdict in MEASURED_UNDECIDED.get(claim, ()) and paper_items(f)):
            continue
        cols, rows, used = measured(f, claim)
        if not rows:
            continue
        model, engine = _family(used)
        key = {
            "model": model,
            "engine": engine,
            "build": ", ".join(f.summary["engine_builds"]),
            "hardware": f.hardware(),
            "verdict": verdict,
            "columns": cols,
            "rows": [[_cell(c) for c in row] for row in rows],
            "note": _cell(pooled_reasons(f, claim)),
        }
        same = next((g for g in out if all(g[k] == v for k, v in key.items())), None)
        if same:
            same["folders"].append(f.name)
        else:
            out.append({**key, "folders": [f.name]})
    return out


def paper_items(folder: Folder) -> bool:
    """Whether the folder's bridge runs served the paper's own items (the cache-bridge workloads' paper data)."""
    data = {b.paper_data for _, b in cache_bridges().values()}
    return any(r["config"] != "pooled" and r["data"] in data for r in folder.tab3)


def pooled_reasons(folder: Folder, claim: str) -> str:
    """Why a pooled verdict came out as it did (the check's own reasons), where the claim has one."""
    pooled = [d for d in folder.details(claim) if d.get("kind") == "pooled"]
    return "; ".join(f"Pooled: {d['status']}: {'; '.join(d.get('evidence') or [])}" for d in pooled)


def undecided(folders: list[Folder], claim: str) -> dict[str, list[str]]:
    """Folders whose verdict on the claim decides nothing, by verdict."""
    out: dict[str, list[str]] = {}
    for f in folders:
        if (v := f.verdict(claim)) not in DECIDED:
            out.setdefault(v, []).append(f.name)
    return out


def comparable(claim: dict, folders: list[Folder], claim_id: str) -> str:
    """How the paper's value can be compared with this artifact's: 'value', 'direction', or why not at all."""
    decided = [f for f in folders if f.verdict(claim_id) in DECIDED]
    if not decided:
        return "not decided here"
    if any(r.get("paper_config") for f in decided for r in f.tab2.values()):
        return "by value, for the paper's configurations that ran here; by direction elsewhere"
    if claim.get("hard"):
        return "by value: the claim is exact, 0 diverging episodes on any model"
    return "by direction only: the paper's configurations did not run here"


def paper_rows(doc: dict, claim: str, folders: list[Folder]) -> list[dict]:
    """The paper's values of a claim, each with its section, configuration and whether it ran here."""
    configs = {c["id"]: c for c in doc["config"]}
    ran = {c for f in folders for r in f.tab2.values() for c in (r.get("paper_config") or "").split(", ") if c}
    out = []
    for key, what in PAPER_VALUES[claim]:
        v = doc["value"][key]
        cid = v.get("config")
        if cid:
            group = [c for c in doc["config"] if c["id"] == cid or c["id"].startswith(cid + "/")]
            models = {c.get("model") for c in group}
            if cid in configs and configs[cid].get("model"):
                where = f"{configs[cid]['model']} {configs[cid]['quant']}, {configs[cid]['engine']}"
            elif len(models) == 1 and None not in models:
                where = f"{group[0]['model']}, {group[0]['engine']}, {len(group)} levels"
            else:
                where = f"{group[0]['quant']}, {group[0]['engine']}, model not named"
            here = "ran here" if any(r == cid or r.startswith(cid + "/") for r in ran) else "not run here"
        else:
            where = f"{v['quant']}, model not named" if v.get("quant") else "across the paper's configurations"
            here = "-"
        out.append({"what": what, "value": paper_value(v), "source": v["source"], "config": _cell(where), "here": here})
    return out


# Per claim, its title and the paper's section (docs/claims.md)
TITLES = {
    "RQ1": ("With the cache off, reruns are bit-identical", "§IV-A, Tab. 2"),
    "RQ2": ("With the cache on, trajectories change", "§IV-B, Tab. 2"),
    "RQ2b": ("Cache-ON reruns diverge through the cache state (the host prompt cache)", "§IV-C, Fig. 1"),
    "RQ3": ("Coarser quantization amplifies the divergence", "§IV-D, Fig. 2"),
    "RQ4": ("vLLM goes the same direction", "§IV-E, Tab. 2"),
    "RQ5": ("GSM8K answers flip both ways without an accuracy shift", "§IV-F, Tab. 3"),
}
# Per claim, its headline values in the summary table: (format, expected/paper.toml keys)
HEADLINES = {
    "RQ1": ("{} diverging", ("off_rerun_divergence_all",)),
    "RQ2": ("ON vs OFF {} to {}", ("on_vs_off_divergence_min", "on_vs_off_divergence_max")),
    "RQ2b": (
        "ON reruns {} with the host prompt cache off, {} with it on",
        ("fig1_on_rerun_cram0", "fig1_on_rerun_default"),
    ),
    "RQ3": ("z = {}, p = {}", ("trend_z_qwen2.5-7b", "trend_p_qwen2.5-7b")),
    "RQ4": (
        "ON vs OFF {}, ON reruns {} and {}",
        ("on_vs_off_vllm_16bit", "on_rerun_vllm_16bit", "on_rerun_vllm_16bit_other_session"),
    ),
    "RQ5": (
        "{} flips to the cache path, {} to recomputation, p = {}",
        ("gsm8k_flips_favor_cache", "gsm8k_flips_favor_recompute", "gsm8k_mcnemar_p"),
    ),
}


def bridge(folders: list[Folder]) -> list[dict]:
    """The GSM8K bridge runs of each folder (Tab. 3 rows): how many configurations, which items, the RQ5 verdict."""
    out = []
    for f in folders:
        runs = [r for r in f.tab3 if r["config"] != "pooled"]
        if runs:
            items = sorted({f"{r['n']} {r['data']} items" for r in runs})
            out.append({"folder": f.name, "configs": len(runs), "data": ", ".join(items), "verdict": f.verdict("RQ5")})
    return out


# Per claim, why the paper's value and this artifact's can differ: {here} is what decided the claim here (models,
# hardware, builds, from the evidence), the rest the paper's setting (expected/paper.toml [meta])
WHY = {
    "RQ1": "bit-identity with the cache off is a property of the protocol (batch 1, serial requests, greedy "
    "decoding), not of the model, so the same statement is tested on other models; only the number of episodes "
    "differs ({here})",
    "RQ2": "rates depend on the model and its quantization, on the GPU's kernels and on the build: the paper's are "
    "its 7-14B models on an {gpu}, CUDA {cuda}, llama.cpp {llama} ({here})",
    "RQ2b": "the switch (the host prompt cache) is the same, the model is not: the paper's rates are Qwen2.5-7B "
    "Q4_K_M's; the paired test carries over, the rates need not ({here})",
    "RQ3": "z depends on which levels ran, their scores and the model's logit margins; the levels here are derived "
    "from 4-bit weights, not quantized from full precision ({here})",
    "RQ4": "another vLLM version, GPU and model against the paper's vLLM {vllm} on an {gpu} with an unnamed 16-bit "
    "model, whose own two sessions differ ({here})",
    "RQ5": "the paper's Tab. 3 model is not named and answers {accuracy} of the items correctly; how many answers "
    "flip, and so how many items a 1 pp accuracy shift needs before 'no shift' means anything, depend on the model's "
    "accuracy and margins ({here})",
}


def collect(root: Path | None = None, expected: Path | None = None) -> dict:
    """Everything the page shows, from the evidence folders under `root` and the paper's values."""
    root = Path(root) if root is not None else REPO / "evidence"
    folders = [Folder(p.parent) for p in sorted(root.glob(f"*/{evidence.SUMMARY_JSON}"))]
    doc = load_document(expected)
    meta = doc["meta"]
    statements = {cid: c for f in folders for cid, c in f.claims.items()}
    claims = []
    for cid in PAPER_VALUES:
        gs = groups(folders, cid)
        here = (
            f"here: other models than the paper's, on {'; '.join(sorted({g['hardware'] for g in gs}))}, "
            f"{'; '.join(sorted({g['build'] for g in gs}))}"
        )
        accuracy = (doc["value"]["gsm8k_accuracy_min"]["value"], doc["value"]["gsm8k_accuracy_max"]["value"])
        facts = {
            "here": here if gs else "nothing decided it here",
            "accuracy": f"{accuracy[0]:.0%}-{accuracy[1]:.0%}",
            "gpu": meta["gpu"].split(" (")[0],
            "cuda": meta["cuda"],
            "llama": meta["llama_cpp_build"],
            "vllm": meta["vllm"],
        }
        fmt, keys = HEADLINES[cid]
        tally: dict[str, list[str]] = {}
        for g in gs:
            if g["verdict"] in DECIDED:
                tally.setdefault(g["verdict"], []).extend(g["folders"])
        claims.append(
            {
                "id": cid,
                "title": TITLES[cid][0],
                "section": TITLES[cid][1],
                "headline": fmt.format(*(paper_value(doc["value"][k]) for k in keys)),
                "tally": {v: sorted(fs) for v, fs in sorted(tally.items())},
                "bridge": bridge(folders) if cid == "RQ5" else [],
                "statement": (statements.get(cid) or {}).get("statement", ""),
                "paper": paper_rows(doc, cid, folders),
                "groups": gs,
                "undecided": undecided(folders, cid),
                "comparable": comparable(statements.get(cid) or {}, folders, cid),
                "why": WHY[cid].format(**facts),
            }
        )
    ran = sorted({c for f in folders for r in f.tab2.values() for c in (r.get("paper_config") or "").split(", ") if c})
    return {"claims": claims, "meta": meta, "folders": [f.name for f in folders], "ran": ran}


def comparability(data: dict) -> str:
    """Which claims compare with the paper by value, which by direction only, which are not decided here: the phrase
    the page, README.md and ARTIFACT.md state up front ("by value: RQ1; by direction only: RQ2, ...")."""
    classes: dict[str, list[str]] = {}
    for c in data["claims"]:
        kind = next(k for k in ("by value", "by direction only", "not decided here") if c["comparable"].startswith(k))
        classes.setdefault(kind, []).append(c["id"])
    return "; ".join(f"{k}: {', '.join(ids)}" for k, ids in classes.items())


def render(data: dict) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE.parent),
        autoescape=False,  # markdown, not HTML: every value a cell shows has its pipes escaped (_cell)
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template(TEMPLATE.name).render(**data, comparability=comparability(data))


def main(check_only: bool = False, root: Path | None = None, page: Path | None = None) -> int:
    """Write (or with check_only, compare) the page; 1 when the committed page is out of date."""
    page = Path(page) if page is not None else PAGE
    text = render(collect(root))
    if page.exists() and page.read_text(encoding="utf-8") == text:
        return 0
    if check_only:
        print(f"out of date: {page} (./run.sh evidence-summary)")
        return 1
    page.write_text(text, encoding="utf-8")
    print(f"wrote {page}")
    return 0
