"""The GSM8K bridge protocol (RQ5, Tab. 3): every item served four times on one llama-server session.

Per item, in order: cold1 and cold2 with cache_prompt false (full recomputation), then warm1 and warm2 with
cache_prompt true; the prompt is then already in the slot (cold2 left it there), so both warm servings reuse its
KV. Each serving's cache use is verified from the server's own `timings.cache_n` (cold: 0; warm: at least
prompt_tokens - 1); a serving that breaks this is flagged in its record (`cache_check`), and the table counts it as
flagged instead of as a cold or warm observation.

Everything else is shared with the BFCL protocol: the same greedy request (`protocol.requests`, so
requests.jsonl has the same fields), the same base manifest, fingerprint, session/resume rules and directory
layout (`protocol.sessions`: an incomplete run is moved to `discarded/` and the session re-runs whole):
`<results>/<config>/<plan>/bridge-run1`.
"""

from __future__ import annotations

import time
from pathlib import Path

from artifact.analysis.gsm8k_scoring import ANSWER_INSTRUCTION, score_numeric, score_strict
from artifact.config import Config, Plan
from artifact.engines.base import EngineSession, RequestError
from artifact.errors import ArtifactError
from artifact.protocol.requests import new_record, send
from artifact.protocol.sessions import RunSpec, fingerprints, manifest_base, open_run, run_sessions, say
from artifact.workloads import gsm8k
from artifact.workloads.gsm8k_data import GSM8KItem

BRIDGE_ARM = "bridge"
BRIDGE_PROTOCOL = {
    "servings": [{"serving": s, "cache_prompt": c} for s, c in gsm8k.SERVINGS],
    "cache_check": {"cold": "cache_n == 0", "warm": "cache_n >= prompt_tokens - 1"},
    "answer_instruction": ANSWER_INSTRUCTION,
    "prompt": "one user message: question + '\\n\\n' + answer_instruction, chat.handler's _format_prompt",
}


def _score(record: dict, reference: str) -> dict:
    text = record.get("output_text")
    strict, numeric = score_strict(text, reference), score_numeric(text, reference)
    return {
        "extracted_strict": strict.extracted, "strict_correct": strict.correct,
        "extracted_numeric": numeric.extracted, "numeric_correct": numeric.correct, "numeric_rule": numeric.rule,
        "cache_check": record["cache_check"], "stop_type": record.get("stop_type"),
        "n_output_tokens": len(record.get("output_tokens") or []),
    }


class BridgeExecutor:
    """Serves every item four times on a started server and writes one run's records."""

    def __init__(self, cfg: Config, server: EngineSession, items: list[GSM8KItem], base: dict):
        self.cfg, self.server, self.items, self.base = cfg, server, items, base

    def serve(self, item: GSM8KItem, prompt: str, index: int, serving: str, cache_prompt: bool, write) -> dict:
        """One serving: the shared request path, tagged with the item and serving, plus its cache check."""
        record = {**new_record(item.item_id, 0, 0, index, prompt), "item_id": item.item_id, "serving": serving}

        def checked_write(rec: dict) -> None:
            rec["cache_check"] = (f"request failed: {rec['error']}" if rec["error"] is not None
                                  else gsm8k.cache_check(serving, rec["cache_n"], rec["prompt_tokens"]))
            write(rec)

        try:
            send(self.server, self.cfg, prompt, cache_prompt, record, checked_write)
        except RequestError:
            pass  # recorded, and flagged through its cache_check
        return record

    def execute(self, spec: RunSpec, run_dir: Path) -> Path:
        writer = open_run(self.base, spec, self.server, run_dir)
        flagged = 0
        t0 = time.monotonic()
        for index, item in enumerate(self.items):
            prompt = gsm8k.build_prompt(item, self.cfg.chat.handler)
            records = {serving: self.serve(item, prompt, i, serving, cache_prompt, writer.request)
                       for i, (serving, cache_prompt) in enumerate(gsm8k.SERVINGS)}
            servings = {s: _score(r, item.answer) for s, r in records.items()}
            bad = [s for s, v in servings.items() if v["cache_check"] != "ok"]
            errors = [f"{s}: {r['error']}" for s, r in records.items() if r["error"] is not None]
            flagged += len(bad)
            writer.episode({
                "episode_id": item.item_id, "item_id": item.item_id, "index": index, "source": item.source,
                "reference": item.answer, "n_requests": len(servings), "servings": servings,
                "flagged_servings": bad, "error": "; ".join(errors) or None,
            })
            c1, w1 = servings["cold1"], servings["warm1"]
            say(f"  [bridge run {spec.run}] {index + 1}/{len(self.items)} {item.item_id}: "
                f"ref {item.answer}, cold1 {c1['extracted_numeric']} warm1 {w1['extracted_numeric']}"
                + (f", FLAGGED {', '.join(bad)}" if bad else ""))
        writer.finish(wall_s=round(time.monotonic() - t0, 3), flagged_servings=flagged)
        return run_dir


def execute_bridge(cfg: Config, plan: Plan, results: Path) -> list[Path]:
    """Run (or resume) the GSM8K bridge plan for one configuration; returns its run directories in plan order."""
    if cfg.workload.name != "gsm8k":
        raise ArtifactError(f"{cfg.name}: workload.name is {cfg.workload.name!r}; the bridge needs 'gsm8k'")
    if tuple(plan.arms) != (BRIDGE_ARM,):
        raise ArtifactError(f"plan '{plan.name}' has arms {list(plan.arms)}; a GSM8K configuration runs a plan "
                            f"whose only arm is '{BRIDGE_ARM}' (e.g. plan 'bridge')")
    cfg = plan.apply(cfg)
    items, items_provenance = gsm8k.load_items(cfg)
    gsm8k.build_prompt(items[0], cfg.chat.handler)  # an unusable chat handler fails before the server starts
    item_ids = [i.item_id for i in items]
    fps = fingerprints(cfg, plan, item_ids, {"items_sha256": items_provenance["items_sha256"],
                                             "bridge_protocol": BRIDGE_PROTOCOL})
    base = {
        **manifest_base(cfg, plan, item_ids, fps),
        "items_source": cfg.workload.gsm8k_source, "items_provenance": items_provenance,
        "data": items_provenance["data"], "bridge_protocol": BRIDGE_PROTOCOL, "chat_handler": cfg.chat.handler,
    }
    units = f"{len(items)} {items_provenance['data']} items x 4 servings"
    return run_sessions(cfg, plan, results, fps.resume, units, lambda server: BridgeExecutor(cfg, server, items, base))
