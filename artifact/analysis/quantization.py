"""Why quantization amplifies divergence: margins or kernels (beyond the paper).

A greedy token flips when the cached path perturbs the top-2 margin by more than the margin itself. Writing, at a
position at risk (same prompt and same earlier tokens in both arms, the ON request served cached tokens), m for the
OFF arm's margin logp(a) - logp(b) (a, b its two best tokens) and m_on for the ON arm's logp(a) - logp(b) on the
same two tokens, the perturbation is d = m - m_on, and the token flips exactly when d > m. So a level's flip rate
can grow for two reasons, which the paper does not separate:

  H-margin  coarser weights make the margins m smaller, at the same perturbations d (the paper's explanation);
  H-kernel  the level's kernels make the perturbations |d| larger at the same margins: e.g. the activations
            quantized to 8 bits inside quantized matrix products (llama.cpp's CPU kernels quantize them to the weight
            type's dot-product type: Q8_0 for Q8_0 and Q5_0, Q8_K for the k-quants, F16 for F16; CUDA's MMQ/MMVQ
            kernels to q8_1), where a tiny difference that crosses a rounding boundary becomes a whole quantum.

Per configuration and plan this module measures, over the positions at risk of its ON/OFF run pairs: the margins,
|d| (positions where the ON top-2 holds both of the OFF arm's tokens), the flips; and against a reference
configuration (same engine, model and plan): the configuration that serves the same weights through F32 kernels
(a recipe product "<LEVEL>-as-F32": the kernel experiment); for an "-as-F32" level, "F16-as-F32"; else the
series' F16 level (the quantization series):

  BEYOND-QUANT-KERNEL  the level's perturbations |d| are larger than the reference's (one-sided Mann-Whitney over
                       positions; positions of one text are dependent, so read p as descriptive);
  BEYOND-QUANT-WEIGHTS for "<LEVEL>-as-F32" against "F16-as-F32" (the same F32 kernels, weights of different
                       precision): the coarser weights' perturbations |d| are larger (as KERNEL); with KERNEL PASS
                       and WEIGHTS not, the kernels, not the weights, carry the amplification;
  BEYOND-QUANT-MARGIN  at equal margins the level flips no more often than the reference, i.e. its margins explain
                       its extra flips: Cochran-Mantel-Haenszel over the margin bins (strata), flip ~ level;
                       FAIL when the level flips significantly more often within margin bins.

and a counterfactual split of the flip-rate difference: P(d_ref > m_level) (the level's margins with the reference's
perturbations: what H-margin alone predicts) and P(d_level > m_ref) (what H-kernel alone predicts).

One module: one analysis read top to bottom, from the positions at risk through the summary and its verdicts
(`compare`) to the figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from artifact.analysis.figure import new_figure, text_room
from artifact.analysis.groups import by_plan, group_lineage, manifest_table, on_off_pairs
from artifact.analysis.margins import MARGIN_BINS, at_risk, ranges, table_rows, top2
from artifact.verdict import FAIL, NOT_RUN, PASS, Verdict
from artifact.analysis.stats import mantel_haenszel
from artifact.analysis.tiers import INCONCLUSIVE
from artifact.records.store import Run

ALPHA = 0.05
AS_F32 = "-as-F32"  # a recipe product: a level's weights dequantized to F32 (artifact/models/recipes)
MIN_FLIPS = 5  # fewer flips in both configurations together: the margin test is INCONCLUSIVE
SURVIVAL_POINTS = 1000  # points drawn of each |d| survival curve (the figure)
POSITION_COLUMNS = ["config", "plan", "run", "episode_id", "request_index", "position", "margin", "delta", "flip"]


def positions(on: Run, off: Run) -> pd.DataFrame:
    """Every position at risk of one ON/OFF pair: the OFF margin, the perturbation d (NaN where the ON top-2 lacks
    one of the OFF arm's two tokens) and whether the token flipped there (the last position at risk of its request).
    The requests at risk are found one by one (`same_prompt`, made once per pair); their positions are then computed
    at once."""
    cols = _position_columns(on, off)
    return _empty() if cols is None else _frame(cols)


def _position_columns(on: Run, off: Run) -> dict | None:
    """`positions`' columns as arrays; None where no request is at risk."""
    r = at_risk(on, off)
    if not r.offs:
        return None
    t_off, (t_on, r_on) = off.top2_table()[0], on.top2_table()
    at_on = table_rows(r_on, r.ons)
    if r.at_off is None or at_on is None:
        return _position_columns_one_by_one(on, off, r.offs, r.ons, r.firsts)
    at_off = r.at_off
    n = np.minimum(np.minimum(r.len_off, r.len_on), np.minimum(at_off[:, 1], at_on[:, 1]))
    flipped = r.first < n  # the first position whose tokens differ; later ones: no risk
    lengths = np.where(flipped, r.first + 1, n)
    a, b = t_off[ranges(at_off[:, 0], lengths)], t_on[ranges(at_on[:, 0], lengths)]
    return _columns(on, a, b, [q["episode_id"] for q in r.ons], [q["request_index"] for q in r.ons], lengths, flipped)


def _position_columns_one_by_one(on: Run, off: Run, q_offs: list, q_ons: list, firsts: list) -> dict | None:
    """`_position_columns` request by request (where a record is not in its run's top-2 table)."""
    offs, ons, eids, indexes, lengths, flipped = [], [], [], [], [], []
    for q_off, q_on, d in zip(q_offs, q_ons, firsts):
        a_off, a_on = top2(off, q_off), top2(on, q_on)
        if a_off is None or a_on is None:
            continue
        t_off, t_on = q_off["output_tokens"], q_on["output_tokens"]
        n = min(len(t_off), len(t_on), len(a_off), len(a_on))
        flip = d if d is not None and d < n else None  # the first position whose tokens differ before n
        upto = n if flip is None else flip + 1
        offs.append(a_off[:upto])
        ons.append(a_on[:upto])
        eids.append(q_on["episode_id"])
        indexes.append(q_on["request_index"])
        lengths.append(upto)
        flipped.append(flip is not None)
    if not offs:
        return None
    return _columns(
        on,
        np.concatenate(offs),
        np.concatenate(ons),
        eids,
        indexes,
        np.asarray(lengths),
        np.asarray(flipped, dtype=bool),
    )


def _columns(
    on: Run, a: np.ndarray, b: np.ndarray, eids: list, indexes: list, lengths: np.ndarray, flipped: np.ndarray
) -> dict:
    """The columns of positions whose OFF and ON top-2 rows are `a` and `b`, request after request (`lengths`
    positions each, the last one a flip where `flipped`)."""
    margin = np.abs(a[:, 1] - a[:, 3])
    off_first = a[:, 1] >= a[:, 3]
    best, second = np.where(off_first, a[:, 0], a[:, 2]), np.where(off_first, a[:, 2], a[:, 0])

    def on_logprob(token):  # the ON arm's log-probability of each token, NaN where its top-2 lacks it
        return np.where(token == b[:, 0], b[:, 1], np.where(token == b[:, 2], b[:, 3], np.nan))

    delta = margin - (on_logprob(best) - on_logprob(second))
    ends = np.cumsum(lengths)
    flip = np.zeros(len(a), dtype=np.int64)
    flip[ends[flipped] - 1] = 1
    m = on.manifest
    return {
        "config": _constant(len(a), m["config"]),
        "plan": _constant(len(a), m["plan"]),
        "run": np.full(len(a), m["run"], dtype=np.int64),
        "episode_id": np.repeat(np.array(eids, dtype=object), lengths),
        "request_index": np.repeat(np.asarray(indexes, dtype=np.int64), lengths),
        "position": np.arange(len(a)) - np.repeat(ends - lengths, lengths),
        "margin": margin,
        "delta": delta,
        "flip": flip,
    }


def _constant(n: int, value) -> np.ndarray:
    """An object column holding `value` n times (np.full converts an object value n times: ~20x slower)."""
    out = np.empty(n, dtype=object)
    out.fill(value)
    return out


def _frame(cols: dict) -> pd.DataFrame:
    """A positions frame of its columns' arrays (POSITION_COLUMNS, in that order), made for it: not copied again
    (pandas' consolidation copies each column of a frame of ~10^5 rows into blocks)."""
    return pd.DataFrame(cols, copy=False)


def _empty() -> pd.DataFrame:
    return pd.DataFrame(
        {
            c: np.empty(0, dtype=t)
            for c, t in zip(
                POSITION_COLUMNS, (object, object, np.int64, object, np.int64, np.int64, float, float, np.int64)
            )
        }
    )


def position_frames(runs: list[Run]) -> dict[tuple[str, str], pd.DataFrame]:
    """(config, plan) -> the positions at risk of its ON/OFF run pairs (those with any): one frame per
    configuration and plan, made from its pairs' columns at once (as `positions` of each pair, concatenated)."""
    out = {}
    for key, group in by_plan(runs).items():
        parts = [
            c
            for _, on, off in on_off_pairs(group)
            if (c := _position_columns(on, off)) is not None and len(c["margin"])
        ]
        if parts:
            cols = {k: np.concatenate([c[k] for c in parts]) for k in POSITION_COLUMNS} if len(parts) > 1 else parts[0]
            out[key] = _frame(cols)
    return out


_EMPTY = _empty()


def position_frame(runs: list[Run]) -> pd.DataFrame:
    parts = list(position_frames(runs).values())
    return pd.concat(parts, ignore_index=True) if parts else _empty()


def _identity(run: Run) -> dict:
    model = manifest_table(run, "model")
    source = str(model.get("source") or "")
    level = source.rsplit("/", 1)[-1] if source.startswith("derived:") else str(model.get("quant") or "")
    return {
        "config": run.manifest["config"],
        "plan": run.manifest["plan"],
        "engine": run.manifest.get("engine"),
        "model_name": model.get("name"),
        "quant": model.get("quant"),
        "level": level,
    }


# The host facts that say which machine a run ran on (artifact.provenance records them in the manifest's `host`):
# a configuration is held against a reference only where these are the same (a CPU twin was paired with an
# H200 level). A digest one run records and the other lacks is not the same.
MACHINE_FACTS = ("cpu", "gpus", "machine", "hostname_sha256", "machine_id_sha256", "gpu_uuid_sha256")


def machine_of(run: Run) -> tuple:
    """The recorded facts of the machine a run ran on (`MACHINE_FACTS`; a fact not recorded is distinct from every
    recorded value), comparable by ==."""
    host = manifest_table(run, "host")
    return tuple((k, repr(host[k]) if k in host else None) for k in MACHINE_FACTS)


SAME_WEIGHTS = "same weights through F32 kernels"
SAME_KERNELS = "F16's weights through the same F32 kernels"
PERTURBATION_CLAIMS = {  # by whether the reference differs in the weights only (True) or in the kernels
    False: (
        "BEYOND-QUANT-KERNEL",
        "the level's kernels perturb the margins more between the cached and the "
        "recomputed path (|d| larger than the reference's)",
    ),
    True: (
        "BEYOND-QUANT-WEIGHTS",
        "through the same F32 kernels, the level's weights perturb the margins more "
        "than F16's weights (|d| larger than the reference's)",
    ),
}


def _eq(x, y) -> bool:
    """pandas' `==` of an object column and a scalar, on one value: False where either is null (None or NaN)."""
    return not (x is None or y is None or x != x or y != y) and x == y


def configurations(runs: list[Run]) -> pd.DataFrame:
    """One row per configuration and plan with ON/OFF pairs: its identity and its reference (or none)."""
    groups = [g for g in by_plan(runs).values() if on_off_pairs(g)]
    rows = [_identity(next(iter(g.values()))) for g in groups]
    # the machines each configuration's runs ran on: a reference only where both ran on one and the same machine
    machines = [{machine_of(r) for r in g.values()} for g in groups]
    # which model each configuration's weights are a level of (from the weights' digests against the
    # artifact's pins, never the model's display name; None where the facts cannot decide: no reference then)
    lineages = [group_lineage(list(g.values()))[0] for g in groups]
    df = pd.DataFrame(rows, columns=["config", "plan", "engine", "model_name", "quant", "level"])
    refs, kinds = [], []
    f16_levels, f16_f32_levels = ("F16", "BF16"), ("F16" + AS_F32.upper(), "BF16" + AS_F32.upper())
    for r, machine, model in zip(rows, machines, lineages):
        same = [
            o
            for o, other, other_model in zip(rows, machines, lineages)
            if _eq(o["engine"], r["engine"])
            and _eq(other_model, model)
            and o["plan"] == r["plan"]
            and len(machine) == 1
            and other == machine
        ]
        twin = [o for o in same if o["level"] == r["level"] + AS_F32]
        f16 = [o for o in same if o["level"].upper() in f16_levels and o["config"] != r["config"]]
        f16_f32 = [o for o in same if o["level"].upper() in f16_f32_levels and o["config"] != r["config"]]
        ref, kind = None, None
        if twin:  # the kernel experiment: the same weights through F32 kernels
            ref, kind = twin[0]["config"], SAME_WEIGHTS
        elif r["level"].endswith(AS_F32) and f16_f32:  # the same F32 kernels, other weights
            ref, kind = f16_f32[0]["config"], SAME_KERNELS
        elif f16 and not r["level"].endswith(AS_F32) and r["level"].upper() not in ("F16", "BF16"):
            ref, kind = f16[0]["config"], "the series' F16 level"
        refs.append(ref)
        kinds.append(kind)
    return df.assign(reference=refs, reference_kind=kinds)


# Series.mean, .median and .quantile as pandas computes them, on a frame's column arrays (pandas' per-call overhead
# was most of the cost of `summary` and `compare`): the same numpy calls on the same values.


def _mean(x: np.ndarray) -> float:
    """Series.mean of 0/1 or bool values (exact sums: k / n)."""
    return int(x.sum()) / x.size if x.size else np.nan


def _median(x: np.ndarray) -> float:
    """Series.median of float values: np.nanmedian of the values that are not NaN (nanops.nanmedian)."""
    x = x[~np.isnan(x)]
    return np.nanmedian(x) if x.size else np.nan


def _quantile(x: np.ndarray, q: float) -> float:
    """Series.quantile(q) of float values without NaN (array_algos.quantile: np.percentile of the column as one row
    at q * 100, linear)."""
    return np.percentile(x[None, :], np.asarray([q]) * 100.0, axis=1, method="linear")[0, 0]


def summary(pos: dict, configs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and plan: its positions at risk (`pos`: `position_frames`), flips, margins, |d|."""
    rows = []
    for c in configs.to_dict("records"):
        p = pos.get((c["config"], c["plan"]), _EMPTY)
        flip, margin, delta = (p[k].to_numpy() for k in ("flip", "margin", "delta"))
        d = np.abs(delta[~np.isnan(delta)])
        rows.append(
            {
                **c,
                "positions": len(p),
                "flips": int(flip.sum()),
                "flip_rate": _mean(flip),
                "margin_median": _median(margin) if len(p) else np.nan,
                "delta_positions": len(d),
                "delta_zero_share": _mean(d == 0),
                "delta_median": _median(d) if len(d) else np.nan,
                "delta_q90": _quantile(d, 0.9) if len(d) else np.nan,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            *configs.columns,
            "positions",
            "flips",
            "flip_rate",
            "margin_median",
            "delta_positions",
            "delta_zero_share",
            "delta_median",
            "delta_q90",
        ],
    )


def _flip_prob(delta: np.ndarray, margins: np.ndarray) -> float:
    """P(d > m) with d drawn from `delta` and m from `margins` independently (the counterfactual flip rate)."""
    if not delta.size or not margins.size:
        return float("nan")
    d = np.sort(delta)
    return float(np.mean(1.0 - np.searchsorted(d, margins, side="right") / d.size))


def compare(pos: dict, configs: pd.DataFrame) -> tuple[pd.DataFrame, list[Verdict]]:
    """Each configuration against its reference: the two verdicts and the counterfactual split (`pos`:
    `position_frames`)."""
    from scipy.stats import mannwhitneyu  # scipy: a slow import, not needed to draw the figures

    rows, verdicts = [], []
    for c in configs.to_dict("records"):
        if not c["reference"]:
            continue
        scope = f"{c['config']} vs {c['reference']} [{c['plan']}]"
        p = pos.get((c["config"], c["plan"]), _EMPTY)
        r = pos.get((c["reference"], c["plan"]), _EMPTY)
        (pm, pf, pd_), (rm, rf, rd) = (
            (x["margin"].to_numpy(), x["flip"].to_numpy(), x["delta"].to_numpy()) for x in (p, r)
        )
        dp, dr = pd_[~np.isnan(pd_)], rd[~np.isnan(rd)]
        row = {
            "config": c["config"],
            "reference": c["reference"],
            "plan": c["plan"],
            "reference_kind": c["reference_kind"],
            "positions": len(p),
            "reference_positions": len(r),
            "flip_rate": _mean(pf),
            "reference_flip_rate": _mean(rf),
            "margin_median": _median(pm),
            "reference_margin_median": _median(rm),
            "delta_median": np.median(np.abs(dp)) if dp.size else np.nan,
            "reference_delta_median": np.median(np.abs(dr)) if dr.size else np.nan,
            "margin_only_rate": _flip_prob(dr, pm),
            "kernel_only_rate": _flip_prob(dp, rm),
            "kernel_p": np.nan,
            "mh_odds_ratio": np.nan,
            "mh_p": np.nan,
        }
        evidence = [
            f"{c['reference']}: {c['reference_kind']}",
            f"flip rate {_pct(row['flip_rate'])} vs {_pct(row['reference_flip_rate'])}; counterfactual: "
            f"its margins with the reference's perturbations {_pct(row['margin_only_rate'])}, its "
            f"perturbations with the reference's margins {_pct(row['kernel_only_rate'])}",
        ]
        # H-kernel: larger perturbations
        if dp.size and dr.size:
            row["kernel_p"] = float(mannwhitneyu(np.abs(dp), np.abs(dr), alternative="greater").pvalue)
            larger = row["delta_median"] > row["reference_delta_median"] or np.mean(np.abs(dp)) > np.mean(np.abs(dr))
            status = PASS if row["kernel_p"] < ALPHA else INCONCLUSIVE if larger else FAIL
            vid, claim = PERTURBATION_CLAIMS[c["reference_kind"] == SAME_KERNELS]
            verdicts.append(
                Verdict.beyond(
                    vid,
                    claim,
                    scope,
                    status,
                    f"median |d| {_g(row['delta_median'])} vs {_g(row['reference_delta_median'])} nats over "
                    f"{dp.size} / {dr.size} positions; one-sided Mann-Whitney p {_p(row['kernel_p'])} (positions)",
                    evidence,
                )
            )
        else:
            vid, claim = PERTURBATION_CLAIMS[c["reference_kind"] == SAME_KERNELS]
            verdicts.append(
                Verdict.beyond(
                    vid, claim, scope, NOT_RUN, "no position at risk with both arms' top-2 in one of the two", evidence
                )
            )
        # H-margin: at equal margins, no more flips
        strata = []
        bins = MARGIN_BINS
        for lo, hi in zip(bins[:-1], bins[1:]):
            a, b = pf[(pm >= lo) & (pm < hi)], rf[(rm >= lo) & (rm < hi)]
            strata.append((int(a.sum()), int(len(a) - a.sum()), int(b.sum()), int(len(b) - b.sum())))
        flips = sum(s[0] + s[2] for s in strata)
        if not len(p) or not len(r):
            verdicts.append(
                Verdict.beyond(
                    "BEYOND-QUANT-MARGIN",
                    "margins explain the extra flips",
                    scope,
                    NOT_RUN,
                    "no position at risk in one of the two",
                    evidence,
                )
            )
        else:
            row["mh_odds_ratio"], row["mh_p"] = mantel_haenszel(strata, alternative="greater")
            if row["mh_p"] < ALPHA:
                status = FAIL
            elif flips < MIN_FLIPS:
                status = INCONCLUSIVE
            else:
                status = PASS
            verdicts.append(
                Verdict.beyond(
                    "BEYOND-QUANT-MARGIN",
                    "at equal top-2 margins the level flips no more often than the reference "
                    "(its margins explain its extra flips)",
                    scope,
                    status,
                    f"{flips} flips; within margin bins, Mantel-Haenszel odds ratio {_g(row['mh_odds_ratio'])}, "
                    f"one-sided p {_p(row['mh_p'])} (margins {_g(row['margin_median'])} vs "
                    f"{_g(row['reference_margin_median'])} median nats)",
                    evidence,
                )
            )
        rows.append(row)
    cols = [
        "config",
        "reference",
        "plan",
        "reference_kind",
        "positions",
        "reference_positions",
        "flip_rate",
        "reference_flip_rate",
        "margin_median",
        "reference_margin_median",
        "delta_median",
        "reference_delta_median",
        "margin_only_rate",
        "kernel_only_rate",
        "kernel_p",
        "mh_odds_ratio",
        "mh_p",
    ]
    return pd.DataFrame(rows, columns=cols), verdicts


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.2f}%"


def _p(x: float) -> str:
    return "< 1e-300" if x == 0 else f"= {x:.2g}"


def _g(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.3g}"


def analyse(runs: list[Run]) -> tuple[dict[str, pd.DataFrame], list[Verdict], dict]:
    """The tables (quant_mechanism.csv, quant_mechanism_pairs.csv), the verdicts, and the positions per
    configuration and plan (`position_frames`, for the figure; not written: at paper scale over a million rows)."""
    pos = position_frames(runs)
    configs = configurations(runs)
    comparisons, verdicts = compare(pos, configs)
    return {"quant_mechanism.csv": summary(pos, configs), "quant_mechanism_pairs.csv": comparisons}, verdicts, pos


def figure_data(pos: dict, pairs: pd.DataFrame) -> list[tuple] | None:
    """What `draw_figure` draws, per configuration that has or is a reference (`pos`: `position_frames`): (name,
    |d| survival curve as (x, y) at up to SURVIVAL_POINTS of its points, or None without any d != 0, flip rate per
    margin bin); None when there is nothing to draw. Small: it is sent to the process that draws the figures."""
    names = list(dict.fromkeys([*pairs["config"], *pairs["reference"]])) if not pairs.empty else []
    if not names or not pos:
        return None
    out = []
    for name in names:
        parts = [frame for (config, _), frame in pos.items() if config == name]
        p = pd.concat(parts, ignore_index=True) if parts else _EMPTY
        d = np.sort(p["delta"].dropna().abs().to_numpy())
        d = d[d > 0]
        curve = None
        if d.size:  # the survival function at up to SURVIVAL_POINTS of its points (at paper scale d has ~10^5)
            at = np.unique(np.linspace(0, d.size - 1, SURVIVAL_POINTS).astype(int))
            curve = (d[at], 1.0 - at / d.size)
        idx = np.digitize(p["margin"].to_numpy(), MARGIN_BINS[1:-1])
        rates = [
            p["flip"].to_numpy()[idx == b].mean() if (idx == b).any() else np.nan for b in range(len(MARGIN_BINS) - 1)
        ]
        out.append((name, curve, rates))
    return out


def figure(pos: dict, pairs: pd.DataFrame, path):
    """`draw_figure` of `figure_data`."""
    return draw_figure(figure_data(pos, pairs), path)


def draw_figure(data: list[tuple] | None, path):
    """Left: the distribution of |d| per configuration compared (survival function, log scale); right: flip rate
    per margin bin. One line per configuration that has or is a reference (`data`: `figure_data`)."""
    if not data:
        return None

    labels = [
        f"[{lo:g}, {hi:g})" if np.isfinite(hi) else f">= {lo:g}" for lo, hi in zip(MARGIN_BINS[:-1], MARGIN_BINS[1:])
    ]
    fig = new_figure(10.0, 4.2, bottom=0.45 + text_room(labels, 7, 30))
    ax, ax2 = fig.subplots(1, 2)
    for k, (name, curve, rates) in enumerate(data):
        color = f"C{k % 10}"  # the same in both panels, whether or not the left one has a line for it
        if curve is not None:
            ax.step(curve[0], curve[1], where="post", color=color)
        ax2.plot(range(len(rates)), [100 * x for x in rates], marker="o", color=color, label=name)
    if not ax.lines:
        ax.text(0.5, 0.5, "no position at risk with d != 0", ha="center", va="center", transform=ax.transAxes)
    ax.set_xscale("log")
    ax.set_xlabel("|d|: change of the top-2 margin, cached vs recomputed\n(nats; d = 0 left out)", fontsize=9)
    ax.set_ylabel("share of positions with a larger |d|")
    ax.set_title("Perturbation size (H-kernel: larger for the level)", fontsize=9)
    ax2.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
    ax2.set_xlabel("OFF top-2 margin (nats)")
    ax2.set_ylabel("positions that flip (%)")
    ax2.set_title("Flips at equal margins (H-margin: equal curves)", fontsize=9)
    ax.legend(*ax2.get_legend_handles_labels(), fontsize=6, frameon=False)
    fig.savefig(path, format="png")
    return path
