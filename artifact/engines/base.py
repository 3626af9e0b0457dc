"""The one small interface every serving engine satisfies; the protocol never asks which engine runs.

An engine adapter (`Engine`, one package under `artifact/engines/`, registered in `artifact.engines.REGISTRY`)
declares what it can do (`Capabilities`), validates its own settings (`[engine.settings]` of a configuration, and
the plan's table named after it, e.g. `llama_cpp = {...}` in configs/plans.toml), says what produces its tokens
before anything starts (`identity`), describes each arm's cache condition in words, and opens sessions.

An engine session is one server process for one arm's runs (the protocol's unit of server lifecycle). It starts
bound to 127.0.0.1 with a clean environment, records its full command line and log, answers one greedy completion
at a time, and reports its provenance.

Failure kinds, kept apart because they are scored differently:
  RequestError   the request itself cannot be served (a prompt that does not fit the context): recorded in the
                 request's `error`; the workload decides what it means for its unit (an agent episode ends);
  ArtifactError  anything else (the server died or stopped answering, HTTP 5xx, a malformed response, a full disk):
                 fatal for the run, which stays incomplete and is re-run whole on resume.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from artifact.config import REPO, Config, Plan, build_table
from artifact.errors import ArtifactError

# Greedy decoding stated explicitly (the same values on every engine; each adapter sends its own field names).
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 42}
TOP_N = 2  # log-probabilities recorded per generated position (top-2 margins)


class RequestError(Exception):
    """A request the server cannot serve (a prompt that does not fit the context); recorded in the request's
    `error` field, with the prompt length when the engine reports it."""

    def __init__(self, message: str, prompt_tokens: int | None = None):
        super().__init__(message)
        self.prompt_tokens = prompt_tokens


@dataclass
class Completion:
    """One greedy completion, in engine-neutral form (the fields of a request record)."""

    tokens: list[int]
    text: str
    top_logprobs: list[list[list[Any]]]  # per generated position: [[token id, logprob], ...] best first
    prompt_tokens: int
    cache_n: int | None  # prompt tokens served from cache; None = the engine did not report it
    prompt_n: int | None  # prompt tokens computed
    prompt_ms: float | None
    predicted_ms: float | None
    stop_type: str | None
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific evidence, recorded as `engine_extra`


class EngineSession(Protocol):
    kind: str
    cmd: list[str]
    log_path: Path

    def start(self) -> "EngineSession": ...

    def stop(self) -> None: ...

    def __enter__(self) -> "EngineSession": ...

    def __exit__(self, *exc: object) -> None: ...

    def count_tokens(self, prompt: str) -> int: ...

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool) -> Completion: ...

    def provenance(self) -> dict[str, Any]:
        """What the running server reports about itself (build, version, props), for the run manifest."""
        ...

    # Only where the engine's capabilities declare `background_requests`:
    # def background(self, prompt: str, n_predict: int) -> dict:
    #     """One request of a background tenant, on its own connection, concurrent with the measured ones: the
    #     server's own slot choice and cache use (as a plain client), greedy; returns what the server reported
    #     (prompt_n, cache_n, predicted_n, slot, prompt_ms, predicted_ms) or raises ArtifactError."""


@dataclass(frozen=True)
class Tier:
    """Where one request's cached prompt prefix came from, as its engine can tell from its own evidence."""

    tier: str  # "none", one of the engine's `cache_tiers`, "<a>_or_<b>" when the evidence allows both, "unknown"
    certain: bool
    evidence: str  # why, in one line


# What an engine can observe of the server its sessions talk to (`Engine.observes`, recorded in every manifest as
# `observes`): a key true (or a string saying how) is observed, false is not. The analyses and claims read it from the
# records, never from the engine's name: a claim that needs what was not observed says so (INCONCLUSIVE).
OBSERVES = {
    "server_cmd": "the server's full command line",
    "binary": "the server binary's identity (sha256 of its files)",
    "weights_sha256": "the sha256 of the weights the server computes with",
    "cache_use": "the prompt tokens served from cache, per request (how: the source)",
    "cache_control": "who sets each arm's cache condition: the artifact (per request or per server) or the user",
    "logprobs": "the top-2 log-probabilities of every generated token",
    "exclusive": "that no other client's requests reached the server during the runs",
}
STARTED_BY_ARTIFACT = {
    "server_cmd": True,
    "binary": True,
    "weights_sha256": True,
    "cache_use": "per request",
    "cache_control": "the artifact",
    "logprobs": True,
    "exclusive": True,
}


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, declared by its adapter; the protocol checks a workload's needs against it before
    anything starts."""

    per_request_cache_switch: bool  # the cache can be used or not per request (else per server: one per arm)
    cache_tiers: tuple[str, ...]  # where a request's cached prefix can come from, as its records name them
    metrics_endpoint: str | None  # the server's Prometheus endpoint, if it has one
    image: str | None  # the Dockerfile `./run.sh all` builds this engine's image from
    # the arms its sessions serve; None: any arm (the cache is switched per request, so the arm is the workload's)
    arms: tuple[str, ...] | None = ("off", "on")
    packages: tuple[str, ...] = ()  # distributions whose versions every manifest lists first
    # its sessions serve requests of background tenants (`background`) concurrently with the measured ones, on
    # other slots of the same server (plans with `tenants`, artifact/protocol/tenants.py)
    background_requests: bool = False
    # its sessions load the configuration's weights (sha256-verified before every start); False: the weights are the
    # server's own (a server the artifact did not start), the configuration's model source is "server:"
    loads_weights: bool = True
    # every request it serves reports how many prompt tokens came from cache (`cache_n`, never null): a served
    # request of its runs with a null cache_n says nothing about cache use, and the claims do not read it as 0
    reports_cache_use: bool = False

    def missing(self, needs: dict[str, Any]) -> list[str]:
        """The needs (capability name -> required value, or for `arms` the arms needed) this engine lacks."""
        out = []
        for name, want in needs.items():
            have = getattr(self, name)
            if name == "arms":
                out += [f"arm {a!r}" for a in want if have is not None and a not in have]
            elif have != want:
                out.append(name.replace("_", " "))
        return out


# The GPUs the artifact's CUDA builds target by default (CMAKE_CUDA_ARCHITECTURES): sm_89 + sm_90 native, sm_90 PTX
DEFAULT_CUDA_ARCHS = "89-real;90-real;90-virtual"


@dataclass(frozen=True)
class ImageSpec:
    """The container image `./run.sh all` builds (or reuses) to serve an engine, as the engine declares it."""

    engine: str  # the configurations' engine.kind it serves
    dockerfile: str
    repository: str
    pin_tag: str
    buildargs: dict[str, Any] = field(default_factory=dict)
    expect_build_info: str | None = None  # what every manifest's engine_build must read
    shm_size: str | None = None
    # host files added to the build context: () -> [(path inside the context, host file)], e.g. a wheel cache
    extra_context: Any = field(default=None, compare=False)

    def tag(self, context_hash: str) -> str:
        return f"{self.repository}:{self.pin_tag}-{context_hash[:12]}"


def native_venv() -> Path:
    """The environment `./run.sh all --native` builds into and runs its jobs from (run.sh passes the same)."""
    return Path(os.environ.get("ARTIFACT_NATIVE_VENV") or REPO / ".venv-cuda")


class NativeBuild(Protocol):
    """What `./run.sh all --native` (and --slurm's native tasks) builds on the host for an engine before any job
    starts, and the label every manifest of its jobs must then read (`engine_build`)."""

    def plan(self, args: argparse.Namespace) -> tuple[str | None, list[str]]:
        """(the label its jobs will report, the dry run's lines about it), without building anything."""
        ...

    def ensure(self, args: argparse.Namespace) -> str | None:
        """Build (or find) it; returns the label every manifest of the engine's jobs must read."""
        ...


class Engine:
    """An engine adapter: a subclass per engine package sets the class attributes and implements the methods."""

    kind: str  # configs' engine.kind, e.g. "llama.cpp"
    capabilities: Capabilities
    settings_type: type | None = None  # a dataclass: the engine's own settings (None: it has none)
    cache_keys: tuple[str, ...] = ()  # settings a plan may set as its cache condition (not "overrides")
    # the family of server its sessions serve, in the server's own word (what it reports as /v1/models owned_by:
    # "vllm", "llamacpp"); recorded in every manifest as `server_family`. None: known only from the server itself
    server_family: str | None = None
    # repository folders its own set-up makes (an environment of its own), never part of an image's build context
    host_folders: tuple[str, ...] = ()

    @property
    def settings_key(self) -> str:
        """The name of this engine's table inside a plan (`llama_cpp = {...}`)."""
        return self.kind.replace(".", "_")

    def settings(self, cfg: Config, plan: Plan | None = None, where: str = "") -> Any:
        """The effective settings: the configuration's `[engine.settings]`, then the plan's table over it,
        validated into `settings_type` (an unknown key, a missing one or a wrong type is a one-line error)."""
        table = dict(cfg.engine.settings)
        if plan is not None:
            table.update(plan.engine_settings.get(self.settings_key, {}))
        if self.settings_type is None:
            if table:
                raise ArtifactError(
                    f"{where or cfg.path}: engine {self.kind} takes no settings (got {', '.join(sorted(table))})"
                )
            return None
        settings = build_table(self.settings_type, table, where or cfg.path, "engine.settings.")
        for problem in self.problems(cfg, settings):
            raise ArtifactError(f"{where or cfg.path}: {problem}")
        return settings

    def check_plan_table(self, table: dict[str, Any], where: str) -> None:
        """A plan's table for this engine: only this engine's settings, each of the right type."""
        if self.settings_type is None:
            raise ArtifactError(f"{where}: engine {self.kind} takes no settings")
        known = {f.name: f for f in dataclasses.fields(self.settings_type)}
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ArtifactError(f"{where}: unknown key '{unknown[0]}' (allowed here: {', '.join(known)})")

    def overrides(self, plan: Plan) -> dict[str, Any]:
        """The settings a plan changes beyond its cache condition (a mitigation plan's server settings)."""
        table = plan.engine_settings.get(self.settings_key, {})
        return {k: v for k, v in table.items() if k not in self.cache_keys}

    def problems(self, cfg: Config, settings: Any) -> list[str]:
        return []

    def slots(self, cfg: Config, plan: Plan) -> int:
        """How many requests a session of this plan serves at once (the measured one and background tenants')."""
        return 1

    def capabilities_for(self, cfg: Config) -> Capabilities:
        """The capabilities under a configuration's settings (an engine whose settings change them overrides it)."""
        return self.capabilities

    def observes(self, cfg: Config, plan: Plan) -> dict[str, Any]:
        """What this engine observes of its server (`OBSERVES`), recorded in every manifest; a session may refine it
        in its provenance. An engine that starts its own server observes everything."""
        return dict(STARTED_BY_ARTIFACT)

    def loopback_servers(self, cfg: Config) -> list[str]:
        """ "host:port" of loopback servers outside the run's network namespace that its sessions talk to (the
        isolation forwards exactly these; scripts/isolate.sh). An engine that starts its own server has none."""
        return []

    def remote_servers(self, manifest: dict[str, Any]) -> list[str] | None:
        """The servers a run of this engine talked to that are not on loopback, from the addresses its records
        show (never from its isolation label): [] where every one is a loopback address; None where its records
        show none (not known). An engine that starts its own server talks to that server on 127.0.0.1: []."""
        return []

    def family_of(self, manifest: dict[str, Any]) -> str | None:
        """The family of server a run of this engine was served by, derived from facts, never from the manifest's
        `server_family` label (the label routed runs into RQ4): an engine that starts its own server knows
        which server it started (`server_family`; its command line is recorded); one that does not says None here
        and derives it from what the server itself reported (the endpoint engine: `observe.server_family`)."""
        return self.server_family

    def dry_run(self, cfg: Config, plan: Plan) -> list[str]:
        """`./run.sh run CONFIG --dry-run`: what it can say before a run, as lines (the endpoint engine: its servers'
        identity, which claims they can decide, about how long the budget takes)."""
        raise ArtifactError(
            f"engine {self.kind} has no dry run of its own: `./run.sh all --dry-run` shows what a "
            "run of its configurations would do"
        )

    # --- what `./run.sh all` needs of it: its image, where it can run, what it builds natively ------------------
    def image(self, args: argparse.Namespace) -> ImageSpec | None:
        """The image that serves it (`args`: `./run.sh all`'s options: cpu, base_image, cuda_archs); None: none."""
        return None

    def container_unavailable(self) -> str | None:
        """None if this version can run it in its image, else why not (one line)."""
        image = self.capabilities.image
        if not image or not (REPO / image).is_file():
            return f"engine {self.kind} declares no image this version can build ({image or 'none'})"
        return None

    def native_unavailable(self, cfg: Config, gpu: bool) -> str | None:
        """None if this version can run configuration `cfg` natively here (on a GPU if `gpu`), else why not."""
        return None

    def native_build(self) -> NativeBuild | None:
        """What `all --native` builds for it on the host before any job (None: nothing, it runs what is installed)."""
        return None

    # The rest is the engine's own.
    def identity(self, cfg: Config, plan: Plan) -> dict[str, Any]:
        raise NotImplementedError

    def describe_cache(self, cfg: Config, plan: Plan, arm: str) -> str:
        raise NotImplementedError

    def open_session(self, cfg: Config, plan: Plan, arm: str, model_path: Path, log_path: Path) -> "EngineSession":
        raise NotImplementedError

    # --- what a run recorded about its server, held against itself (`./run.sh check`, artifact.check.facts) -----
    identity_keys: tuple[str, ...] = ("engine",)  # keys every `identity()` of this engine holds

    def command_settings(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """The engine's settings (its `settings_type` field names) as the run's recorded server command line
        (`server_cmd`) shows them: only those it shows. The checker holds the plan's labels (plan_data, the plan's
        definition in configs/plans.toml, cache_condition) against them."""
        return {}

    def manifest_problem(self, manifest: dict[str, Any]) -> str | None:
        """Why a manifest's record of its server is not this engine's or contradicts itself ("field 'x' ...: both
        values"), or None. Here: the pairing inputs' engine identity holds `identity_keys`; an engine adds its own
        facts (the command line against the identity it was paired by, the binary's digests)."""
        ident = (manifest.get("pairing_inputs") or {}).get("engine")
        if isinstance(ident, dict):
            missing = [k for k in self.identity_keys if k not in ident]
            if missing:
                return (
                    f"field 'pairing_inputs.engine' lacks {', '.join(missing)}, which every {self.kind} identity "
                    f"records (its keys: {', '.join(sorted(map(str, ident)))}): not a {self.kind} server's record"
                )
        if self.capabilities.loads_weights and not (
            isinstance(manifest.get("server_cmd"), list) and manifest["server_cmd"]
        ):
            # an engine that starts its own server records the command line it started: without one, nothing shows
            # that this engine served the run (a server the artifact did not start, relabelled), so its facts
            # (weights loaded, loopback address, server family) are not this engine's to read
            return (
                f"field 'server_cmd' is missing: every {self.kind} run records the command line of the server "
                f"it started, so the manifest's engine {self.kind!r} is not shown by its records"
            )
        return None

    def start_problem(self, manifest: dict[str, Any], requests: list[dict[str, Any]]) -> str | None:
        """Why a cache-using run's records show it did not start from the cache state the protocol starts it in (ON
        run 1 on a cache no request has touched; a later run of the session on what the session's own requests
        left), or None. The analyses then take it for no evidence of what the cache does (analysis.compare
        .cache_unused: RQ2 and RQ4 are not decided on it). The default tells nothing: an engine that starts its own
        server starts each session on a new process."""
        return None

    def session_log_problems(
        self, manifest: dict[str, Any], runs: list[list[dict[str, Any]]], log_text: str
    ) -> list[str | None]:
        """For one server session (its runs' requests, each run's in send order, the runs in the order they ran)
        and the session's own log: per run, why its records disagree with the log (None where they agree, or
        where the engine's log does not tell). The default tells nothing."""
        return [None] * len(runs)

    def tools_dir(self) -> Path:
        """Where the engine's build keeps the tools a derived model's recipe runs (artifact.models.derive)."""
        raise ArtifactError(f"engine {self.kind} has no tools a model recipe can run")

    def request_tiers(
        self, manifest: dict[str, Any], requests: list[dict[str, Any]], log_text: str | None
    ) -> list[Tier]:
        """Per request of one server session (all its runs' requests in send order; `log_text` the session's
        server log, None if it is not kept), which cache tier served its cached prefix. The default knows only
        what the records say: no cached tokens, or the engine's single tier."""
        tiers = self.capabilities.cache_tiers
        out = []
        for r in requests:
            n = r.get("cache_n")
            if n == 0:
                out.append(Tier("none", True, "no cached prompt tokens"))
            elif n is None or r.get("error") is not None:
                out.append(Tier("unknown", False, "the engine reported no cache_n"))
            elif len(tiers) == 1:
                out.append(Tier(tiers[0], True, f"{self.kind} has one cache tier"))
            else:
                out.append(Tier("unknown", False, f"{self.kind} does not tell its tiers apart"))
        return out
