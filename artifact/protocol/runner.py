"""The fixed protocol: a plan's arms and runs against one configuration, serial, greedy, seed 42, batch 1.

Runs are grouped into server sessions. With lifecycle "shared" every run of an arm shares one llama-server process
(cache state carries over from run to run: the paper's default condition); with "fresh" each run is its own session.
The session is the unit of resume: if any run of a session is not complete, the whole session runs again (a half
session would start from a different cache state) and the old run directories are moved to `discarded/`, never
deleted. Complete sessions whose fingerprint matches are reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from artifact import provenance
from artifact.config import Config, Plan
from artifact.engines.llama_server import GREEDY, LlamaServer, RequestError
from artifact.engines.models import verified_weights
from artifact.errors import ArtifactError
from artifact.records.store import DISCARDED, MANIFEST, RunWriter, load_run, now_iso
from artifact.workloads import bfcl

PROTOCOL = {"decoding": "greedy", **GREEDY, "n_probs": 2, "batch": 1, "serial": True, "id_slot": 0}


@dataclass(frozen=True)
class RunSpec:
    arm: str
    run: int
    session: str

    @property
    def dirname(self) -> str:
        return f"{self.arm}-run{self.run}"


def sessions(plan: Plan) -> list[list[RunSpec]]:
    if plan.lifecycle == "shared":
        return [[RunSpec(arm, k, arm) for k in range(1, plan.runs + 1)] for arm in plan.arms]
    return [[RunSpec(arm, k, f"{arm}-run{k}")] for arm in plan.arms for k in range(1, plan.runs + 1)]


def with_episodes(cfg: Config, episodes: int | None) -> Config:
    if episodes is None:
        return cfg
    if episodes < 1:
        raise ArtifactError("--episodes must be >= 1")
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, episodes=episodes))


def plan_dir(results: Path, cfg: Config, plan: Plan) -> Path:
    return Path(results) / cfg.name / plan.name


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class RunExecutor:
    """Executes one run on a started server and writes its records."""

    def __init__(self, cfg: Config, plan: Plan, server: LlamaServer, episodes: list[bfcl.Episode], base: dict):
        self.cfg, self.plan, self.server, self.episodes, self.base = cfg, plan, server, episodes, base

    def execute(self, spec: RunSpec, run_dir: Path) -> Path:
        manifest = {
            **self.base,
            "arm": spec.arm, "run": spec.run, "session": spec.session,
            "engine_build": self.server.build_info, "server_cmd": self.server.cmd,
            "server_log": str(self.server.log_path.relative_to(run_dir.parent)),
        }
        writer = RunWriter(run_dir, manifest)
        cache_prompt = spec.arm == "on"
        t0 = time.monotonic()
        log_path = run_dir / "bfcl.log"
        with open(log_path, "w") as log:
            for index, episode in enumerate(self.episodes):
                query = self._query_fn(writer, episode.id, cache_prompt)
                namespace = f"ep_{spec.arm}{spec.run}_{index}"
                result = bfcl.run_episode(
                    episode, self.cfg.chat.handler, namespace, query,
                    prompt_variant=self.cfg.workload.prompt_variant,
                    max_steps_per_turn=self.cfg.workload.max_steps_per_turn, log=log,
                )
                writer.episode({
                    "episode_id": result.id, "index": index, "verdict": result.verdict,
                    "valid": result.verdict == "valid", "n_requests": result.n_requests,
                    "n_turns": result.n_turns, "error": result.error,
                })
                _say(f"  [{spec.arm} run {spec.run}] {index + 1}/{len(self.episodes)} {result.id}: "
                     f"{result.verdict} ({result.n_requests} requests)")
        writer.finish(wall_s=round(time.monotonic() - t0, 3))
        return run_dir

    def _query_fn(self, writer: RunWriter, episode_id: str, cache_prompt: bool):
        server, ctx = self.server, self.cfg.server.ctx_size
        counter = {"i": 0}

        def query(prompt: str, turn: int, step: int):
            record = {
                "episode_id": episode_id, "turn": turn, "step": step, "request_index": counter["i"],
                "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
                "prompt_tokens": None, "output_tokens": [], "output_text": "", "top_logprobs": [],
                "cache_n": 0, "prompt_n": 0, "prompt_ms": 0.0, "predicted_ms": 0.0, "stop_type": None,
                "n_predict": 0, "error": None,
            }
            counter["i"] += 1
            n_prompt = server.count_tokens(prompt)
            record["prompt_tokens"] = n_prompt
            room = ctx - n_prompt - 2
            try:
                if room < 1:
                    raise RequestError(f"prompt of {n_prompt} tokens leaves no room in a {ctx}-token context")
                record["n_predict"] = n_predict = min(self.cfg.workload.n_predict, room)
                resp = server.complete(prompt, n_predict, cache_prompt)
            except RequestError as exc:
                record["error"] = str(exc)
                writer.request(record)
                raise
            t = resp["timings"]
            record.update(
                prompt_tokens=resp.get("tokens_evaluated", n_prompt),
                output_tokens=resp["tokens"], output_text=resp["content"],
                top_logprobs=[[[p["id"], p["logprob"]] for p in pos["top_logprobs"]]
                              for pos in resp.get("completion_probabilities", [])],
                cache_n=t["cache_n"], prompt_n=t["prompt_n"],
                prompt_ms=t["prompt_ms"], predicted_ms=t["predicted_ms"], stop_type=resp.get("stop_type"),
            )
            writer.request(record)
            return resp["content"], record["prompt_tokens"], len(resp["tokens"])

        return query


def _session_state(pdir: Path, session: list[RunSpec], fp: str) -> str:
    """'complete' (all runs complete with this fingerprint), 'absent', or 'partial'."""
    states = []
    for spec in session:
        mf = pdir / spec.dirname / MANIFEST
        if not mf.exists():
            states.append("absent")
            continue
        run = load_run(mf.parent)
        if run.complete and run.manifest.get("fingerprint") != fp:
            raise ArtifactError(
                f"{mf.parent} holds a complete run of a different configuration, plan or episode budget; "
                "choose another --results directory"
            )
        states.append("complete" if run.complete else "partial")
    if all(s == "complete" for s in states):
        return "complete"
    return "absent" if all(s == "absent" for s in states) else "partial"


def _discard(pdir: Path, session: list[RunSpec]) -> None:
    dest = pdir / DISCARDED / now_iso().replace(":", "")
    for spec in session:
        src = pdir / spec.dirname
        if src.exists():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dest / spec.dirname))
            _say(f"  moved unfinished {src.name} to {dest / spec.dirname}")


def manifest_base(cfg: Config, plan: Plan, episode_ids: list[str], fp: str) -> dict:
    """The manifest fields every run of a plan shares (BFCL and the GSM8K bridge alike). Also removes secrets from
    this process's environment: the protocol eval()s model output (BFCL)."""
    isolation = provenance.isolation(provenance.scrub_secrets())
    if isolation["network"] != "loopback-only":
        _say("warning: this protocol run can reach the network (run it through ./run.sh for isolation)")
    return {
        "config": cfg.name, "config_path": cfg.path, "config_data": cfg.as_dict(),
        "engine": cfg.engine.kind, "engine_build_flags": provenance.llama_build(),
        "model": {"family": cfg.model.family, "name": cfg.model.name, "quant": cfg.model.quant,
                  "sha256": cfg.model.sha256, "source": cfg.model.source},
        "lifecycle": plan.lifecycle, "plan": plan.name, "plan_data": plan.as_dict(),
        "workload": cfg.workload.name, "workload_settings": dataclasses.asdict(cfg.workload),
        "prompt_variant": cfg.workload.prompt_variant, "episodes": episode_ids,
        "protocol": PROTOCOL, "fingerprint": fp,
        "host": provenance.host(), "packages": provenance.packages(), "isolation": isolation,
    }


def execute_plan(cfg: Config, plan: Plan, results: Path) -> list[Path]:
    """Run (or resume) every session of `plan`; returns the run directories in plan order."""
    pdir = plan_dir(results, cfg, plan)
    episodes = bfcl.load_episodes(cfg.workload.episodes, cfg.workload.max_turns)
    episode_ids = [e.id for e in episodes]
    fp = provenance.fingerprint(cfg.as_dict(), plan.as_dict(), episode_ids, PROTOCOL)
    base = manifest_base(cfg, plan, episode_ids, fp)
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
             f"(--cache-ram {plan.cache_ram_mib}), {len(episodes)} episodes x {len(session)} runs")
        with LlamaServer(cfg, model_path, plan.cache_ram_mib, log_path) as server:
            executor = RunExecutor(cfg, plan, server, episodes, base)
            for spec in session:
                run_dirs.append(executor.execute(spec, pdir / spec.dirname))
    return run_dirs
