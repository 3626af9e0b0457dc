"""The GSM8K bridge protocol (RQ5, Tab. 3): every item served four times on one llama-server session.

Per item, in order: cold1 and cold2 with cache_prompt false (full recomputation), then warm1 and warm2 with
cache_prompt true; the prompt is then already in the slot (cold2 left it there), so both warm servings reuse its
KV. Each serving's cache use is verified from the server's own `timings.cache_n` (cold: 0; warm: at least
prompt_tokens - 1); a serving that breaks this is flagged in its record (`cache_check`), and the table counts it as
flagged instead of as a cold or warm observation.

Everything else is the BFCL protocol's: the same greedy request (LlamaServer.complete through the BFCL runner's
request path, so requests.jsonl has the same fields), the same base manifest, fingerprint, session/resume rules
(an incomplete run is moved to `discarded/` and the session re-runs whole) and directory layout:
`<results>/<config>/<plan>/bridge-run1`.
"""

from __future__ import annotations

import time
from pathlib import Path

from artifact import provenance
from artifact.analysis.gsm8k_scoring import ANSWER_INSTRUCTION, score_numeric, score_strict
from artifact.config import Config, Plan
from artifact.engines.llama_server import LlamaServer, RequestError
from artifact.engines.models import verified_weights
from artifact.errors import ArtifactError
from artifact.protocol.runner import (
    PROTOCOL, RunExecutor, RunSpec, _discard, _say, _session_state, manifest_base, plan_dir, sessions,
)
from artifact.records.store import RunWriter, now_iso
from artifact.workloads import gsm8k
from artifact.workloads.gsm8k_data import GSM8KItem

BRIDGE_ARM = "bridge"
BRIDGE_PROTOCOL = {
    "servings": [{"serving": s, "cache_prompt": c} for s, c in gsm8k.SERVINGS],
    "cache_check": {"cold": "cache_n == 0", "warm": "cache_n >= prompt_tokens - 1"},
    "answer_instruction": ANSWER_INSTRUCTION,
    "prompt": "one user message: question + '\\n\\n' + answer_instruction, chat.handler's _format_prompt",
}


class _ServingWriter:
    """Stands in for the RunWriter in the BFCL runner's request path: tags each record with the item and the
    serving, numbers it within the item, adds the cache check, then writes it through the real writer."""

    def __init__(self, writer: RunWriter):
        self.writer = writer
        self.item_id = ""
        self.serving = ""
        self.request_index = 0
        self.last: dict | None = None

    def request(self, record: dict) -> None:
        record.update(item_id=self.item_id, episode_id=self.item_id, serving=self.serving,
                      request_index=self.request_index)
        if record.get("error") is not None:
            record["cache_check"] = f"request failed: {record['error']}"
        else:
            record["cache_check"] = gsm8k.cache_check(self.serving, record["cache_n"], record["prompt_tokens"])
        self.writer.request(record)
        self.last = record


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

    def __init__(self, cfg: Config, plan: Plan, server: LlamaServer, items: list[GSM8KItem], base: dict):
        self.cfg, self.plan, self.server, self.items, self.base = cfg, plan, server, items, base
        # The BFCL runner's request path (record fields, n_predict cap, greedy request); its episode list is unused.
        self.requests = RunExecutor(cfg, plan, server, [], base)

    def execute(self, spec: RunSpec, run_dir: Path) -> Path:
        manifest = {
            **self.base,
            "arm": spec.arm, "run": spec.run, "session": spec.session,
            "engine_build": self.server.build_info, "server_cmd": self.server.cmd,
            "server_log": str(self.server.log_path.relative_to(run_dir.parent)),
        }
        writer = RunWriter(run_dir, manifest)
        tagger = _ServingWriter(writer)
        flagged = 0
        t0 = time.monotonic()
        for index, item in enumerate(self.items):
            prompt = gsm8k.build_prompt(item, self.cfg.chat.handler)
            tagger.item_id = item.item_id
            servings, errors = {}, []
            for request_index, (serving, cache_prompt) in enumerate(gsm8k.SERVINGS):
                tagger.serving, tagger.request_index, tagger.last = serving, request_index, None
                query = self.requests._query_fn(tagger, item.item_id, cache_prompt)
                try:
                    query(prompt, 0, 0)
                except RequestError as exc:  # recorded (error + cache_check) by the request path; flagged below
                    errors.append(f"{serving}: {exc}")
                servings[serving] = _score(tagger.last, item.answer)
            bad = [s for s, v in servings.items() if v["cache_check"] != "ok"]
            flagged += len(bad)
            writer.episode({
                "episode_id": item.item_id, "item_id": item.item_id, "index": index, "source": item.source,
                "reference": item.answer, "n_requests": len(servings), "servings": servings,
                "flagged_servings": bad, "error": "; ".join(errors) or None,
            })
            c1, w1 = servings["cold1"], servings["warm1"]
            _say(f"  [bridge run {spec.run}] {index + 1}/{len(self.items)} {item.item_id}: "
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
    pdir = plan_dir(results, cfg, plan)
    items, items_provenance = gsm8k.load_items(cfg)
    gsm8k.build_prompt(items[0], cfg.chat.handler)  # an unusable chat handler fails before the server starts
    item_ids = [i.item_id for i in items]
    fp = provenance.fingerprint(cfg.as_dict(), plan.as_dict(), item_ids, PROTOCOL, BRIDGE_PROTOCOL,
                                items_provenance["items_sha256"])
    base = {
        **manifest_base(cfg, plan, item_ids, fp),
        "items_source": cfg.workload.gsm8k_source, "items_provenance": items_provenance,
        "data": items_provenance["data"], "bridge_protocol": BRIDGE_PROTOCOL, "chat_handler": cfg.chat.handler,
    }
    run_dirs = []
    for session in sessions(plan):
        state = _session_state(pdir, session, fp)
        if state == "complete":
            _say(f"[{cfg.name}/{plan.name}] session {session[0].session}: complete, reusing")
            run_dirs += [pdir / s.dirname for s in session]
            continue
        if state == "partial":
            _discard(pdir, session)
        model_path = verified_weights(cfg.model)  # sha256 checked before every server start
        log_path = pdir / "logs" / f"server-{session[0].session}-{now_iso().replace(':', '')}.log"
        _say(f"[{cfg.name}/{plan.name}] session {session[0].session}: starting llama-server "
             f"(--cache-ram {plan.cache_ram_mib}), {len(items)} {items_provenance['data']} items x 4 servings "
             f"x {len(session)} runs")
        with LlamaServer(cfg, model_path, plan.cache_ram_mib, log_path) as server:
            executor = BridgeExecutor(cfg, plan, server, items, base)
            for spec in session:
                run_dirs.append(executor.execute(spec, pdir / spec.dirname))
    return run_dirs
