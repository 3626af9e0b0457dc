"""Where vLLM's cache-ON and cache-OFF runs first diverge, request by request, and which demo budget that allows.

Reads the records of one or more results directories (any configuration-plan with an ON run 1 and an OFF run 1, e.g. plan
`kernels` or `main`) and prints, for ON run 1 vs OFF run 1, per request while both runs sent the same prompt:
turn/step, prompt tokens, tokens the ON run was served from the cache, tokens generated (ON/OFF), the largest change
of the top-1 log-probability over the positions both generated alike (what the cached prefix perturbed), the OFF
run's positions with a top-2 margin below 0.1 and 0.5 nats (the tokens that such a perturbation could flip), and the
first differing token with the top-2 margin there in both runs ("top-2 same": both candidates and both
log-probabilities equal at every position generated alike). Then the budget table: for the first E episodes and
their first T turns, how many episodes ON vs OFF diverged in, the requests both runs made and their server seconds
(the demo runs each arm twice, plus two server starts per arm).

    .venv/bin/python bench/vllm_divergence.py RESULTS [RESULTS ...] [--turns 1,2,3,4] [--episodes 1,2,...]

bench/vllm-demo-budget.md says how to run it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artifact.errors import ArtifactError
from artifact.records.store import find_runs


def margin(top) -> float:
    return top[0][1] - top[1][1] if top and len(top) > 1 else float("nan")


def first_difference(ta, tb):
    first = next((j for j, (u, v) in enumerate(zip(ta, tb)) if u != v), None)
    return min(len(ta), len(tb)) if first is None and len(ta) != len(tb) else first


def seconds(q) -> float:
    extra = q.get("engine_extra") or {}
    if extra.get("wall_ms") is not None:
        return extra["wall_ms"] / 1000
    return ((q.get("prompt_ms") or 0) + (q.get("predicted_ms") or 0)) / 1000


def pairs(on, off):
    """Per episode: [(ON request, OFF request, first differing token or None)] up to the first differing pair."""
    eb = off.requests_by_episode()
    out = {}
    for eid, ra in on.requests_by_episode().items():
        rows = out.setdefault(eid, [])
        for qa, qb in zip(ra, eb.get(eid, [])):
            if qa.get("error") or qb.get("error") or qa["prompt_sha256"] != qb["prompt_sha256"]:
                break
            first = first_difference(qa["output_tokens"], qb["output_tokens"])
            rows.append((qa, qb, first))
            if first is not None:
                break
    return out


def run_ones(dirs: list[Path]) -> dict:
    """(config, plan) -> {arm: its run 1}, complete or not (an arm measured in a directory of its own, or a run
    stopped part-way, still shows the requests it made)."""
    out: dict = {}
    for d in dirs:
        for r in find_runs(d):
            m = r.manifest
            if m.get("arm") in ("on", "off") and m.get("run") == 1:
                out.setdefault((m["config"], m["plan"]), {})[m["arm"]] = r
    return dict(sorted(out.items()))


def report(dirs: list[Path], turns: list[int], episodes: list[int] | None) -> None:
    shown = 0
    for (cfg, plan), g in run_ones(dirs).items():
        if "on" not in g or "off" not in g:
            continue
        on, off = g["on"], g["off"]
        shown += 1
        wl = on.manifest.get("workload_settings") or {}
        print(
            f"== {cfg} / {plan}: ON run 1 vs OFF run 1; model {on.manifest.get('model', {}).get('name')} "
            f"({on.manifest.get('model', {}).get('quant')}), n_predict {wl.get('n_predict')}, "
            f"runs {on.manifest['status']} / {off.manifest['status']}"
        )
        print(
            f"{'episode':20} req turn/step prompt cached  gen ON/OFF  max|d top1| top-2 same  OFF m<0.1 m<0.5  first  m ON  m OFF"
        )
        per_episode = pairs(on, off)
        for eid, rows in per_episode.items():
            for i, (qa, qb, first) in enumerate(rows):
                ta, tb = qa["output_tokens"], qb["output_tokens"]
                common = len(ta) if first is None else first
                la, lb = qa["top_logprobs"], qb["top_logprobs"]
                d1 = max((abs(la[j][0][1] - lb[j][0][1]) for j in range(common)), default=0.0)
                same = "yes" if la[:common] == lb[:common] else "no"  # both candidates and their log-probabilities
                mb = [margin(t) for t in lb]
                fa = fb = ""
                if first is not None and first < min(len(ta), len(tb)):
                    fa, fb = f"{margin(la[first]):.3f}", f"{margin(lb[first]):.3f}"
                print(
                    f"{eid:20} {i + 1:3} {qa['turn'] + 1:4}/{qa['step']:<4} {qa['prompt_tokens']:6} "
                    f"{qa['cache_n']:6} {len(ta):5}/{len(tb):<5} {d1:11.4f} {same:>10} {sum(m < 0.1 for m in mb):9} "
                    f"{sum(m < 0.5 for m in mb):5}  {'-' if first is None else first:>5} {fa:>5} {fb:>6}"
                )
        # the budget table: a budget of E episodes x T turns is the first E episodes' requests of turns < T
        order = [e for e in on.manifest["episodes"] if per_episode.get(e)]  # episodes both runs reached
        eps = episodes or list(range(1, len(order) + 1))
        reqs_on, reqs_off = on.requests_by_episode(), off.requests_by_episode()
        print(f"\n{'episodes':>8} {'turns':>5}  ON vs OFF diverged  requests/run  server s (ON run 1 + OFF run 1)")
        for e in eps:
            if e > len(order):
                continue
            for t in turns:
                div = 0
                nreq = 0
                secs = 0.0
                for eid in order[:e]:
                    rows = per_episode.get(eid, [])
                    if any(first is not None and qa["turn"] < t for qa, _, first in rows):
                        div += 1
                    qs_on = [q for q in reqs_on.get(eid, []) if q["turn"] < t]
                    qs_off = [q for q in reqs_off.get(eid, []) if q["turn"] < t]
                    nreq += len(qs_off)
                    secs += sum(map(seconds, qs_on)) + sum(map(seconds, qs_off))
                print(f"{e:8} {t:5}  {div:>9}/{e:<8} {nreq:12}  {secs:8.0f}")
        print()
    if not shown:
        raise ArtifactError(f"{' '.join(map(str, dirs))}: no configuration-plan with an ON run 1 and an OFF run 1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="+", help="results directories (the arms may lie in different ones)")
    ap.add_argument("--turns", default="1,2,3,4", help="turn budgets to tabulate (default 1,2,3,4)")
    ap.add_argument("--episodes", default=None, help="episode budgets to tabulate (default: 1..all)")
    a = ap.parse_args(argv)
    try:
        report(
            a.results,
            [int(x) for x in a.turns.split(",")],
            [int(x) for x in a.episodes.split(",")] if a.episodes else None,
        )
    except (ArtifactError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
