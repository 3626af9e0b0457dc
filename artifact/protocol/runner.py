"""The BFCL protocol: a plan's arms and runs against one configuration, serial, greedy, seed 42, batch 1.

Every episode runs through BFCL's own episode loop (`workloads.bfcl`); every request goes through the shared request
path (`protocol.requests`); sessions, resume and manifests are shared with the GSM8K bridge (`protocol.sessions`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from artifact.config import Config, Plan
from artifact.engines.base import EngineSession
from artifact.errors import ArtifactError
from artifact.protocol.requests import new_record, send
from artifact.protocol.sessions import RunSpec, fingerprints, manifest_base, open_run, run_sessions, say
from artifact.records.store import RunWriter
from artifact.workloads import bfcl


def with_episodes(cfg: Config, episodes: int | None) -> Config:
    if episodes is None:
        return cfg
    if episodes < 1:
        raise ArtifactError("--episodes must be >= 1")
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, episodes=episodes))


class RunExecutor:
    """Executes one BFCL run on a started server and writes its records."""

    def __init__(self, cfg: Config, server: EngineSession, episodes: list[bfcl.Episode], base: dict):
        self.cfg, self.server, self.episodes, self.base = cfg, server, episodes, base

    def execute(self, spec: RunSpec, run_dir: Path) -> Path:
        writer = open_run(self.base, spec, self.server, run_dir)
        t0 = time.monotonic()
        with open(run_dir / "bfcl.log", "w") as log:
            for index, episode in enumerate(self.episodes):
                result = bfcl.run_episode(
                    episode, self.cfg.chat.handler, f"ep_{spec.arm}{spec.run}_{index}",
                    self.query_fn(writer, episode.id, cache_prompt=spec.arm == "on"),
                    prompt_variant=self.cfg.workload.prompt_variant,
                    max_steps_per_turn=self.cfg.workload.max_steps_per_turn, log=log,
                )
                writer.episode({
                    "episode_id": result.id, "index": index, "verdict": result.verdict,
                    "valid": result.verdict == "valid", "n_requests": result.n_requests,
                    "n_turns": result.n_turns, "error": result.error, "steps": result.steps,
                })
                say(f"  [{spec.arm} run {spec.run}] {index + 1}/{len(self.episodes)} {result.id}: "
                    f"{result.verdict} ({result.n_requests} requests)")
        writer.finish(wall_s=round(time.monotonic() - t0, 3))
        return run_dir

    def query_fn(self, writer: RunWriter, episode_id: str, cache_prompt: bool) -> bfcl.QueryFn:
        """The transport BFCL's handler calls: one recorded request per step."""
        count = 0

        def query(prompt: str, turn: int, step: int):
            nonlocal count
            record = new_record(episode_id, turn, step, count, prompt)
            count += 1
            record = send(self.server, self.cfg, prompt, cache_prompt, record, writer.request)
            return record["output_text"], record["prompt_tokens"], len(record["output_tokens"])

        return query


def execute_plan(cfg: Config, plan: Plan, results: Path) -> list[Path]:
    """Run (or resume) every session of `plan`; returns the run directories in plan order."""
    if cfg.workload.name != "bfcl_multi_turn_base":
        raise ArtifactError(f"{cfg.name}: workload.name is {cfg.workload.name!r}; plan '{plan.name}' runs BFCL")
    if "bridge" in plan.arms:
        raise ArtifactError(f"plan '{plan.name}' is the GSM8K bridge; a BFCL configuration runs main, cram0, fresh, ...")
    cfg = plan.apply(cfg)
    bfcl.check_prompt_variant(cfg.chat.handler, cfg.workload.prompt_variant)
    episodes = bfcl.load_episodes(cfg.workload.episodes, cfg.workload.max_turns)
    episode_ids = [e.id for e in episodes]
    fps = fingerprints(cfg, plan, episode_ids, bfcl.data_identity())
    base = manifest_base(cfg, plan, episode_ids, fps)
    return run_sessions(cfg, plan, results, fps.resume, f"{len(episodes)} episodes",
                        lambda server: RunExecutor(cfg, server, episodes, base))
