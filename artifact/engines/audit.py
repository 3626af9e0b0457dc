"""The record-audit facet of an engine: what a run recorded about its server, held against itself.

`./run.sh check` (artifact.check.facts) and the analyses read a run's records through its engine's audit
(`Engine.audit`, a `RecordAudit`): is the manifest's record of the server this engine's and consistent with itself,
which of the engine's settings its recorded command line shows, did a cache-using run start from the cache state the
protocol starts it in, do its records agree with the server's own log, which cache tier served each request, which
family of server served it and whether that server was on loopback. Each is derived from what the run recorded,
never from a label. The defaults fit an engine that starts its own server (one process per arm's session, its
command line recorded); an engine overrides what its records can tell more precisely (llama.cpp: its log, its
binary's digests; the endpoint engine: a server it did not start).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from artifact.engines.capabilities import EngineFacts


# What only an engine that starts its own server observes of it; a record that says any of them was not observable
# (`unknown`, `observes`) is of a server the artifact did not start.
NOT_OBSERVABLE_ELSEWHERE = ("server_cmd", "binary", "weights_sha256")
SERVER_SOURCE = "server:"  # model.source of weights a server the user runs held (not loaded by the artifact)


def _table(x: object) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


@dataclass(frozen=True)
class Tier:
    """Where one request's cached prompt prefix came from, as its engine can tell from its own evidence."""

    tier: str  # "none", one of the engine's `cache_tiers`, "<a>_or_<b>" when the evidence allows both, "unknown"
    certain: bool
    evidence: str  # why, in one line


class RecordAudit:
    """The default audit; an engine subclasses it (`Engine.Audit`) for what its own records can tell."""

    identity_keys: tuple[str, ...] = ("engine",)  # keys every `identity()` of the engine holds

    def __init__(self, engine: EngineFacts):
        self.engine = engine

    def command_settings(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """The engine's settings (its `settings_type` field names) as the run's recorded server command line
        (`server_cmd`) shows them: only those it shows. The checker holds the plan's labels (plan_data, the plan's
        definition in configs/plans.toml, cache_condition) against them."""
        return {}

    def manifest_problem(self, manifest: dict[str, Any]) -> str | None:
        """Why a manifest's record of its server is not this engine's or contradicts itself ("field 'x' ...: both
        values"), or None. Here: the pairing inputs' engine identity holds `identity_keys`, and an engine that loads
        its own weights recorded the command line it started."""
        kind = self.engine.kind
        ident = (manifest.get("pairing_inputs") or {}).get("engine")
        if isinstance(ident, dict):
            missing = [k for k in self.identity_keys if k not in ident]
            if missing:
                return (
                    f"field 'pairing_inputs.engine' lacks {', '.join(missing)}, which every {kind} identity "
                    f"records (its keys: {', '.join(sorted(map(str, ident)))}): not a {kind} server's record"
                )
        if self.engine.capabilities.loads_weights and not (
            isinstance(manifest.get("server_cmd"), list) and manifest["server_cmd"]
        ):
            # an engine that starts its own server records the command line it started: without one, nothing shows
            # that this engine served the run (a server the artifact did not start, relabelled), so its facts
            # (weights loaded, loopback address, server family) are not this engine's to read
            return (
                f"field 'server_cmd' is missing: every {kind} run records the command line of the server "
                f"it started, so the manifest's engine {kind!r} is not shown by its records"
            )
        return None

    def record_problems(self, manifest: dict[str, Any], requests: list[dict[str, Any]]) -> list[str]:
        """Where one run's records contradict each other on a fact that routes it (whose facts are read: the weights
        it loaded, its command line, its family; its cache use; its cold start): one line each, naming the field and
        what the same run recorded against it. `check.facts.invalid` makes such a run INVALID (named, admitted to no
        claim). Here: a run of an engine that starts its own server (`Capabilities.loads_weights`) whose manifest
        records a server the artifact did not start (a server the user ran, relabelled)."""
        if not self.engine.capabilities.loads_weights:
            return []
        kind = self.engine.kind
        own = f"engine {kind!r} starts its own server, loading the weights it verified"
        problems = []
        started = _table(manifest.get("server")).get("started_by")
        if started is not None and not (isinstance(started, str) and started.startswith("the artifact")):
            problems.append(f"field 'server.started_by' is {started!r}, but {own}")
        unknown = manifest.get("unknown")
        for key in NOT_OBSERVABLE_ELSEWHERE:
            if (isinstance(unknown, dict) and key in unknown) or (isinstance(unknown, list) and key in unknown):
                problems.append(f"field 'unknown' names {key} as not observable, but {own}")
            if _table(manifest.get("observes")).get(key) is False:
                problems.append(f"field 'observes.{key}' is false, but {own}")
        source = _table(manifest.get("model")).get("source")
        if isinstance(source, str) and source.startswith(SERVER_SOURCE):
            problems.append(f"field 'model.source' is {source!r} (the weights a server held), but {own}")
        ident = _table(_table(manifest.get("pairing_inputs")).get("engine"))
        for key in ("servers", "unknown"):
            if key in ident:
                problems.append(
                    f"field 'pairing_inputs.engine.{key}' records what a server the artifact did not start reports, "
                    f"but {own}"
                )
        return problems[:1]

    def start_problem(self, manifest: dict[str, Any], requests: list[dict[str, Any]]) -> str | None:
        """Why a cache-using run's records show it did not start from the cache state the protocol starts it in (ON
        run 1 on a cache no request has touched; a later run of the session on what the session's own requests
        left), or None. The analyses then take it for no evidence of what the cache does (RQ2 and RQ4 are not
        decided on it). The default tells nothing: an engine that starts its own server starts each session on a
        new process."""
        return None

    def session_log_problems(
        self, manifest: dict[str, Any], runs: list[list[dict[str, Any]]], log_text: str
    ) -> list[str | None]:
        """For one server session (its runs' requests, each run's in send order, the runs in the order they ran)
        and the session's own log: per run, why its records disagree with the log (None where they agree, or
        where the engine's log does not tell). The default tells nothing."""
        return [None] * len(runs)

    def request_tiers(
        self, manifest: dict[str, Any], requests: list[dict[str, Any]], log_text: str | None
    ) -> list[Tier]:
        """Per request of one server session (all its runs' requests in send order; `log_text` the session's
        server log, None if it is not kept), which cache tier served its cached prefix. The default knows only
        what the records say: no cached tokens, or the engine's single tier."""
        kind, tiers = self.engine.kind, self.engine.capabilities.cache_tiers
        out = []
        for r in requests:
            n = r.get("cache_n")
            if n == 0:
                out.append(Tier("none", True, "no cached prompt tokens"))
            elif n is None or r.get("error") is not None:
                out.append(Tier("unknown", False, "the engine reported no cache_n"))
            elif len(tiers) == 1:
                out.append(Tier(tiers[0], True, f"{kind} has one cache tier"))
            else:
                out.append(Tier("unknown", False, f"{kind} does not tell its tiers apart"))
        return out

    def family_of(self, manifest: dict[str, Any]) -> str | None:
        """The family of server a run of this engine was served by, derived from facts, never from the manifest's
        `server_family` label (the label routed runs into RQ4): an engine that starts its own server knows which
        server it started (`Engine.server_family`; its command line is recorded); one that does not derives it
        from what the server itself reported (the endpoint engine)."""
        return self.engine.server_family

    def remote_servers(self, manifest: dict[str, Any]) -> list[str] | None:
        """The servers a run of this engine talked to that are not on loopback, from the addresses its records
        show (never from its isolation label): [] where every one is a loopback address; None where its records
        show none (not known). An engine that starts its own server talks to that server on 127.0.0.1: []."""
        return []
