"""Other tenants, measured: do background tenants on the server change the measured episodes' outputs?

A plan with `tenants` (artifact/protocol/background_tenants.py) runs the measured episodes while N background tenants
share the server; its manifests record the load (`tenants`). Each of its runs is set against the isolated baseline, plan
main of the same configuration, run k against run k of the same arm, episode by episode (`compare_runs`: token ids
and request counts). The two differ in what produced them by design (the server's slot count and the load), so
their pairing fingerprints differ; everything else that produces the tokens must be equal (`comparable`), or the
comparison is refused with the first differing input. Within the plan: ON vs OFF, and the OFF and ON reruns under
load.

Verdict `BEYOND-TENANTS-<plan>` per configuration and tenant plan: PASS if every OFF run under load equals the
isolated OFF run in every episode and the OFF reruns under load are identical; FAIL if either diverges — a finding
(the load itself changes recomputed outputs), not a failure of the protocol; RQ1 stays judged on plans without load.
INCONCLUSIVE when the tenants sent nothing while a measured request ran (no load was measured) or the OFF rerun under
load did not run, NOT-RUN without the baseline or the plan's OFF runs, INVALID when the runs may not be compared. The ON arm is reported beside it: its
divergence from the isolated ON runs, and ON vs OFF under load next to ON vs OFF isolated.
"""

from __future__ import annotations

from artifact.analysis.divergence import Comparison, compare_runs
from artifact.analysis.groups import by_plan, manifest_table
from artifact.analysis.stats import wilson_interval
from artifact.records.store import Run, read_tenants
from artifact.verdict import FAIL, INCONCLUSIVE, INVALID, NOT_RUN, PASS, Verdict

BASELINE_PLAN = "main"
# server arguments a tenant plan changes by design (llama.cpp: slots and the context they share); any other
# difference from the baseline's pairing inputs refuses the comparison
LOAD_ARGS = ("-np", "-c")


def load_of(run: Run) -> dict:
    """The run's recorded tenants ({} for a run of a plan without them; the plan's table alone where the manifest
    lacks the record)."""
    recorded = manifest_table(run, "tenants")
    if recorded:
        return recorded
    planned = manifest_table(run, "plan_data").get("tenants")
    return {"spec": planned} if isinstance(planned, dict) and planned else {}


def spec_of(run: Run) -> dict:
    t = load_of(run)
    return t.get("spec") if isinstance(t.get("spec"), dict) else t


SHARED, UNSHARED = "shared", "unshared"


def prefix_of(run: Run) -> tuple[str | None, str]:
    """(prefix, why none): whether the run's tenant prompts share the measured prompts' prefix, derived from the
    prompts the run recorded, never from the plan's `prefix` label. The manifest's tenants.units record,
    per measured unit, the sha256 and length of its first measured prompt and, per tenant prompt, how many of its
    first characters it shares with that prompt (`protocol.background_tenants.prepare`); a unit counts only where its
    first prompt is the one the run's requests.jsonl records for that episode (request 0). "shared": every tenant prompt
    shares at least half of its unit's first prompt (the generator's shared prompts share its whole system prompt);
    "unshared": none shares 1% of it (the generator's share none). None, and why, where the records show neither."""
    units = load_of(run).get("units")
    if not isinstance(units, list) or not units:
        return None, "the run records no tenant prompts (tenants.units)"
    first = {e: reqs[0].get("prompt_sha256") for e, reqs in run.requests_by_episode().items() if reqs}
    fractions = []
    for u in units:
        u = u if isinstance(u, dict) else {}
        unit, chars, shared = u.get("unit"), u.get("first_prompt_chars"), u.get("shared_prefix_chars")
        if not isinstance(unit, str) or unit not in first or u.get("first_prompt_sha256") != first[unit]:
            return None, (
                f"its tenant prompts of unit {unit!r} are recorded against a first prompt that is not the "
                "one the run sent (requests.jsonl)"
            )
        if (
            type(chars) is not int
            or chars <= 0
            or not isinstance(shared, list)
            or not shared
            or not all(type(c) is int and 0 <= c <= chars for c in shared)
        ):
            return None, f"its tenant prompts of unit {unit!r} do not record what they share with it"
        fractions += [c / chars for c in shared]
    if all(f >= 0.5 for f in fractions):
        return SHARED, ""
    if all(f < 0.01 for f in fractions):
        return UNSHARED, ""
    return None, "some of its tenant prompts share the measured prefix and some do not"


def tenant_plan(run: Run) -> bool:
    """A run of a plan with tenants (the control with 0 tenants included)."""
    return bool(load_of(run))


def recorded_load(run: Run) -> dict | None:
    """What the run's tenants.jsonl says about its load (tenant_counts: tenants that sent
    requests, their requests, the measured requests and how many a tenant request overlapped); None without the
    file. Memoised on the run."""
    cache = run.__dict__.setdefault("_recorded_load", {})
    if "load" not in cache:
        rows = read_tenants(run)
        cache["load"] = (
            None
            if rows is None
            else tenant_counts([r for r in rows if isinstance(r, dict) and r.get("kind") in ("tenant", "measured")])
        )
    return cache["load"]


def under_load(run: Run) -> bool:
    """A run with at least one background tenant that sent requests (its tenants.jsonl says so; the manifest's
    count for records without the file): excluded from the paper's claims (RQ1, RQ2). `check` holds the manifest's
    count against the file before (artifact.check.facts)."""
    load = recorded_load(run)
    if load is not None:
        return load["tenants"] > 0
    return int(spec_of(run).get("count") or 0) > 0


def _without_load_args(args: list) -> list:
    kept, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in LOAD_ARGS:
            skip = True
        else:
            kept.append(a)
    return kept


def _strip(inputs: dict) -> dict:
    """Pairing inputs less what a tenant plan changes by design (the tenants, and -np/-c in the server arguments,
    wherever the engine's identity lists them)."""
    out = {k: v for k, v in inputs.items() if k != "tenants"}
    for owner in (out, out.get("engine")):
        if isinstance(owner, dict) and isinstance(owner.get("server_args"), list):
            stripped = {**owner, "server_args": _without_load_args(owner["server_args"])}
            if owner is out:
                out = stripped
            else:
                out["engine"] = stripped
    return out


def comparable(run: Run, base: Run) -> str | None:
    """Why `run` (under load) may not be set against `base` (isolated), or None: their pairing inputs must be equal
    except the tenants and the server arguments a tenant plan changes (-np, -c), and list the same episodes."""
    a, b = manifest_table(run, "pairing_inputs"), manifest_table(base, "pairing_inputs")
    if not a or not b:
        return f"{run.label if not a else base.label} has no pairing_inputs (made by an older version)"
    sa, sb = _strip(a), _strip(b)
    for key in sorted(set(sa) | set(sb)):
        if sa.get(key) != sb.get(key):
            return f"{run.label} and {base.label} differ in {key}, not only in the load"
    if run.manifest.get("episodes") != base.manifest.get("episodes"):
        return f"{run.label} and {base.label} list different episodes"
    return None


def _cmp_text(c: Comparison) -> str:
    first = c.diverged[0] if c.diverged else None
    where = f" (first: {first.episode_id} request {first.first_request}, token {first.first_token})" if first else ""
    return f"{c.k}/{c.n}{where}"


def _share(k: int, n: int) -> dict:
    lo, hi = wilson_interval(k, n) if n else (float("nan"), float("nan"))
    return {"diverged": k, "episodes": n, "rate": k / n if n else float("nan"), "wilson_lo": lo, "wilson_hi": hi}


def run_rows(runs: list[Run]) -> list[dict]:
    """Per run of a tenant plan: its load and its divergence from the isolated run k of the same arm."""
    plans = by_plan(runs)
    rows = []
    for (config, plan), by in plans.items():
        if not tenant_plan(next(iter(by.values()))):
            continue
        base = plans.get((config, BASELINE_PLAN), {})
        for (arm, k), run in sorted(by.items()):
            t, spec = load_of(run), spec_of(run)
            sent, meas = t.get("sent") or {}, t.get("measured") or {}
            prefix, why = prefix_of(run)  # from the prompts recorded, never the plan's label
            row = {
                "config": config,
                "plan": plan,
                "arm": arm,
                "run": k,
                "tenants": int(spec.get("count") or 0),
                "prefix": prefix,
                "prefix_label": spec.get("prefix"),
                "prefix_unknown": why,
                "slots": t.get("slots"),
                "tenant_requests": sent.get("completed"),
                "tenant_failed": sent.get("failed"),
                "tenant_prompt_n": sent.get("prompt_n"),
                "tenant_cache_n": sent.get("cache_n"),
                "tenant_predicted_n": sent.get("predicted_n"),
                "measured_requests": meas.get("requests"),
                "measured_overlapped": meas.get("overlapped"),
                "overlap_share": meas.get("overlap_share"),
                "cached_tokens": sum(dict.get(r, "cache_n") or 0 for r in run.requests),
                "wall_s": run.manifest.get("wall_s"),
                "refused": None,
                "vs_isolated_diverged": None,
                "vs_isolated_episodes": None,
                "vs_isolated": None,
            }
            load = recorded_load(run)  # the load as tenants.jsonl records it, over the manifest's summary
            if load is not None:
                row.update(
                    tenant_requests=load["requests"] - load["failed"],
                    tenant_failed=load["failed"],
                    measured_requests=load["measured"],
                    measured_overlapped=load["overlapped"],
                )
            other = base.get((arm, k))
            why = "no isolated run (plan main) of this arm and run" if other is None else comparable(run, other)
            if why:
                row["refused"] = why
            else:
                c = compare_runs(run, other)
                row.update(vs_isolated_diverged=c.k, vs_isolated_episodes=c.n, vs_isolated=_cmp_text(c))
            rows.append(row)
    return rows


def _pair(by: dict, a: tuple, b: tuple) -> Comparison | None:
    return compare_runs(by[a], by[b]) if a in by and b in by else None


def plan_rows(runs: list[Run], rows: list[dict]) -> list[dict]:
    """Per configuration and tenant plan: each arm against the isolated baseline (over its runs), the reruns and
    ON vs OFF under load, ON vs OFF isolated, and the load."""
    plans = by_plan(runs)
    out = []
    for (config, plan), by in plans.items():
        mine = [r for r in rows if r["config"] == config and r["plan"] == plan]
        if not mine:
            continue
        base = plans.get((config, BASELINE_PLAN), {})
        prefixes = {r["prefix"] for r in mine}
        row = {
            "config": config,
            "plan": plan,
            "tenants": mine[0]["tenants"],
            "prefix": prefixes.pop() if len(prefixes) == 1 else None,
            "prefix_note": prefix_note(mine),
            "slots": mine[0]["slots"],
            "runs": len(mine),
            "refused": "; ".join(sorted({r["refused"] for r in mine if r["refused"]})) or None,
        }
        for arm in ("off", "on"):
            ok = [r for r in mine if r["arm"] == arm and r["vs_isolated_episodes"] is not None]
            s = _share(sum(r["vs_isolated_diverged"] for r in ok), sum(r["vs_isolated_episodes"] for r in ok))
            row.update({f"{arm}_vs_isolated_{key}": v for key, v in s.items()})
            row[f"{arm}_vs_isolated_runs"] = len(ok)
            row[f"{arm}_vs_isolated_detail"] = "; ".join(f"run {r['run']}: {r['vs_isolated']}" for r in ok)
            rerun = _pair(by, (arm, 1), (arm, 2))
            row[f"{arm}_rerun"] = _cmp_text(rerun) if rerun else None
            row[f"{arm}_rerun_diverged"] = rerun.k if rerun else None
            row[f"{arm}_rerun_episodes"] = rerun.n if rerun else None
            iso = _pair(base, (arm, 1), (arm, 2))
            row[f"isolated_{arm}_rerun"] = _cmp_text(iso) if iso else None
        onoff = [compare_runs(by[("on", k)], by[("off", k)]) for k in (1, 2) if ("on", k) in by and ("off", k) in by]
        iso_onoff = [
            compare_runs(base[("on", k)], base[("off", k)]) for k in (1, 2) if ("on", k) in base and ("off", k) in base
        ]
        row["on_vs_off"] = f"{sum(c.k for c in onoff)}/{sum(c.n for c in onoff)}" if onoff else None
        row["isolated_on_vs_off"] = (
            f"{sum(c.k for c in iso_onoff)}/{sum(c.n for c in iso_onoff)}" if iso_onoff else None
        )
        row["tenant_requests"] = sum(r["tenant_requests"] or 0 for r in mine)
        row["tenant_failed"] = sum(r["tenant_failed"] or 0 for r in mine)
        row["measured_requests"] = sum(r["measured_requests"] or 0 for r in mine)
        row["measured_overlapped"] = sum(r["measured_overlapped"] or 0 for r in mine)
        shares = [r["overlap_share"] for r in mine if r["overlap_share"] is not None]
        row["overlap_share_mean"] = sum(shares) / len(shares) if shares else float("nan")
        row["off_cached_tokens"] = sum(r["cached_tokens"] for r in mine if r["arm"] == "off")
        row["on_cached_tokens"] = sum(r["cached_tokens"] for r in mine if r["arm"] == "on")
        out.append(row)
    return out


def prefix_note(rows: list[dict]) -> str | None:
    """What the verdict says where a plan's `prefix` label is not what its runs' recorded prompts show (the records
    win), or where they show no single answer; None where they agree with it."""
    labels = sorted({str(r["prefix_label"]) for r in rows if r["prefix_label"] is not None})
    derived = {r["prefix"] for r in rows}
    if len(derived) == 1 and None not in derived:
        prefix = next(iter(derived))
        if labels in ([], [prefix]):
            return None
        return (
            f"the plan's label says prefix {' / '.join(map(repr, labels))}, its runs' recorded tenant prompts "
            f"show {prefix!r}: read as {prefix} (the records win over the label)"
        )
    why = sorted({r["prefix_unknown"] for r in rows if r["prefix_unknown"]}) or [
        "its runs' recorded tenant prompts do not agree"
    ]
    return (
        f"whether the tenant prompts share the measured prefix is not known from the records ({why[0]}); the "
        f"plan's label ({' / '.join(map(repr, labels)) or 'none'}) is not read"
    )


def verdicts(plans: list[dict]) -> list:
    """BEYOND-TENANTS-<plan> per configuration and tenant plan (see the module's doc)."""

    out = []
    for p in plans:
        n = p["tenants"]
        share = {SHARED: "share", UNSHARED: "do not share"}.get(p["prefix"], "may or may not share")
        what = (
            f"{n} background tenant(s) whose prompts {share} the measured prefix"
            if n
            else f"the tenant plans' server ({p['slots']} slots) without load"
        )
        claim = f"With {what}, cache-OFF outputs equal the isolated ones and OFF reruns stay identical"
        scope = f"{p['config']}/{p['plan']}"
        k, m = p["off_vs_isolated_diverged"], p["off_vs_isolated_episodes"]
        rk = p["off_rerun_diverged"]
        on_iso = f"{p['on_vs_isolated_diverged']}/{p['on_vs_isolated_episodes']}" if p["on_vs_isolated_runs"] else "-"
        on = (
            f"ON vs isolated ON {on_iso}; ON rerun "
            f"{p['on_rerun'] or '-'} (isolated {p['isolated_on_rerun'] or '-'}); ON vs OFF {p['on_vs_off'] or '-'} "
            f"(isolated {p['isolated_on_vs_off'] or '-'})"
        )
        load = (
            f"load: {p['tenant_requests']} tenant requests ({p['tenant_failed']} failed), "
            f"{p['measured_overlapped']}/{p['measured_requests']} measured requests overlapped one, "
            f"{_pct(p['overlap_share_mean'])} of their time on average"
        )
        evidence = (
            [on, load]
            + ([f"refused: {p['refused']}"] if p["refused"] else [])
            + [f"OFF vs isolated: {p['off_vs_isolated_detail']}"] * bool(p["off_vs_isolated_detail"])
        )
        if p["refused"] and not p["off_vs_isolated_runs"]:
            status = INVALID if "differ" in p["refused"] or "pairing" in p["refused"] else NOT_RUN
            observed = f"not compared: {p['refused']}"
        elif not p["off_vs_isolated_runs"]:
            status, observed = NOT_RUN, "no OFF run of this plan with its isolated OFF run (plan main)"
        else:
            observed = (
                f"OFF under load vs isolated diverged in {k}/{m} episodes; OFF rerun under load {p['off_rerun'] or '-'}"
            )
            if k or rk:
                status = FAIL
                observed += " — a finding: the load changes recomputed outputs (RQ1 is judged without load)"
            elif n and not p["measured_overlapped"]:
                status = INCONCLUSIVE
                observed += "; but no tenant request ran during a measured one: no load was measured"
            elif rk is None:
                status = INCONCLUSIVE
                observed += " (one OFF run only: the rerun under load did not run)"
            else:
                status = PASS
        if n and p.get("prefix_note"):
            observed += f"; {p['prefix_note']}"
        out.append(Verdict.beyond(f"BEYOND-TENANTS-{p['plan']}", claim, scope, status, observed, evidence))
    if not out:
        out.append(
            Verdict.beyond(
                "BEYOND-TENANTS",
                "Background tenants leave the measured outputs unchanged",
                "-",
                NOT_RUN,
                "no run of a tenant plan (./run.sh run CONFIG --plan tenants1-shared, and --plan main)",
            )
        )
    return out


def _pct(v) -> str:
    return "-" if v is None or v != v else f"{100 * v:.0f}%"


def _overlapped(measured: list[dict], tenant: list[dict]) -> int:
    """Measured requests during which a tenant request was in flight (their intervals overlap)."""
    spans = sorted((r["t_start"], r["t_end"]) for r in tenant)
    n = 0
    for m in measured:
        a, b = m["t_start"], m["t_end"]
        n += any(s < b and e > a for s, e in spans if s < b)
    return n


def tenant_counts(rows: list[dict]) -> dict:
    """What tenants.jsonl says about the load: tenants that sent requests, their requests (failed ones), the
    measured requests and how many of them a tenant request overlapped."""
    tenant = [r for r in rows if r["kind"] == "tenant"]
    measured = [r for r in rows if r["kind"] == "measured"]
    return {
        "tenants": len({r["tenant"] for r in tenant}),
        "requests": len(tenant),
        "failed": sum(r["error"] is not None for r in tenant),
        "measured": len(measured),
        "overlapped": _overlapped(measured, tenant),
    }
