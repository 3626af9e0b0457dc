"""The endpoint engine's record audit: what the records of a run on a server the artifact did not start can show of
it (the server family it reported, the URL its requests went to, whether its cache-using runs started cold)."""

from __future__ import annotations

from artifact.engines.audit import RecordAudit
from artifact.engines.endpoint import observe
from artifact.engines.openai_client import is_loopback, split_url
from artifact.errors import ArtifactError


class EndpointAudit(RecordAudit):
    identity_keys = ("engine", "servers", "model_id", "cache_control", "request_fields", "unknown")
    # (records made since also hold `model_held`: what the server reports of its model against [model])

    def family_of(self, manifest: dict) -> str | None:
        """What the recorded server identity reports (its /v1/models owned_by; None where it reports none or
        several), never the manifest's `server_family` label."""
        server = manifest.get("server")
        return observe.server_family(server.get("identity") if isinstance(server, dict) else None)

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
