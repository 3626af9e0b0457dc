"""Prompts for background tenants (artifact/protocol/background_tenants.py) that share the measured episodes' prefix.

For each measured episode, `n` prompts made by BFCL's own prompt builder (the configured handler and prompt
variant): the episode's own system prompt and function docs, with the first question of a held-out episode
(`multi_turn_base_80` .. `_199`, which the protocol never evaluates; the k-th prompt of unit i takes held-out
episode 80 + (i * n + k) mod 120). A tenant sending them is another user of the same agent application: its
prompts share the measured episode's whole system prompt, and only the question differs. The first prompt of each
measured episode (what its step 0 sends, whatever the model replies) is built the same way, so the shared prefix
is known before anything runs.
"""

from __future__ import annotations

import io

from artifact.workloads.bfcl import driver
from artifact.workloads.bfcl.oracle import EVALUATED, TOTAL

HELD_OUT = TOTAL - EVALUATED


def first_prompt(entry: dict, handler: str, variant: str, namespace: str) -> str:
    """The prompt BFCL's loop sends at turn 0, step 0 of `entry` (its first question only)."""
    seen: list[str] = []

    def silent(prompt: str, turn: int, step: int):  # no call: the turn (and the one-turn episode) ends
        seen.append(prompt)
        return driver.ORACLE_CLOSING_REPLY, 0, 0

    one_turn = driver.Episode({**entry, "question": entry["question"][:1]}, [[]])
    driver.run_episode(
        one_turn, handler, namespace, silent, prompt_variant=variant, max_steps_per_turn=1, log=io.StringIO()
    )
    return seen[0]


def tenant_prompts(units: list, handler: str, variant: str, n: int) -> tuple[list[tuple[str, list[str]]], str]:
    held_out = driver.load_episodes(HELD_OUT, max_turns=1, start=EVALUATED)
    pools = []
    for i, episode in enumerate(units):
        first = first_prompt(episode.entry, handler, variant, f"tenant_first_{i}")
        prompts = []
        for k in range(n):
            other = held_out[(i * n + k) % HELD_OUT]
            entry = {**episode.entry, "question": [other.entry["question"][0]]}
            prompts.append(first_prompt(entry, handler, variant, f"tenant_{i}_{k}"))
        pools.append((first, prompts))
    # `how` is recorded in the manifest's tenants identity: it names this module by its former name
    # (artifact.workloads.bfcl.tenants) and stays byte for byte, as committed evidence records it.
    how = (
        f"BFCL's prompt builder (handler {handler}, prompt variant {variant}): each measured episode's system "
        f"prompt and function docs with the first question of held-out episode multi_turn_base_"
        f"{EVALUATED} + (unit * {n} + k) mod {HELD_OUT} (never evaluated), artifact.workloads.bfcl.tenants"
    )
    return pools, how
