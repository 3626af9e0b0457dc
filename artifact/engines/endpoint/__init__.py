"""OpenAI-compatible servers the user runs (`engine.kind = "endpoint"`): the engine, adapter.py; its settings,
settings.py; the servers before any request, servers.py; one arm's runs, session.py; what a client can observe of
them, observe.py; what their records can show, records.py."""

from artifact.engines.endpoint.adapter import ENGINE

__all__ = ["ENGINE"]
