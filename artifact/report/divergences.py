"""Every pair's first divergences (`./run.sh check` writes them beside the verdicts: first-divergence.json and .txt):
for each comparison of the paired protocol (ON vs OFF run k vs run k, the ON and OFF reruns) and each episode that
diverged in it, where it first diverged (the request, 1-based, and the token, 0-based within that reply), both
replies from the point where their texts part, the top-2 log-probability margin at that token on each side and the
cached prompt tokens of that request. The report shows one such episode (report.example); this is every one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec

from artifact.analysis.tables import group_runs
from artifact.records.store import Run
from artifact.report.example import _text_split, top2_margin

JSON_NAME, TEXT_NAME = "first-divergence.json", "first-divergence.txt"
SHOWN = 160  # characters of each reply shown from where the texts part


# a log-probability written as an integer (`-1]`): json reads it as an int, the parsed arrays as a float
_INT_LOGPROB = re.compile(rb"[ ,\[]-?[0-9]+\]")


def _margin_at(run: Run, req: dict, token: int | None) -> dict | None:
    """`top2_margin(req["top_logprobs"], token)`, the same dict, from the run's parsed top-2 arrays
    (`Run.top2_arrays`) where they hold the request and its text writes every log-probability as a float (else,
    from the decoded list): at paper scale ~3,000 requests' texts are not decoded for one position each."""
    rows = run.top2_table()[1].get(id(req))
    raw = getattr(req, "_raw", None)
    if token is None or rows is None or raw is None or _INT_LOGPROB.search(raw):
        return top2_margin(req.get("top_logprobs") or [], token)
    start, n = rows
    if token >= n:
        return None
    _, _, ids, lps = run.top2_arrays()
    (t1, t2), (l1, l2) = ids[start + token].tolist(), lps[start + token].tolist()
    if l1 < l2:  # best first, as top2_margin sorts them (never so in records that passed the schema)
        (t1, l1), (t2, l2) = (t2, l2), (t1, l1)
    return {"top1_id": t1, "top1_logprob": l1, "top2_id": t2, "top2_logprob": l2, "margin": l1 - l2}


def _side(run: Run, req: dict | None, token: int | None) -> dict:
    if req is None:
        return {"present": False}
    tokens = req.get("output_tokens") or []
    margin = _margin_at(run, req, token)
    return {
        "present": True,
        "text": req.get("output_text") or "",
        "token_id": tokens[token] if token is not None and token < len(tokens) else None,
        "top2_margin": None if margin is None else round(margin["margin"], 6),
        "top2": margin,
        "cache_n": req.get("cache_n"),
        "prompt_tokens": req.get("prompt_tokens"),
        "prompt_sha256": req.get("prompt_sha256"),
    }


def first_divergences(runs: list[Run]) -> list[dict]:
    """One entry per comparison (config, plan, kind, the two runs, diverged/compared) with its diverged episodes."""
    out = []
    for g in group_runs([r for r in runs if r.complete]):
        for pair in g.comparisons:
            c = pair.cmp
            entry = {
                "config": g.config,
                "plan": g.plan,
                "kind": pair.kind,
                "a": pair.a.label,
                "b": pair.b.label,
                "diverged": c.k,
                "compared": c.n,
                "episodes": [],
            }
            by_a, by_b = pair.a.requests_by_episode(), pair.b.requests_by_episode()
            for d in c.diverged:
                i, t = d.first_request, d.first_token
                qa, qb = by_a.get(d.episode_id, []), by_b.get(d.episode_id, [])
                ra = qa[i] if i is not None and i < len(qa) else None
                rb = qb[i] if i is not None and i < len(qb) else None
                a, b = _side(pair.a, ra, t), _side(pair.b, rb, t)
                if a["present"] and b["present"]:
                    common, a["from_split"], b["from_split"] = _text_split(a["text"], b["text"])
                    a["common_chars"] = b["common_chars"] = len(common)
                entry["episodes"].append(
                    {
                        "episode": d.episode_id,
                        "request": None if i is None else i + 1,
                        "token": t,
                        "n_requests": list(d.n_requests),
                        "same_prompt": bool(ra and rb and ra.get("prompt_sha256") == rb.get("prompt_sha256")),
                        "a": a,
                        "b": b,
                    }
                )
            out.append(entry)
    return out


def _show(side: dict) -> str:
    if not side.get("present"):
        return "(no such request)"
    rest = side.get("from_split", side.get("text", ""))
    text = json.dumps(rest[:SHOWN] + ("..." if len(rest) > SHOWN else ""), ensure_ascii=False)
    margin = side.get("top2_margin")
    return (
        f"{text} (token {side.get('token_id')}, top-2 margin "
        f"{'n/a' if margin is None else f'{margin:.4f}'}, cache_n {side.get('cache_n')})"
    )


def render(entries: list[dict]) -> str:
    lines = []
    for e in entries:
        lines.append(
            f"{e['config']}/{e['plan']} {e['kind']}: {e['a']} vs {e['b']}: {e['diverged']} of "
            f"{e['compared']} episodes diverged"
        )
        for d in e["episodes"]:
            where = (
                f"request {d['request']}, token {d['token']}"
                if d["token"] is not None
                else f"request {d['request']} (a different number of requests: {d['n_requests']})"
            )
            lines.append(f"  {d['episode']}: {where}{'' if d['same_prompt'] else ' (prompts differ)'}")
            lines.append(f"    A {_show(d['a'])}")
            lines.append(f"    B {_show(d['b'])}")
    return "\n".join(lines) + ("\n" if lines else "")


def indented(entries: list[dict]) -> str:
    """json.dumps(entries, indent=1, ensure_ascii=False), the same text: the standard library's compact encoder
    (in C; its indenting encoder is Python, ~3x slower on a paper-scale check's 3 MB) laid out by msgspec's
    formatter, which copies every number and string as written. Text that UTF-8 cannot encode (a lone surrogate
    in model text) is left to json.dumps."""
    try:
        return msgspec.json.format(json.dumps(entries, ensure_ascii=False, separators=(",", ":")), indent=1)
    except UnicodeEncodeError:
        return json.dumps(entries, indent=1, ensure_ascii=False)


def write(runs: list[Run], out: Path) -> tuple[Path, list[dict]]:
    """first-divergence.json and .txt under `out`; returns the text file's path and the entries."""
    entries = first_divergences(runs)
    out.mkdir(parents=True, exist_ok=True)
    # model text is untrusted: a lone surrogate in it is written escaped, as check.json does, never an error
    (out / JSON_NAME).write_text(indented(entries) + "\n", encoding="utf-8", errors="backslashreplace")
    (out / TEXT_NAME).write_text(render(entries), encoding="utf-8", errors="backslashreplace")
    return out / TEXT_NAME, entries
