"""Which cache tier served each request's cached prefix, from llama-server's own log (b10434 and b10435 alike, INFO level).

llama-server has two tiers: the slot's own KV cache ("slot") and the host-memory prompt cache ("host",
`--cache-ram`). What happens per request (tools/server/server-context.cpp, `get_available_slot`):

  1. the slot is chosen and the choice is logged at INFO, once per completion request:
       "selected slot by LCP similarity, f_sim_best = S (> T thold), f_keep = K"  (the slot's prefix matches)
       "selected slot by LRU, t_last = ..."                                        (no slot matches above T)
       "selected slot by id (N)"                                                   (the request pinned a slot)
  2. the host cache is consulted only with --cache-ram != 0 and only when the slot was chosen by LRU, or by
     similarity with f_keep < 0.5 (a pinned slot: the same similarity test, but not logged). Then the slot's state
     is saved to host memory and the host entry with a strictly longer common prefix (and f_keep >= 0.25) is
     loaded into the slot; if there is none, the slot keeps its own state (`server_prompt_cache::load`);
  3. the request's cached tokens (`timings.cache_n`) are the common prefix of the prompt with what the slot then
     holds (one less when the whole prompt matches: the last prompt token is always recomputed). The prompt
     evaluation is logged as "prompt eval time = ... / N tokens" (N = the tokens computed = the record's prompt_n).

Whether a host entry was loaded is logged only at trace level (-lv 4), which the protocol does not use, so the tier
is inferred, and each attribution says whether it is certain:
  none          cache_n == 0 (certain)
  slot          the host cache is off, or was not consulted (similarity with f_keep >= 0.5; a pinned slot with
                similarity selection off) (certain); or the cached prefix is no longer than what the slot held
                within the log's 3-decimal rounding of f_sim (the host would have needed a strictly longer one)
  host          the host cache was consulted and cache_n exceeds the most the slot could have held: f_sim x n
                rounded up for a similarity choice, T x n for an LRU choice (certain)
  slot_or_host  the host cache was consulted and cache_n is within what the slot could also have held
                (uncertain: an LRU choice with a short shared prefix, or a pinned slot)
  unknown       the log is missing or does not line up with the records (one selection line per request, in send
                order, and equal prompt_n wherever both report it); the reason is given

The attribution is post hoc (the log is complete only once the server stopped) and changes no record.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from artifact.engines.audit import Tier

SELECT = re.compile(
    r"slot get_availabl: id +(\d+) \| task -?\d+ \| selected slot by (?:"
    r"LCP similarity, f_sim_best = ([\d.]+) \(> ([\d.]+) thold\), f_keep = ([\d.]+)"
    r"|(LRU), t_last = -?\d+"
    r"|id \((-?\d+)\))"
)
PROMPT_EVAL = re.compile(r"slot print_timing: id +\d+ \| task \d+ \| prompt eval time = +[\d.]+ ms / +(\d+) tokens")
ROUNDING = 0.0005  # f_sim_best is logged with 3 decimals
F_KEEP_SAVE = 0.5  # below it a similarity choice also goes through the host cache (get_available_slot)


@dataclass(frozen=True)
class Selection:
    """One completion request as the log shows it: how the slot was chosen, and the tokens it computed."""

    how: str  # "lcp", "lru" or "id"
    f_sim: float | None = None
    threshold: float | None = None
    f_keep: float | None = None
    prompt_n: int | None = None  # from the request's "prompt eval" line (None: the request failed before it)
    line: str = ""


def parse_log(text: str) -> list[Selection]:
    """The log's completion requests in order (a selection line each, with the prompt_n of its timing line)."""
    out: list[Selection] = []
    for line in text.splitlines():
        if "get_availabl" not in line and "prompt eval time" not in line:  # most lines: cheaper than a regex
            continue
        m = SELECT.search(line)
        if m:
            if m.group(2) is not None:
                out.append(Selection("lcp", float(m.group(2)), float(m.group(3)), float(m.group(4)), line=line.strip()))
            elif m.group(5):
                out.append(Selection("lru", line=line.strip()))
            else:
                out.append(Selection("id", line=line.strip()))
            continue
        m = PROMPT_EVAL.search(line)
        if m and out and out[-1].prompt_n is None:
            s = out[-1]
            out[-1] = Selection(s.how, s.f_sim, s.threshold, s.f_keep, int(m.group(1)), s.line)
    return out


@dataclass(frozen=True)
class ServerCache:
    """The two settings the attribution needs, read from the server's recorded command line."""

    host_cache: bool  # --cache-ram != 0
    similarity: float  # -sps


def server_cache(cmd: list[str]) -> ServerCache:
    """From a manifest's `server_cmd`: llama-server's defaults (8192 MiB, 0.1) where a flag is absent."""
    args = [str(a) for a in cmd] if isinstance(cmd, list) else shlex.split(str(cmd or ""))

    def value(*names, default):
        for i, a in enumerate(args[:-1]):
            if a in names:
                return args[i + 1]
        return default

    return ServerCache(
        host_cache=int(value("--cache-ram", "-cram", default=8192)) != 0,
        similarity=float(value("--slot-prompt-similarity", "-sps", default=0.1)),
    )


def attribute(sel: Selection, record: dict, cache: ServerCache) -> Tier:
    """The tier of one served request, from its selection line and record."""
    cache_n, n = record.get("cache_n"), record.get("prompt_tokens")
    if cache_n is None:
        return Tier("unknown", False, "the server reported no cache_n")
    if cache_n == 0:
        return Tier("none", True, "no cached prompt tokens")
    if not cache.host_cache:
        return Tier("slot", True, "host prompt cache off (--cache-ram 0)")
    if sel.how == "lcp" and sel.f_keep is not None and sel.f_keep >= F_KEEP_SAVE:
        return Tier(
            "slot", True, f"slot chosen by similarity with f_keep {sel.f_keep:.3f} >= 0.5: host cache not consulted"
        )
    if sel.how == "id":
        if cache.similarity == 0:
            return Tier("slot", True, "pinned slot with similarity selection off: host cache not consulted")
        return Tier("slot_or_host", False, "pinned slot: whether the host cache was consulted is not logged")
    if not n:
        return Tier("slot_or_host", False, "prompt length not reported")
    if sel.how == "lcp":
        most = (sel.f_sim + ROUNDING) * n  # the most the slot's own prefix can have been
        least = (sel.f_sim - ROUNDING) * n
        if cache_n > most:
            return Tier(
                "host",
                True,
                f"cache_n {cache_n} > slot prefix <= {most:.0f} (f_sim {sel.f_sim:.3f} of "
                f"{n}): a host entry was loaded",
            )
        if cache_n + 1 >= least and most - least < 1:
            return Tier("slot", True, f"cache_n {cache_n} = the slot's prefix (f_sim {sel.f_sim:.3f} of {n})")
        return Tier(
            "slot_or_host",
            False,
            f"cache_n {cache_n} within the slot's prefix {least:.0f}-{most:.0f} (f_sim rounded in the log)",
        )
    most = cache.similarity * n  # LRU: the slot's prefix matched at most the threshold
    if cache_n > most:
        return Tier(
            "host",
            True,
            f"cache_n {cache_n} > {most:.0f} = -sps {cache.similarity:g} x {n}, the most "
            "an LRU-chosen slot can share: a host entry was loaded",
        )
    return Tier("slot_or_host", False, f"LRU choice and cache_n {cache_n} <= {most:.0f}: the slot or a host entry")


def session_tiers(manifest: dict, requests: list[dict], log_text: str | None) -> list[Tier]:
    """Per request of one server session (every run of the session, in send order), its tier."""
    if log_text is None:
        return [_without_log(r) for r in requests]
    sels = parse_log(log_text)
    if len(sels) != len(requests):
        why = f"the server log has {len(sels)} completion requests, the records {len(requests)}"
        return [_without_log(r, why) for r in requests]
    for i, (s, r) in enumerate(zip(sels, requests)):
        pn = r.get("prompt_n")
        if s.prompt_n is not None and pn is not None and s.prompt_n != pn:
            why = f"request {i} of the session computed {pn} prompt tokens, its log line says {s.prompt_n}"
            return [_without_log(r, why) for r in requests]
    cache = server_cache(manifest.get("server_cmd") or [])
    return [
        attribute(s, r, cache) if r.get("error") is None else Tier("unknown", False, "request failed")
        for s, r in zip(sels, requests)
    ]


def _without_log(record: dict, why: str = "no server log") -> Tier:
    if record.get("cache_n") == 0:
        return Tier("none", True, "no cached prompt tokens")
    return Tier("unknown", False, why)
