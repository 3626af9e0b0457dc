"""The GSM8K bridge (RQ5, Tab. 3): every item served four times on one server session.

prompts.py  items (synthetic or the pinned test split), the prompt, the four servings and their cache check
data.py     the GSM8K test split from the Hub (pinned), a local copy, and a deterministic synthetic stand-in
scoring.py  the strict and the numeric scorer
table.py    Tab. 3 (per configuration and pooled), and tab3.html.j2 its section of the report

One unit is one item. Per item, in order: cold1 and cold2 with the cache off (full recomputation), then warm1 and
warm2 with it on; the prompt is then already in the slot (cold2 left it there), so both warm servings reuse its KV.
Each serving's cache use is verified from the server's own count of cached prompt tokens (cold: 0; warm: at least
prompt_tokens - 1); a serving that breaks this is flagged in its record (`cache_check`), and the table counts it as
flagged instead of as a cold or warm observation. The servings switch the cache per request, so the engine must
have that capability (`per_request_cache_switch`); the plan's single arm is "bridge".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from artifact.config import choice
from artifact.workloads.base import CacheBridge, Prepared, Workload
from artifact.workloads.gsm8k import prompts
from artifact.workloads.gsm8k.scoring import ANSWER_INSTRUCTION, score_numeric, score_strict
from artifact.engines.base import RequestError
from artifact.workloads.gsm8k.records import record_problem
from artifact.workloads.gsm8k.data import load_gsm8k

BRIDGE_ARM = "bridge"


@dataclass(frozen=True)
class Settings:
    # "bundled" (the test split the artifact carries, data/gsm8k/), "hub" (openai/gsm8k at its pinned revision) or
    # "synthetic" (our deterministic generator: for tests, labelled synthetic everywhere)
    gsm8k_source: str = choice("bundled", "hub", "synthetic", default="bundled")


def bridge_protocol() -> dict:
    return {
        "servings": [{"serving": s, "cache_prompt": c} for s, c in prompts.SERVINGS],
        "cache_check": {"cold": "cache_n == 0", "warm": "cache_n >= prompt_tokens - 1"},
        "answer_instruction": ANSWER_INSTRUCTION,
        "prompt": "one user message: question + '\\n\\n' + answer_instruction, chat.handler's _format_prompt",
    }


def _score(record: dict, reference: str) -> dict:
    text = record.get("output_text")
    strict, numeric = score_strict(text, reference), score_numeric(text, reference)
    return {
        "extracted_strict": strict.extracted,
        "strict_correct": strict.correct,
        "extracted_numeric": numeric.extracted,
        "numeric_correct": numeric.correct,
        "numeric_rule": numeric.rule,
        "cache_check": record["cache_check"],
        "stop_type": record.get("stop_type"),
        "n_output_tokens": len(record.get("output_tokens") or []),
    }


class Gsm8k(Workload):
    name = "gsm8k"
    unit = "item"
    settings_type = Settings
    arms = (BRIDGE_ARM,)
    needs = {"per_request_cache_switch": True}
    default_plan = "bridge"

    def check(self, cfg, plan) -> None:
        super().check(cfg, plan)
        prompts.check_handler(cfg.chat.handler)

    def prepare(self, cfg) -> Prepared:
        source = self.settings(cfg).gsm8k_source
        items, provenance = prompts.load_items(cfg.workload.episodes, source)
        protocol = bridge_protocol()
        return Prepared(
            units=items,
            ids=[i.item_id for i in items],
            identity={"items_sha256": provenance["items_sha256"], "bridge_protocol": protocol},
            label=f"{len(items)} {provenance['data']} items x 4 servings",
            manifest={
                "items_source": source,
                "items_provenance": provenance,
                "data": provenance["data"],
                "bridge_protocol": protocol,
                "chat_handler": cfg.chat.handler,
            },
        )

    def run_unit(self, cfg, prepared: Prepared, index: int, spec, query, log) -> dict:
        item = prepared.units[index]
        prompt = prompts.build_prompt(item, cfg.chat.handler)
        records = {}
        for serving, cache_prompt in prompts.SERVINGS:

            def annotate(rec: dict, serving=serving) -> None:
                rec["cache_check"] = (
                    f"request failed: {rec['error']}"
                    if rec["error"] is not None
                    else prompts.cache_check(serving, rec["cache_n"], rec["prompt_tokens"])
                )

            try:
                records[serving] = query(
                    prompt,
                    cache_prompt=cache_prompt,
                    tags={"item_id": item.item_id, "serving": serving},
                    annotate=annotate,
                )
            except RequestError as exc:
                records[serving] = exc.record  # recorded, and flagged through its cache_check
        servings = {s: _score(r, item.answer) for s, r in records.items()}
        bad = [s for s, v in servings.items() if v["cache_check"] != "ok"]
        errors = [f"{s}: {r['error']}" for s, r in records.items() if r["error"] is not None]
        return {
            "episode_id": item.item_id,
            "item_id": item.item_id,
            "index": index,
            "source": item.source,
            "reference": item.answer,
            "n_requests": len(servings),
            "servings": servings,
            "flagged_servings": bad,
            "error": "; ".join(errors) or None,
        }

    def progress(self, record: dict) -> str:
        s = record["servings"]
        bad = record["flagged_servings"]
        return (
            f"ref {record['reference']}, cold1 {s['cold1']['extracted_numeric']} "
            f"warm1 {s['warm1']['extracted_numeric']}" + (f", FLAGGED {', '.join(bad)}" if bad else "")
        )

    def finish(self, records: list[dict]) -> dict:
        return {"flagged_servings": sum(len(r["flagged_servings"]) for r in records)}

    table_files = ("tab3.csv",)

    @property
    def cache_bridge(self) -> CacheBridge:
        """Tab. 3 (table.py) is the table RQ5 judges; rows of the paper's GSM8K items are its evidence."""
        return CacheBridge("tab3.csv", "gsm8k", prompts.NET_SHIFT, len(prompts.SERVINGS))

    def record_problem(self, run) -> str | None:
        """Each item's own source against the manifest's labels of the data (records.py)."""
        return record_problem(run)

    def tables(self, runs: list) -> dict:
        # lazy: pandas (~0.9 s), which a protocol run never needs
        from artifact.workloads.gsm8k.table import is_bridge_run, tab3

        bridge = [r for r in runs if is_bridge_run(r)]
        return {"tab3.csv": tab3(bridge)} if bridge else {}

    def summary(self, runs: list, tables: dict) -> list[str]:
        table = tables.get("tab3.csv")
        if table is None:
            return []
        cols = [
            c
            for c in (
                "config",
                "data",
                "N",
                "identical_cold1_cold2",
                "identical_warm1_warm2",
                "identical_cold1_warm1",
                "acc_cold_numeric",
                "acc_warm_numeric",
                "flips_numeric",
                "mcnemar_p",
                "flagged_servings",
            )
            if c in table.columns
        ]
        return [
            "== GSM8K bridge (Tab. 3): cold 1, cold 2 (cache_prompt=false), warm 1, warm 2 (cache hits); "
            "identical_X_Y: items whose servings X and Y generated the same token ids, of N",
            table[cols].to_string(index=False),
            "",
        ]

    def report_section(self, runs: list, tables: dict) -> dict | None:
        # lazy: pandas (~0.9 s), which a protocol run never needs
        from artifact.workloads.gsm8k.table import report_rows

        table = tables.get("tab3.csv")
        return None if table is None else {"template": "gsm8k/tab3.html.j2", "tab3": report_rows(table)}

    def fetch(self, cfgs: list) -> None:
        if any(c.workload.name == self.name and self.settings(c).gsm8k_source == "hub" for c in cfgs):
            _, prov = load_gsm8k(1)
            print(
                f"fetch: GSM8K {prov.get('repo')}@{prov.get('revision', '')[:12]} cached (sha256 verified)", flush=True
            )

    def container_mounts(self, cfg, hf_cache) -> dict[str, str]:
        """The pinned test split's Hub cache folder when the items come from the Hub (and it has been fetched)."""
        if hf_cache is None or self.settings(cfg).gsm8k_source != "hub":
            return {}
        folder = Path(hf_cache) / "datasets--openai--gsm8k"
        return {str(folder.resolve()): "/hf-cache/datasets--openai--gsm8k"} if folder.is_dir() else {}


WORKLOAD = Gsm8k()
