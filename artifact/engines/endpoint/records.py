"""The endpoint engine's record audit: what the records of a run on a server the artifact did not start can show of
it (the server family it reported, the URL its requests went to, whether its cache-using runs started cold)."""

from __future__ import annotations

import json

from artifact.engines.audit import NOT_OBSERVABLE_ELSEWHERE, RecordAudit
from artifact.engines.endpoint import observe
from artifact.engines.endpoint.servers import comparable
from artifact.engines.openai_client import is_loopback, split_url
from artifact.errors import ArtifactError


def _table(x) -> dict:
    return x if isinstance(x, dict) else {}


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def identities(manifest: dict) -> tuple[dict | None, dict | None]:
    """(the server identity the run recorded as its session began: `server.identity`; the identity of the arm's
    server the runs were paired by: `pairing_inputs.engine.servers.<arm>`), each None where it is not recorded."""
    recorded = _table(manifest.get("server")).get("identity")
    paired = _table(_table(_table(manifest.get("pairing_inputs")).get("engine")).get("servers")).get(
        manifest.get("arm")
    )
    return (recorded if isinstance(recorded, dict) else None), (paired if isinstance(paired, dict) else None)


def identity_problem(manifest: dict) -> str | None:
    """The session checks that its server is the one the runs were paired by (`EndpointSession.start`: the same
    models, version, build, context and /props) and records it: where the two records differ, one was edited."""
    recorded, paired = identities(manifest)
    if recorded is None or paired is None:
        return None
    a, b = comparable(recorded), comparable(paired)
    a["props"], b["props"] = recorded.get("props"), paired.get("props")
    diff = next((k for k in a if a[k] != b[k]), None)
    if diff is None:
        return None
    families = observe.server_family(recorded), observe.server_family(paired)
    what = f"server family {families[0]!r}" if families[0] != families[1] else f"other {diff}"
    return (
        f"field 'server.identity' reports {what}, the identity the runs were paired by "
        f"(pairing_inputs.engine.servers.{manifest.get('arm')}) "
        + (f"{families[1]!r}" if families[0] != families[1] else "another")
        + ": the run's record of its server was edited"
    )


def cache_problem(label: str, requests: list[dict]) -> str | None:
    """Each request's `cache_n` is the largest of the cache counts the server reported (`engine_extra.cache_sources`,
    as the shared client reads an answer: `openai_client.cached_tokens`), null where none reported one; a served
    request of a run whose other requests record their sources records them too."""
    with_sources = 0
    for r in requests:
        sources = _table(r.get("engine_extra")).get("cache_sources")
        if not isinstance(sources, dict):
            continue
        with_sources += 1
        counts = [v for v in sources.values() if _is_int(v)]
        want = max(counts) if counts else None
        if r.get("cache_n") != want:
            return (
                f"{label} episode {r.get('episode_id')} request {r.get('request_index')}: field 'cache_n' is "
                f"{r.get('cache_n')!r}, the cache counts its server reported (engine_extra.cache_sources: "
                f"{json.dumps(sources, sort_keys=True)}) give {want!r}"
            )
    if with_sources:
        bare = next(
            (r for r in requests if r.get("error") is None and "cache_sources" not in _table(r.get("engine_extra"))),
            None,
        )
        if bare is not None:
            return (
                f"{label} episode {bare.get('episode_id')} request {bare.get('request_index')}: field "
                "'engine_extra.cache_sources' is missing, which the engine records on every answer (the run's "
                f"other {with_sources} requests hold it): its cache_n is not shown to be what the server reported"
            )
    return None


# what an earlier request of the session can have left cached beyond its prompt and output token counts (a server's
# /tokenize and its usage may count a special token differently)
_SLACK = 2


def cold_problem(manifest: dict, label: str, requests: list[dict]) -> str | None:
    """What the session recorded of each request's cached tokens against its cache count: `cached_before_session`
    is the cached tokens beyond `session_prefix` (the longest prefix the session's own earlier requests can have
    left cached), and the session's first request (ON run 1's first) had none before it; a session prefix of run 1
    is no longer than what the run's earlier requests sent and received. A cold start claimed by a cache salt
    (`cold_start.means`) is the salt every request that used the cache carried."""
    first_run = manifest.get("run") == 1 or manifest.get("lifecycle") == "fresh"  # its session's first run
    sent = 0  # the longest prompt + output of run 1's requests so far
    for i, r in enumerate(requests):
        extra = _table(r.get("engine_extra"))
        where = f"{label} episode {r.get('episode_id')} request {r.get('request_index')}"
        prefix, before, n = extra.get("session_prefix"), extra.get("cached_before_session"), r.get("cache_n")
        if _is_int(prefix):
            if first_run and i == 0 and prefix != 0:
                return f"{where}: field 'engine_extra.session_prefix' is {prefix} on the session's first request"
            if first_run and i > 0 and prefix > sent + _SLACK:
                return (
                    f"{where}: field 'engine_extra.session_prefix' is {prefix}, more than any earlier request of "
                    f"the run sent and received ({sent} tokens)"
                )
            want = max(0, n - prefix) if _is_int(n) else None
            if before != want:
                return (
                    f"{where}: field 'engine_extra.cached_before_session' is {before!r}, but cache_n {n!r} beyond "
                    f"session_prefix {prefix} is {want!r}"
                )
        if _is_int(r.get("prompt_tokens")):
            sent = max(sent, r["prompt_tokens"] + len(r.get("output_tokens") or []))
    cold = _table(manifest.get("cold_start"))
    if cold.get("means") == "cache_salt" and manifest.get("arm") != "off":
        salt = cold.get("salt")
        other = next((r for r in requests if _table(r.get("engine_extra")).get("cache_salt") != salt), None)
        if other is not None:
            return (
                f"{label}: field 'cold_start.means' is 'cache_salt' (salt {salt!r}), but episode "
                f"{other.get('episode_id')} request {other.get('request_index')} carried cache_salt "
                f"{_table(other.get('engine_extra')).get('cache_salt')!r}"
            )
    return None


def who_problem(manifest: dict) -> str | None:
    """A server the user started, as the run records it: what a client cannot observe of it is not claimed."""
    started = _table(manifest.get("server")).get("started_by")
    if isinstance(started, str) and started.startswith("the artifact"):
        return f"field 'server.started_by' is {started!r}, but engine 'endpoint' runs against a server its user started"
    observes = _table(manifest.get("observes"))
    for key in NOT_OBSERVABLE_ELSEWHERE:
        if observes.get(key) is True:
            return (
                f"field 'observes.{key}' is true, but engine 'endpoint' cannot observe the {key} of a server its "
                "user started (its manifest's unknown says so)"
            )
    return None


class EndpointAudit(RecordAudit):
    identity_keys = ("engine", "servers", "model_id", "cache_control", "request_fields", "unknown")
    # (records made since also hold `model_held`: what the server reports of its model against [model])

    def family_of(self, manifest: dict) -> str | None:
        """What the server reported of itself (its /v1/models owned_by; None where it reports none or several), in
        the identity the run recorded (`server.identity`) and, where recorded, the one the runs were paired by
        (`pairing_inputs.engine.servers.<arm>`): None where the two say different families. Never the manifest's
        `server_family` label."""
        recorded, paired = identities(manifest)
        family = observe.server_family(recorded)
        if paired is not None and observe.server_family(paired) != family:
            return None
        return family

    def record_problems(self, manifest: dict, requests: list[dict]) -> list[str]:
        """The server identity against the one the runs were paired by (its family routes RQ4), each request's
        cache count against the counts the server reported (cache use OFF routes RQ1), the cold start against the
        cached counts (a warm start is no evidence for RQ2), and who started the server against what is claimed
        observed."""
        label = f"{manifest.get('arm')}-run{manifest.get('run')}"
        for why in (
            identity_problem(manifest),
            who_problem(manifest),
            cache_problem(label, requests),
            cold_problem(manifest, label, requests),
        ):
            if why:
                return [why]
        return []

    def remote_servers(self, manifest: dict) -> list[str] | None:
        """The run's server as its manifest records it (`server.url`, the URL its requests went to): [] where that
        is a loopback address, [url] where it is not, None where no URL is recorded."""
        server = manifest.get("server")
        url = server.get("url") if isinstance(server, dict) else None
        if not isinstance(url, str):
            return None
        try:
            host = split_url(url)[1]
        except ArtifactError:
            return [url]  # not a URL this engine could have reached: not known to be loopback
        return [] if is_loopback(host) else [url]

    def start_problem(self, manifest: dict, requests: list[dict]) -> str | None:
        """A run of a session that uses the cache whose records show cached prompt tokens its session had not sent
        (`cached_before_session`: the server's cache from before the session, or another client's): a warm start.
        Records without that field (no /tokenize): the session's first run's first request served from cache. A
        first run whose server had no means to be reset and reports no cache use on its first request is not shown
        cold either."""
        arm, run = manifest.get("arm"), manifest.get("run")
        if arm == "off" or not requests:
            return None
        label = f"{arm}-run{run}"
        cold = manifest.get("cold_start") if isinstance(manifest.get("cold_start"), dict) else {}
        means = cold.get("means", "not recorded")
        for r in requests:
            n = (r.get("engine_extra") or {}).get("cached_before_session")
            if isinstance(n, int) and n > 0:
                return (
                    f"{label} did not start cold: episode {r.get('episode_id')} request {r.get('request_index')} "
                    f"was served {n} cached prompt tokens its session had not sent (of {r.get('cache_n')} "
                    f"cached; the server's cache from before the session, or another client's; cold-start "
                    f"means: {means})"
                )
        first = requests[0]
        if run == 1 and "cached_before_session" not in (first.get("engine_extra") or {}):
            n = first.get("cache_n")
            if isinstance(n, int) and n > 0:
                return (
                    f"{label} did not start cold: its first request was served {n} cached prompt tokens "
                    f"(cold-start means: {means})"
                )
            if n is None and means == "none":
                return (
                    f"{label}'s start is not shown cold: the server reports no cache use on its first request "
                    "and had no means to be reset"
                )
        return None
