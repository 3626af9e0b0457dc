"""The agent model's training data: oracle trajectories of BFCL's held-out `multi_turn_base` episodes.

The protocol evaluates the first 80 episodes by numeric id (`multi_turn_base_0` .. `_79`); ids 80-199 are never
evaluated and are the only data the adapter sees. The other multi-turn categories (miss_func, miss_param,
long_context, composite) are derived from the same conversations and are never read.

Each episode runs through BFCL's own episode loop (`driver.run_episode`: BFCL's prompt builder for the
configured chat format and prompt variant, its decoder and its executor) with an oracle transport that answers each
turn with the ground-truth calls and then a closing reply (`bfcl.oracle_query`). Every (prompt, reply) the loop
produces is one training pair: the prompt is exactly the text the served model would receive at that step, tool
results included; the loss is on the reply only (`artifact.models.train`).

    python -m artifact.workloads.bfcl.oracle OUT.jsonl      # writes the pairs and OUT.jsonl.json (provenance)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from pathlib import Path

from artifact.workloads.bfcl import driver as bfcl

EVALUATED = 80  # the protocol's episodes: the first 80 by numeric id, never trained on
TOTAL = 200  # multi_turn_base holds 200 episodes
HANDLER = "qwen"  # SmolLM2 speaks ChatML, which BFCL's QwenHandler formats
PROMPT_VARIANT = "python"  # the variant every SmolLM2 configuration runs (the default prompts overflow 8192 tokens)


def held_out_episodes() -> list[bfcl.Episode]:
    episodes = bfcl.load_episodes(TOTAL - EVALUATED, start=EVALUATED)
    ids = [e.id for e in episodes]
    expected = [f"multi_turn_base_{i}" for i in range(EVALUATED, TOTAL)]
    if ids != expected:  # never let an evaluated episode into the training data
        raise SystemExit(f"error: held-out episodes are not {expected[0]}..{expected[-1]} (got {ids[:3]}...)")
    return episodes


def oracle_pairs(episodes: list[bfcl.Episode]) -> tuple[list[dict], dict]:
    """The training pairs, and BFCL's verdict on each oracle trajectory (its checker rejects a few ground-truth
    trajectories of its own, e.g. multi_turn_base_80: `execution_response_mismatch`; they are kept, since their
    calls are BFCL's ground truth, and counted in the provenance)."""
    pairs, verdicts = [], {}
    for i, episode in enumerate(episodes):
        seen: list = []
        result = bfcl.run_episode(
            episode,
            HANDLER,
            f"oracle_{i}",
            bfcl.oracle_query(episode, seen=seen),
            prompt_variant=PROMPT_VARIANT,
            max_steps_per_turn=bfcl.BFCL_STEP_LIMIT,
            log=io.StringIO(),
        )
        verdicts[episode.id] = result.verdict
        pairs += [{"episode_id": episode.id, "turn": t, "step": s, "prompt": p, "reply": r} for t, s, p, r in seen]
    return pairs, verdicts


def write(out: Path) -> dict:
    pairs, verdicts = oracle_pairs(held_out_episodes())
    text = "".join(json.dumps(p, ensure_ascii=False, sort_keys=True) + "\n" for p in pairs)
    out.write_text(text, encoding="utf-8")
    record = {
        "file": out.name,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "pairs": len(pairs),
        "episodes": f"multi_turn_base_{EVALUATED}..multi_turn_base_{TOTAL - 1} (held out; the protocol evaluates "
        f"the first {EVALUATED})",
        "category": bfcl.CATEGORY,
        "handler": HANDLER,
        "prompt_variant": PROMPT_VARIANT,
        "closing_reply": bfcl.ORACLE_CLOSING_REPLY,
        "bfcl": bfcl.data_identity(),
        "oracle_valid": sum(v == "valid" for v in verdicts.values()),
        "oracle_not_valid": {k: v for k, v in verdicts.items() if v != "valid"},
        "how": "BFCL's own episode loop, prompt builder, decoder and executor with the ground-truth calls as the "
        "model's reply at step 0 of each turn and the closing reply at step 1 (artifact.workloads.bfcl.oracle)",
    }
    Path(f"{out}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m artifact.workloads.bfcl.oracle", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="output JSONL file")
    record = write(p.parse_args(argv).out)
    print(f"{record['pairs']} pairs, sha256 {record['sha256']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
