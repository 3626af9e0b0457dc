"""The one small interface every serving engine satisfies; the protocol never asks which engine runs.

An engine adapter (`Engine`, one package under `artifact/engines/`, registered in `artifact.engines.REGISTRY`) has a
required core of five members: its `kind`, what it can do (`capabilities`), what produces its tokens before anything
starts (`identity`), each arm's cache condition in words (`describe_cache`) and its sessions (`open_session`). Its
settings (`[engine.settings]` of a configuration, and the plan's table named after it, e.g. `llama_cpp = {...}` in
configs/plans.toml) and the rest have defaults; two facets are opt-in classes: its record audit (audit.py) and what
`./run.sh all` serves it with (builds.py). docs/extending.md walks through adding one.

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

import abc
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from artifact.config import Config, Plan, build_table
from artifact.engines.audit import RecordAudit
from artifact.engines.capabilities import Capabilities as Capabilities  # re-exported: adapters declare theirs here
from artifact.engines.builds import Builds
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


class Engine(abc.ABC):
    """An engine adapter. Required (what a protocol run needs): `kind`, `capabilities`, `identity`,
    `describe_cache` and `open_session`. Everything else has a default; the facets are opt-in classes:
    `audit_facet` (artifact/engines/audit.py: what a run recorded about its server, held against itself) and
    `build_facet` (artifact/engines/builds.py: the image and native build `./run.sh all` serves it with; None: `all`
    does not run it). Each adapter instance holds its facets as `audit` and `builds`."""

    kind: str  # configs' engine.kind, e.g. "llama.cpp"
    capabilities: Capabilities

    @abc.abstractmethod
    def identity(self, cfg: Config, plan: Plan) -> dict[str, Any]:
        """Everything of this engine that produces the tokens, known before a server starts (pairing fingerprint)."""

    @abc.abstractmethod
    def describe_cache(self, cfg: Config, plan: Plan, arm: str) -> str:
        """The cache condition an arm's server session runs under, in words (recorded in every manifest)."""

    @abc.abstractmethod
    def open_session(self, cfg: Config, plan: Plan, arm: str, model_path: Path | None, log_path: Path) -> EngineSession:
        """A not yet started server session for one arm's runs; `model_path` the verified weights (None for an
        engine that loads none)."""

    # --- the facets it opts into -----------------------------------------------------------------------------
    audit_facet: type[RecordAudit] = RecordAudit
    build_facet: type[Builds] | None = None

    def __init__(self) -> None:
        self.audit = self.audit_facet(self)
        self.builds = self.build_facet(self) if self.build_facet is not None else None

    # --- optional, with defaults ------------------------------------------------------------------------------
    settings_type: type | None = None  # a dataclass: the engine's own settings (None: it has none)
    cache_keys: tuple[str, ...] = ()  # settings a plan may set as its cache condition (not "overrides")
    # the family of server its sessions serve, in the server's own word (what it reports as /v1/models owned_by:
    # "vllm", "llamacpp"); recorded in every manifest as `server_family`. None: known only from the server itself
    server_family: str | None = None

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
        """What is wrong with valid-typed settings (ranges, combinations), one line each."""
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

    def dry_run(self, cfg: Config, plan: Plan) -> list[str]:
        """`./run.sh run CONFIG --dry-run`: what it can say before a run, as lines (the endpoint engine: its servers'
        identity, which claims they can decide, about how long the budget takes)."""
        raise ArtifactError(
            f"engine {self.kind} has no dry run of its own: `./run.sh all --dry-run` shows what a "
            "run of its configurations would do"
        )
