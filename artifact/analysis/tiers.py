"""Which cache tier served each hit, and how divergence depends on it (beyond the paper: RQ2b per request).

The paper isolates the host prompt cache as the cause of disagreeing ON reruns by switching it off (plan cram0).
Here every request of an ON run gets the tier its engine says served its cached prefix (`Engine.audit.request_tiers`,
from the records and the session's server log: llama.cpp "slot" / "host" / "slot_or_host" when the log cannot
tell / "none"), and divergence is counted per tier:

* request level: among ON requests whose prompt equals the reference run's request at the same place (before
  the episode's first divergence, so a difference is born at that request), the share whose generated tokens differ,
  against OFF run 1 of the plan (or of plan main when the plan has no OFF arm: the same tokens-producing inputs
  are required, `divergence.pairing_problem`) and against the plan's other ON run;
* episode level: an episode's tier is the tier of its first request (the prefix its trajectory starts from);
  the share of episodes whose trajectory differs from the reference.

Verdict BEYOND-TIERS (per configuration and plan whose ON runs share one server): do rerun requests served from
host memory differ from the earlier ON run more often than rerun requests served from the slot? Host hits happen
only at an episode's first request (a new prompt makes the server choose its slot afresh), so the test compares
first requests with first requests (Fisher's exact test, one-sided, certain attributions only; all requests in the
evidence); a plan with a server per run is the control (its evidence line). NOT-RUN without host- and
slot-served first requests to compare; INCONCLUSIVE when host-served ones differ more often, but not significantly.
Over several configuration-plans, a pooled verdict: the Cochran-Mantel-Haenszel test, each configuration-plan a
stratum.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress, repeat
from operator import attrgetter, itemgetter, ne
from pathlib import Path

import pandas as pd

from artifact import engines
from artifact.analysis.divergence import made_comparison, pairing_problem
from artifact.analysis.figure import new_figure, overhang, text_room
from artifact.analysis.groups import comparison, same_prompt_requests
from artifact.analysis.mitigation import is_fresh
from artifact.verdict import FAIL, INCONCLUSIVE, NOT_RUN, PASS, Verdict
from artifact.analysis.stats import mantel_haenszel, wilson_interval
from artifact.records.store import Run, read_server_log

REQUEST_COLUMNS = [
    "config",
    "plan",
    "arm",
    "run",
    "episode_id",
    "request_index",
    "cache_n",
    "prompt_tokens",
    "tier",
    "certain",
    "evidence",
]
SUMMARY_COLUMNS = [
    "config",
    "plan",
    "run",
    "reference",
    "level",
    "tier",
    "n",
    "differ",
    "rate",
    "wilson_lo",
    "wilson_hi",
]
ALPHA = 0.05


def session_key(run: Run) -> tuple:
    m = run.manifest
    return (m.get("config"), m.get("plan"), m.get("server_log") or f"{m.get('arm')}-{m.get('session')}")


def read_log(run: Run) -> str | None:
    """The run's server-session log (manifest `server_log`, relative to the plan directory), if it was kept; read
    under the record files' rules (`store.read_server_log`: an ArtifactError for a path outside the plan directory,
    a link, a pipe or device, or an oversized file)."""
    return read_server_log(run)


def run_tiers(runs: list[Run]) -> dict[int, list]:
    """id(run) -> the Tier of each of its requests (in record order), for every complete run."""
    sessions: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.complete:
            sessions.setdefault(session_key(r), []).append(r)
    out = {}
    for members in sessions.values():
        members.sort(key=lambda r: (str(r.manifest.get("started_at") or ""), r.manifest.get("run", 0)))
        first = members[0].manifest
        engine = engines.of_manifest(first)  # older records name no engine: the default one's
        if engine is None:
            continue
        requests = [q for r in members for q in r.requests]
        tiers = engine.audit.request_tiers(first, requests, read_log(members[0]))
        i = 0
        for r in members:
            out[id(r)] = tiers[i : i + len(r.requests)]
            i += len(r.requests)
    return out


_EPISODE, _INDEX, _OUTPUT = itemgetter("episode_id"), itemgetter("request_index"), itemgetter("output_tokens")
_TIER, _CERTAIN, _EVIDENCE = attrgetter("tier"), attrgetter("certain"), attrgetter("evidence")


def requests_frame(runs: list[Run], tiers: dict[int, list]) -> pd.DataFrame:
    get = dict.get  # dict.get: never decodes lazy fields
    rows: list[tuple] = []
    for r in runs:
        if id(r) not in tiers or r.manifest.get("arm") != "on":
            continue
        m = r.manifest
        ts = tiers[id(r)]
        reqs = r.requests[: len(ts)]  # a request and its tier, as zip pairs them
        ts = ts[: len(reqs)]
        # rows as tuples, column by column (pandas infers each column's dtype from a list of tuples as from a list
        # of dicts: the same conversion of the same values)
        rows += zip(
            repeat(m["config"]),
            repeat(m["plan"]),
            repeat(m["arm"]),
            repeat(m["run"]),
            map(_EPISODE, reqs),
            map(_INDEX, reqs),
            map(get, reqs, repeat("cache_n")),
            map(get, reqs, repeat("prompt_tokens")),
            map(_TIER, ts),
            map(_CERTAIN, ts),
            map(_EVIDENCE, ts),
        )
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def references(on: Run, runs: list[Run]) -> list[tuple[str, Run]]:
    """(name, run) to compare an ON run with: OFF run 1 of its plan (else of plan main, if it is comparable), and
    the plan's earlier ON runs (each ON pair once, from the rerun's side: a rerun's host cache can hold the states
    the earlier run left there)."""
    m = on.manifest
    same_cfg = [r for r in runs if r.complete and r.manifest.get("config") == m["config"]]

    def find(plan, arm, k):
        return next(
            (
                r
                for r in same_cfg
                if (r.manifest.get("plan"), r.manifest.get("arm"), r.manifest.get("run")) == (plan, arm, k)
            ),
            None,
        )

    out = []
    off = find(m["plan"], "off", 1)
    if off is None:
        main_off = find("main", "off", 1)
        if main_off is not None and pairing_problem(on, main_off) is None:
            out.append(("off run 1 (main)", main_off))
    else:
        out.append(("off run 1", off))
    for r in same_cfg:
        rm = r.manifest
        if rm.get("plan") == m["plan"] and rm.get("arm") == "on" and rm.get("run", 0) < m["run"]:
            out.append((f"on run {rm['run']}", r))
    return out


PAIR_COLUMNS = ["config", "plan", "run", "reference", "request_index", "tier", "certain", "differ"]


def summary_frame(runs: list[Run], tiers: dict[int, list]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per ON run, reference, level and tier: compared units and how many differ. Also the request pairs."""
    rows, pairs = [], []
    for on in runs:
        if id(on) not in tiers or on.manifest.get("arm") != "on":
            continue
        m = on.manifest
        reqs = on.requests
        tier_of = dict(zip(zip(map(_EPISODE, reqs), map(_INDEX, reqs)), tiers[id(on)]))  # a key twice: its last tier
        for ref_name, ref in references(on, runs):
            counts: dict[tuple, list[int]] = {}  # (level, tier) -> [units, differing units]
            # the same-prompt request pairs with a tier, field by field (map: no bytecode per pair)
            matched = list(same_prompt_requests(on, ref))
            qas, qbs = [p[0] for p in matched], [p[1] for p in matched]
            ts = list(map(tier_of.get, zip(map(_EPISODE, qas), map(_INDEX, qas))))
            if ts.count(None):
                keep = [i for i, t in enumerate(ts) if t is not None]
                qas, qbs, ts = [qas[i] for i in keep], [qbs[i] for i in keep], [ts[i] for i in keep]
            names = list(map(_TIER, ts))
            differ = list(map(ne, map(_OUTPUT, qas), map(_OUTPUT, qbs)))
            changed = Counter(compress(names, differ))
            for tier, n in Counter(names).items():
                counts[("request", tier)] = [n, changed[tier]]
            pairs += zip(
                repeat(m["config"]),
                repeat(m["plan"]),
                repeat(m["run"]),
                repeat(ref_name),  # PAIR_COLUMNS
                map(_INDEX, qas),
                names,
                map(_CERTAIN, ts),
                differ,
            )
            # an episode's divergence and evidence are the same whichever run is compared with which (only they are
            # read here): the comparison made already either way round (`divergence.made_comparison`: the paper tables'
            # reruns are run i vs a later run j), else groups.comparison's
            cmp = made_comparison(on, ref) or comparison(on, ref)
            for e in cmp.episodes:
                t = tier_of.get((e.episode_id, 0))
                if t is not None and e.evidence:
                    c = counts.setdefault(("episode", t.tier), [0, 0])
                    c[0] += 1
                    c[1] += int(e.diverged)
            for (level, tier), (n, k) in sorted(counts.items()):
                lo, hi = wilson_interval(k, n)
                rows.append(
                    {
                        "config": m["config"],
                        "plan": m["plan"],
                        "run": m["run"],
                        "reference": ref_name,
                        "level": level,
                        "tier": tier,
                        "n": n,
                        "differ": k,
                        "rate": k / n if n else None,
                        "wilson_lo": lo,
                        "wilson_hi": hi,
                    }
                )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS), pd.DataFrame(pairs, columns=PAIR_COLUMNS)


def verdicts(pairs: pd.DataFrame, requests: pd.DataFrame, runs: list[Run]) -> list[Verdict]:
    """BEYOND-TIERS per configuration and plan whose ON reruns share one server (the paper's condition): rerun
    requests served from host memory differ from the earlier ON run more often than those served from the slot
    (certain attributions only). A plan with a server per run (lifecycle fresh) is the control, in the evidence."""
    from scipy.stats import fisher_exact  # scipy: a slow import, not needed to draw the figures

    out = []
    claim = (
        "ON-rerun requests whose cached prefix came from host memory differ from the earlier ON run more often "
        "than requests served from the slot's own cache"
    )
    shared = {
        (r.manifest.get("config"), r.manifest.get("plan"))
        for r in runs
        if r.manifest.get("arm") == "on" and not is_fresh(r)
    }
    # the certain ON-vs-earlier-ON pairs counted once: (config, plan, tier) -> [differ, pairs] over first requests
    # and over all
    tally: dict[tuple, list[int]] = {}
    if not pairs.empty:
        for config, plan, ref, certain, index, tier, differ in zip(
            *(pairs[c].tolist() for c in ("config", "plan", "reference", "certain", "request_index", "tier", "differ"))
        ):
            if ref.startswith("on run") and certain:
                t = tally.setdefault((config, plan, tier), [0, 0, 0, 0])
                t[2] += differ
                t[3] += 1
                if index == 0:  # like for like: host hits happen at an episode's first request
                    t[0] += differ
                    t[1] += 1

    def counts(config, plan, first_only=True):
        host, slot = (tally.get((config, plan, tier), [0, 0, 0, 0]) for tier in ("host", "slot"))
        j = 0 if first_only else 2
        return int(host[j]), host[j + 1], int(slot[j]), slot[j + 1]

    strata = []
    # each configuration-plan's ON requests: their rows of `requests`, in its order
    scope_rows: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(requests["config"].tolist(), requests["plan"].tolist())):
        scope_rows.setdefault(key, []).append(i)
    scopes = set(scope_rows)
    for config, plan in sorted(scopes):
        if (config, plan) not in shared:
            continue
        req = requests.iloc[scope_rows[(config, plan)]]
        shares = ", ".join(f"{t} {n}" for t, n in req["tier"].value_counts().sort_index().items())
        evidence = [f"ON requests by tier: {shares}"]
        for c, p in sorted(scopes - shared):
            if c == config:
                kh, nh, ks, ns = counts(c, p)
                evidence.append(
                    f"control, plan {p} (a server per run): first requests host {kh}/{nh}, slot {ks}/{ns} differ"
                )
        ah, anh, as_, ans = counts(config, plan, first_only=False)
        evidence.append(f"all same-prompt rerun requests: host {ah}/{anh}, slot {as_}/{ans} differ")
        kh, nh, ks, ns = counts(config, plan)
        scope = f"{config}/{plan}"
        if not anh and ans and req["evidence"].str.contains("host prompt cache off").any():
            out.append(
                Verdict.beyond(
                    "BEYOND-TIERS",
                    claim,
                    scope,
                    NOT_RUN,
                    f"host prompt cache off: every hit from the slot; {as_}/{ans} same-prompt rerun requests differ",
                    evidence,
                )
            )
            continue
        if not nh or not ns:
            unknown = req[req["tier"] == "unknown"]["evidence"]
            why = (
                f"tiers unknown for {len(unknown)} ON requests: {unknown.mode().iloc[0]}"
                if len(unknown)
                else f"no {'host' if not nh else 'slot'}-served first request of a rerun episode with the same prompt "
                "as the earlier run"
            )
            out.append(Verdict.beyond("BEYOND-TIERS", claim, scope, NOT_RUN, why, evidence))
            continue
        _, p_value = fisher_exact([[kh, nh - kh], [ks, ns - ks]], alternative="greater")
        strata.append((scope, (kh, nh - kh, ks, ns - ks)))
        out.append(
            Verdict.beyond(
                "BEYOND-TIERS",
                claim,
                scope,
                _status(p_value, kh / nh, ks / ns),
                f"episodes' first requests: host {kh}/{nh} ({100 * kh / nh:.1f}%) vs slot {ks}/{ns} "
                f"({100 * ks / ns:.1f}%) differ from the earlier ON run; Fisher one-sided p = "
                f"{p_value:.2g}",
                evidence,
            )
        )
    if len(strata) > 1:  # the same question over every configuration-plan, each its own stratum
        odds, p_value = mantel_haenszel([t for _, t in strata], alternative="greater")
        kh, nh = sum(t[0] for _, t in strata), sum(t[0] + t[1] for _, t in strata)
        ks, ns = sum(t[2] for _, t in strata), sum(t[2] + t[3] for _, t in strata)
        out.append(
            Verdict.beyond(
                "BEYOND-TIERS",
                claim,
                f"pooled over {len(strata)} configuration-plans",
                _status(p_value, kh / nh, ks / ns),
                f"episodes' first requests: host {kh}/{nh} ({100 * kh / nh:.1f}%) vs slot {ks}/{ns} "
                f"({100 * ks / ns:.1f}%) differ from the earlier ON run; Mantel-Haenszel (strata: "
                f"configuration-plans) common odds ratio {odds:.2f}, one-sided p = {p_value:.2g}",
                [f"strata: {', '.join(name for name, _ in strata)}"],
            )
        )
    return out


def _status(p_value: float, host_rate: float, slot_rate: float) -> str:
    """PASS: significant at ALPHA; INCONCLUSIVE: host more often but not significantly; FAIL: not more often."""
    if p_value < ALPHA:
        return PASS
    return INCONCLUSIVE if host_rate > slot_rate else FAIL


def analyse(runs: list[Run]) -> tuple[dict[str, pd.DataFrame], list[Verdict]]:
    tiers = run_tiers(runs)
    requests = requests_frame(runs, tiers)
    summary, pairs = summary_frame(runs, tiers)
    return {"tiers_requests.csv": requests, "tiers.csv": summary}, verdicts(pairs, requests, runs)


def figure(summary: pd.DataFrame, path: Path) -> Path | None:
    """Per configuration [plan]: the share of same-prompt ON requests that differ, host- vs slot-served, against
    OFF run 1 (left) and against the earlier ON run (right), 95% Wilson."""
    df = summary[(summary["level"] == "request") & summary["tier"].isin(PLOTTED)] if not summary.empty else summary
    if df.empty:
        return None

    df = df.assign(kind=df["reference"].map(lambda s: "OFF run 1" if s.startswith("off") else "the earlier ON run"))
    df = df.groupby(["config", "plan", "tier", "kind"], as_index=False)[["n", "differ"]].sum()
    groups = sorted({(c, p) for c, p in zip(df["config"], df["plan"])})
    names = [f"{c} [{p}]" for c, p in groups]
    fig = new_figure(
        10.0, 4.4, bottom=0.2 + text_room(names, 6, 35), left=0.75 + overhang(names[0], 6, 35), wspace=0.12
    )
    axes = fig.subplots(1, 2, sharey=True)
    width = 0.38
    for ax, kind in zip(axes, ("OFF run 1", "the earlier ON run")):
        for j, tier in enumerate(PLOTTED):
            g = df[(df["kind"] == kind) & (df["tier"] == tier)]
            xs, rates, lo, hi = [], [], [], []
            for r in g.itertuples():
                k, n = int(r.differ), int(r.n)
                rate = 100 * k / n
                a, b = wilson_interval(k, n)
                xs.append(groups.index((r.config, r.plan)) + (j - 0.5) * width)
                rates.append(rate)
                lo.append(max(0.0, rate - 100 * a))
                hi.append(max(0.0, 100 * b - rate))
            ax.bar(xs, rates, width, yerr=[lo, hi], capsize=2, color=PLOTTED[tier], label=tier)
        ax.set_xticks(range(len(groups)), names, rotation=35, ha="right", fontsize=6)
        ax.set_title(f"Same-prompt ON requests that differ from {kind}", fontsize=9)
    axes[0].set_ylabel("requests (%, 95% Wilson)")
    axes[0].legend(fontsize=7, frameon=False, title="cached prefix from", title_fontsize=7)
    fig.savefig(path, format="png")
    return path


PLOTTED = {"slot": "#4f81bd", "host": "#c0504d"}  # tier -> colour (slot_or_host and none: in the tables)
