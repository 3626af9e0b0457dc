"""BFCL `multi_turn_base` (the paper's agent workload): episodes through the real, unmodified `bfcl_eval` package.

driver.py          BFCL's own episode loop, prompt builder, decoder, executor and checker, with only the transport ours
oracle.py          ground-truth trajectories of held-out episodes: the embedded agent model's training data
tenant_prompts.py  prompts of background tenants that share the measured episodes' system prompt (held-out questions)
tables.py          how the served model behaved as an agent (tool calls, requests per episode, BFCL's verdicts)

One unit is one episode; a request is one step of it. The arm decides the cache: "off" sends every request with the
cache off, "on" with it on. `bfcl_eval` is imported only when episodes run (reading results never needs it).
"""

from __future__ import annotations

from dataclasses import dataclass

from artifact.config import choice
from artifact.workloads.base import Prepared, Workload, Wording
from artifact.workloads.bfcl.records import record_problem
from artifact.workloads.bfcl import example


@dataclass(frozen=True)
class Settings:
    # BFCL's system prompt variant: "default" (JSON function docs, the paper's) or "python" (func_doc_fmt=python,
    # about 2.4x shorter; BFCL's own format-sensitivity variant).
    prompt_variant: str = choice("default", "python", default="default")
    # BFCL's MAXIMUM_STEP_LIMIT, passed unchanged: BFCL force-quits a turn once more than this many steps have
    # executed, so a turn makes at most max_steps_per_turn + 1 requests.
    max_steps_per_turn: int = 20
    max_turns: int = 0  # 0 = all turns of an episode; >0 = the first N turns (question and ground truth)


class Bfcl(Workload):
    name = "bfcl_multi_turn_base"
    unit = "episode"
    settings_type = Settings
    arms = ("off", "on")
    needs: dict = {}  # any engine that serves an "off" and an "on" arm
    default_plan = "main"
    packages = ("bfcl-eval",)

    def check(self, cfg, plan) -> None:
        from artifact.workloads.bfcl import driver  # lazy: bfcl_eval's import (~1 s); check reads runs without it

        super().check(cfg, plan)
        driver.check_prompt_variant(cfg.chat.handler, self.settings(cfg).prompt_variant)

    def prepare(self, cfg) -> Prepared:
        from artifact.workloads.bfcl import driver  # lazy: bfcl_eval's import (~1 s); check reads runs without it

        s = self.settings(cfg)
        episodes = driver.load_episodes(cfg.workload.episodes, s.max_turns)
        return Prepared(
            units=episodes,
            ids=[e.id for e in episodes],
            identity=driver.data_identity(),
            label=f"{len(episodes)} episodes",
            manifest={"prompt_variant": s.prompt_variant},
        )

    def run_unit(self, cfg, prepared: Prepared, index: int, spec, query, log) -> dict:
        from artifact.workloads.bfcl import driver  # lazy: bfcl_eval's import (~1 s); check reads runs without it

        s = self.settings(cfg)
        episode = prepared.units[index]

        def step(prompt: str, turn: int, step: int):
            rec = query(prompt, turn=turn, step=step, cache_prompt=spec.arm == "on")
            return rec["output_text"], rec["prompt_tokens"], len(rec["output_tokens"])

        result = driver.run_episode(
            episode,
            cfg.chat.handler,
            f"ep_{spec.arm}{spec.run}_{index}",
            step,
            prompt_variant=s.prompt_variant,
            max_steps_per_turn=s.max_steps_per_turn,
            log=log,
        )
        return {
            "episode_id": result.id,
            "index": index,
            "verdict": result.verdict,
            "valid": result.verdict == "valid",
            "n_requests": result.n_requests,
            "n_turns": result.n_turns,
            "error": result.error,
            "steps": result.steps,
        }

    def progress(self, record: dict) -> str:
        return f"{record['verdict']} ({record['n_requests']} requests)"

    def tenant_prompts(self, cfg, prepared: Prepared, n: int):
        # lazy: bfcl_eval (~1 s), only for a plan with tenants
        from artifact.workloads.bfcl.tenant_prompts import tenant_prompts

        return tenant_prompts(prepared.units, cfg.chat.handler, self.settings(cfg).prompt_variant, n)

    table_files = ("agent.csv",)
    # the report's words for it (Tab. 2's heading and validity columns, the divergence example's trajectory)
    wording = Wording(
        title="BFCL multi_turn_base",
        valid_column="BFCL valid",
        harness="BFCL",
        executes_output=True,
    )

    def record_problem(self, run) -> str | None:
        """The verdict against `valid`, the trajectory against the requests (records.py)."""
        return record_problem(run)

    def tables(self, runs: list) -> dict:
        # lazy: pandas (~0.9 s), which a protocol run never needs
        from artifact.workloads.bfcl.tables import agent_table

        return {"agent.csv": agent_table([r for r in runs if r.manifest.get("arm") in self.arms])}

    def report_section(self, runs: list, tables: dict) -> dict | None:
        table = tables.get("agent.csv")
        if table is None or table.empty:
            return None
        return {"template": "bfcl/agent.html.j2", "agent": table.to_dict("records")}

    def divergence_change(self, run_a, run_b, unit_id: str, first_request: int | None) -> str | None:
        """A changed tool call, and with it the result the model saw next (example.py)."""
        return example.divergence_change(run_a, run_b, unit_id, first_request)

    def example_trajectory(self, run, reqs: list, unit_id: str, start: int) -> list[dict]:
        """The calls BFCL decoded from each reply and their results, from the episode record's steps (example.py)."""
        return example.trajectory(run, reqs, unit_id, start)

    def run_columns(self, run) -> dict:
        from artifact.workloads.bfcl.tables import agent_row  # lazy: pandas (~0.9 s), which a protocol run never needs

        a = agent_row(run)
        ok = a["episodes_with_successful_call"]
        return {
            "episodes with a call executed": f"{a['episodes_with_tool_call']}/{a['episodes']}",
            "with a call that returned no error": "not recorded" if ok is None else f"{ok}/{a['episodes']}",
        }


WORKLOAD = Bfcl()
