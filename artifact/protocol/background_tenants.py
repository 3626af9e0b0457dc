"""Background tenants: other users of the same server while the measured runs go on (the paper's §VI, untested).

A plan's `tenants = { count = N, prefix = "shared" | "unshared", prompts = P, n_predict = T }` starts N tenants with
each measured run and stops them at its end; the measured requests stay serial, batch 1, greedy, seed 42, and the
tenants' requests run concurrently on the server's other slots (continuous batching), so that a measured request
may be computed in one batch with theirs. The engine serves them through its session's `background` method
(capability `background_requests`; an engine without it refuses the plan before anything starts), and must give
the server at least N + 1 slots (llama.cpp: `slots` in the plan's `llama_cpp` table). Loopback only: the tenants
talk to the 127.0.0.1 server the session started.

The load is deterministic data, recorded in every manifest (`tenants`):
  prompts   per measured unit, P prompts from the workload (`Workload.tenant_prompts`: data the protocol never
            evaluates; BFCL: the measured episode's own system prompt with held-out questions). "shared" sends them
            as they are: they share the measured unit's prefix. "unshared" replaces that shared prefix, character
            for character, with synthetic text (`synthetic_text`: seeded words), so the tenants' prompts keep their
            length, their own suffixes and the prefix they share with each other, but share nothing with the
            measured prompts. The prompts' sha256 and their shared prefix (characters) are recorded.
  schedule  during measured unit i, tenant j loops over unit i's prompts from position j: prompt (j + c) mod P
            for its c-th request of that unit, each with n_predict T, greedy, the prompt cache on and the slot
            chosen by the server (as a plain client); a tenant finishes its request in flight before it moves to
            the next unit's prompts, and every tenant's last request has ended before the run is marked complete.
  what ran  `tenants.jsonl` in the run directory: every tenant request (tenant, unit, prompt, start and end
            relative to the run's start, the server's prompt/cache/predicted counts, slot, error) and every
            measured request's interval with the tenant requests in flight during it; the manifest's
            `tenants.sent` and `tenants.measured` sum them up (requests, tokens, the share of the measured
            requests' time during which a tenant request was in flight).
Which tenant request lands in which batch with which measured token is timing, not data: it is what the records
measure, never what they assume. Count 0 runs the server as for N tenants with no load (the control).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from artifact import engines
from artifact.config import Config, Plan, build_table, choice
from artifact.errors import ArtifactError

TENANTS_FILE = "tenants.jsonl"
# Recorded in every tenant run's manifest and pairing fingerprint (`identity`, `pairing`): it names this module by
# its former name (artifact/protocol/tenants.py) and stays byte for byte, or committed runs would pair with none.
GENERATOR = "artifact.protocol.tenants v1"
# The synthetic text of "unshared" prompts: words drawn by random.Random(seed) from this list (stable across Python
# versions for an integer seed).
WORDS = (
    "river",
    "stone",
    "garden",
    "window",
    "market",
    "silver",
    "paper",
    "orange",
    "harbor",
    "engine",
    "valley",
    "candle",
    "forest",
    "bridge",
    "winter",
    "copper",
    "meadow",
    "pocket",
    "signal",
    "ladder",
    "island",
    "basket",
    "thunder",
    "violet",
    "canvas",
    "marble",
    "lantern",
    "feather",
    "compass",
    "velvet",
    "quarry",
    "meteor",
)
SEED = 42


@dataclass(frozen=True)
class Spec:
    count: int  # background tenants (0: the server as for tenants, no load: the control)
    prefix: str = choice("shared", "unshared")
    prompts: int = 4  # prompts per measured unit that each tenant loops over
    n_predict: int = 32  # tokens per tenant request


def spec_of(plan: Plan, where: str = "") -> Spec | None:
    """The plan's tenants, validated (one-line errors); None for a plan without them."""
    if not plan.tenants:
        return None
    where = where or f"plan '{plan.name}': tenants"
    spec = build_table(Spec, dict(plan.tenants), where, "tenants.")
    if spec.count < 0 or spec.prompts < 1 or spec.n_predict < 1:
        raise ArtifactError(f"{where}: count must be >= 0, prompts and n_predict >= 1")
    return spec


def synthetic_text(length: int, seed: int) -> str:
    """`length` characters of seeded words (no markup, no special token)."""
    rng, out, n = random.Random(seed), [], 0
    while n < length:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:length]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Pools:
    """The tenants' prompts per measured unit, and what the manifest records about them."""

    spec: Spec
    prompts: list[list[str]]  # per unit index
    identity: dict  # spec, generator, how, per-unit hashes and shared prefixes (manifest and pairing fingerprint)


def prepare(cfg: Config, plan: Plan, workload, prepared) -> Pools | None:
    """The plan's tenant prompts, after checking that the engine can serve tenants (None without tenants)."""
    spec = spec_of(plan)
    if spec is None:
        return None
    engines.check_needs(cfg, plan, {"background_requests": True}, f"plan {plan.name}'s background tenants")
    engine = engines.get(cfg.engine.kind)
    have = engine.slots(cfg, plan)
    if spec.count + 1 > have:
        raise ArtifactError(
            f"plan '{plan.name}' runs {spec.count} tenant(s) beside the measured requests, but its "
            f"{engine.kind} server serves {have} request(s) at a time: give it at least "
            f"{spec.count + 1} slots in the plan's {engine.settings_key} table"
        )
    raw, how = workload.tenant_prompts(cfg, prepared, spec.prompts)
    pools, units = [], []
    for i, (first, prompts) in enumerate(raw):
        common = [len(os.path.commonprefix([first, p])) for p in prompts]
        if spec.prefix == "unshared":
            filler = synthetic_text(max(common, default=0), SEED + i)
            prompts = [filler[:c] + p[c:] for c, p in zip(common, prompts)]
            common = [len(os.path.commonprefix([first, p])) for p in prompts]
        pools.append(prompts)
        units.append(
            {
                "unit": prepared.ids[i],
                "first_prompt_sha256": _sha(first),
                "first_prompt_chars": len(first),
                "prompts_sha256": [_sha(p) for p in prompts],
                "prompt_chars": [len(p) for p in prompts],
                "shared_prefix_chars": common,
            }
        )
    digest = hashlib.sha256(json.dumps([u["prompts_sha256"] for u in units]).encode()).hexdigest()
    identity = {
        "spec": dataclasses.asdict(spec),
        "slots": have,
        "generator": GENERATOR,
        "prompts_made_by": how,
        "unshared_filler": (
            f"synthetic_text(shared prefix length, seed {SEED} + unit index): words of "
            f"random.Random over a fixed list of {len(WORDS)}"
        )
        if spec.prefix == "unshared"
        else None,
        "schedule": "during unit i, tenant j sends prompt (j + c) mod prompts for its c-th request of that unit; "
        "tenants start with the run and have all stopped before it is marked complete",
        "prompts_sha256": digest,
        "units": units,
        "file": TENANTS_FILE,
    }
    return Pools(spec, pools, identity)


def pairing(pools: Pools | None) -> dict | None:
    """What of the load goes into the pairing fingerprint (it may change the measured tokens)."""
    if pools is None:
        return None
    i = pools.identity
    return {"spec": i["spec"], "generator": i["generator"], "prompts_sha256": i["prompts_sha256"]}


class _Timed:
    """The session as the measured requests see it: every completion's interval is noted for the load record."""

    def __init__(self, inner, load: "Load"):
        self._inner, self._load = inner, load

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool):
        t0 = self._load.now()
        with self._load.lock:
            in_flight = len(self._load.in_flight)
        try:
            return self._inner.complete(prompt, n_predict, cache_prompt)
        finally:
            self._load.measured.append(
                {
                    "kind": "measured",
                    "unit": self._load.unit_id,
                    "t_start": t0,
                    "t_end": self._load.now(),
                    "tenants_in_flight_at_start": in_flight,
                }
            )

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Load:
    """The tenants of one run: a context manager around the run's units; `server` is what the units query."""

    def __init__(self, pools: Pools | None, server, run_dir: Path):
        self.pools, self.inner, self.run_dir = pools, server, run_dir
        self.server = server if pools is None else _Timed(server, self)
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.rows: list[dict] = []
        self.measured: list[dict] = []
        self.in_flight: set = set()
        self.unit_index, self.unit_id = 0, None
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def unit(self, index: int, unit_id: str) -> None:
        """The measured run moves to unit `index`: the tenants move to its prompts after their request in flight."""
        self.unit_index, self.unit_id = index, unit_id

    def __enter__(self) -> "Load":
        self.t0 = time.monotonic()
        if self.pools is not None:
            for j in range(self.pools.spec.count):
                t = threading.Thread(target=self._tenant, args=(j,), name=f"tenant-{j}", daemon=True)
                t.start()
                self.threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join()
        if self.pools is not None:
            self._write()

    def _tenant(self, j: int) -> None:
        spec = self.pools.spec
        unit, c = None, 0
        while not self.stop_event.is_set():
            if unit != self.unit_index:
                unit, c = self.unit_index, 0
            pool = self.pools.prompts[unit]
            k = (j + c) % len(pool)
            row = {
                "kind": "tenant",
                "tenant": j,
                "unit": self.pools.identity["units"][unit]["unit"],
                "request": c,
                "prompt": k,
                "prompt_sha256": self.pools.identity["units"][unit]["prompts_sha256"][k],
                "t_start": self.now(),
                "error": None,
            }
            c += 1
            with self.lock:
                self.in_flight.add(j)
            try:
                row.update(self.inner.background(pool[k], spec.n_predict))
            except ArtifactError as exc:
                row["error"] = str(exc)
            finally:
                with self.lock:
                    self.in_flight.discard(j)
            row["t_end"] = self.now()
            self.rows.append(row)
            if row["error"]:
                self.stop_event.wait(1.0)  # a server that refuses: do not spin

    def _write(self) -> None:
        busy = [(r["t_start"], r["t_end"]) for r in self.rows]
        for m in self.measured:
            m["tenant_requests_overlapping"] = sum(a < m["t_end"] and b > m["t_start"] for a, b in busy)
            m["overlap_s"] = round(_covered(busy, m["t_start"], m["t_end"]), 4)
        with open(self.run_dir / TENANTS_FILE, "w", encoding="utf-8") as fh:
            for row in self.rows + self.measured:
                fh.write(json.dumps(row, sort_keys=True) + "\n")

    def manifest(self) -> dict:
        """The manifest's `tenants` at the end of the run: the identity and what the tenants actually sent."""
        if self.pools is None:
            return {}
        ok = [r for r in self.rows if not r["error"]]

        def total(key):
            return sum(r.get(key) or 0 for r in ok)

        per = [
            {
                "tenant": j,
                "requests": sum(r["tenant"] == j for r in self.rows),
                "failed": sum(r["tenant"] == j and bool(r["error"]) for r in self.rows),
            }
            for j in range(self.pools.spec.count)
        ]
        m_time = sum(m["t_end"] - m["t_start"] for m in self.measured)
        covered = sum(m.get("overlap_s", 0.0) for m in self.measured)
        return {
            "tenants": {
                **self.pools.identity,
                "sent": {
                    "requests": len(self.rows),
                    "completed": len(ok),
                    "failed": len(self.rows) - len(ok),
                    "prompt_tokens": total("prompt_tokens"),
                    "cache_n": total("cache_n"),
                    "prompt_n": total("prompt_n"),
                    "predicted_n": total("predicted_n"),
                    "busy_s": round(sum(r["t_end"] - r["t_start"] for r in self.rows), 3),
                    "slots_used": sorted({r["slot"] for r in ok if r.get("slot") is not None}),
                    "per_tenant": per,
                    "first_error": next((r["error"] for r in self.rows if r["error"]), None),
                },
                "measured": {
                    "requests": len(self.measured),
                    "overlapped": sum(m.get("tenant_requests_overlapping", 0) > 0 for m in self.measured),
                    "seconds": round(m_time, 3),
                    "overlap_s": round(covered, 3),
                    "overlap_share": round(covered / m_time, 4) if m_time else None,
                },
            }
        }


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the union of `intervals`."""
    spans = sorted((max(a, lo), min(b, hi)) for a, b in intervals if a < hi and b > lo)
    total, end = 0.0, lo
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total
