"""RQ4: vLLM shows the same direction: OFF reruns identical, ON-vs-OFF divergence > 0."""

from __future__ import annotations

from pathlib import Path

from artifact.analysis.tables import Tables
from artifact.analysis.tenants import under_load
from artifact.check.core import (
    FAIL, INCONCLUSIVE, INVALID, NOT_RUN, PASS, Claim, Context, fmt_rate, group_problems, make_claim,
    pair_evidence, Paper, pct, scope_of, Verdict, without_evidence, zero_contradicts,
)

ID = "RQ4"
RULE = {
    "statement": "vLLM shows the same direction: OFF reruns identical, ON-vs-OFF divergence > 0.",
    "hard": False,
    "rule": "Per vLLM configuration-plan: PASS if its cache-OFF reruns diverge in 0 episodes and its ON-vs-OFF "
            "divergence is > 0; FAIL if the OFF reruns diverge, or ON vs OFF is 0/n with n >= 7 (as in RQ2); "
            "INCONCLUSIVE for a smaller 0/n; NOT-RUN if either comparison is missing, and NOT-RUN without vLLM "
            "runs (`./run.sh demo --vllm` makes them on a CPU; `./run.sh all` on a GPU host; configs/h200-vllm on "
            "an H200). Any vLLM version and build (each verdict names the one its records report), under every plan "
            "with both arms that keeps the configuration's server settings: plans with server_overrides (vLLM's "
            "batch_invariant) are mitigation arms, judged in the beyond-the-paper section, as in RQ2. The paper's "
            "vLLM values (8.8% and 27.5% ON reruns in two sessions, 62.5% ON vs OFF) are context, not a band: the "
            "summary does not name the model.",
    "minimum_evidence": "both comparisons over >= 1 episode in which both runs made a request without an error, "
                        "and an ON run that was served a cached token (cache_n > 0 on at least one request; as in "
                        "RQ2, an ON run with none, or that reports no cache use, is INCONCLUSIVE).",
}


def rq4(tables: Tables, paper: Paper, root: Path | None) -> Claim:
    details = []
    for g in tables.groups:
        if str(g.meta["engine"]).lower() != "vllm":
            continue
        if not {"on", "off"} <= {r.manifest["arm"] for r in g.runs}:
            continue  # a plan with one arm only (an OFF arm by cache_salt): no ON-vs-OFF comparison to make
        if any((r.manifest.get("plan_data") or {}).get("server_overrides") for r in g.runs):
            continue  # a mitigation plan (batch invariance) is meant to remove the divergence: judged in "beyond"
        if any(under_load(r) for r in g.runs):
            continue  # background tenants: not the protocol's isolated condition
        off, onoff = g.stats.get("off_rerun"), g.stats.get("on_vs_off")
        obs = f"OFF reruns {fmt_rate(off)}; ON vs OFF {fmt_rate(onoff)} ({g.meta.get('engine_build') or 'vLLM'})"
        invalid = group_problems(g)
        why = []
        if invalid:
            status, why = INVALID, invalid
        elif off is None or onoff is None:
            status = NOT_RUN
        elif without_evidence(off) or without_evidence(onoff):
            status, why = INCONCLUSIVE, ["a comparison holds no episode in which both runs made a request without "
                                         "an error"]
        elif unused := g.cache_unused(("on_vs_off",)):
            status, why = INCONCLUSIVE, unused
        elif off["k"]:
            status, why = FAIL, ["the OFF reruns diverge"]
        elif onoff["k"]:
            status = PASS
        elif zero_contradicts(onoff["n"], paper):
            status, why = FAIL, [f"ON vs OFF diverged in 0 of {onoff['n']} episodes"]
        else:
            status, why = INCONCLUSIVE, [f"ON vs OFF 0/{onoff['n']}: too few episodes to contradict the paper"]
        details.append(Verdict.of_claim(ID, scope_of(g), "direction", status, obs,
                               "OFF reruns 0 diverging; ON vs OFF > 0", "direction only (model not named by the paper)",
                               why + pair_evidence(g, "off_rerun", root) + pair_evidence(g, "on_vs_off", root)))
    ctx = [paper.value(k) for k in ("on_rerun_vllm_16bit", "on_rerun_vllm_16bit_other_session", "on_vs_off_vllm_16bit")]
    expected = ("OFF reruns identical, ON vs OFF > 0; paper vLLM 16-bit: ON reruns "
                f"{pct(ctx[0]['value'])} / {pct(ctx[1]['value'])}, ON vs OFF {pct(ctx[2]['value'])} (§IV-E, Tab. 2)"
                if all(ctx) else "OFF reruns identical, ON vs OFF > 0")
    if not details:
        return make_claim(ID, RULE, [], "no vLLM runs", expected, "direction only",
                      ["no run with engine = vllm of a plan with both arms and the configuration's own server "
                       "settings in these results: `./run.sh demo --vllm` makes them on a CPU (vLLM 0.11.0 CPU "
                       "build), `./run.sh all` on a GPU host, configs/h200-vllm on an H200 (vLLM 0.25.0)"],
                      NOT_RUN)
    return make_claim(ID, RULE, details, "; ".join(f"{d.scope}: {d.observed}" for d in details), expected,
                  "direction only", [f"{d.scope}: {d.status}" for d in details])


def judge(ctx: Context) -> Claim:
    return rq4(ctx.tables, ctx.paper, ctx.root)
