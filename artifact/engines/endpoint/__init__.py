"""OpenAI-compatible servers the user runs (`engine.kind = "endpoint"`): see adapter.py; what a client can observe of
them, observe.py."""

from artifact.engines.endpoint.adapter import ENGINE

__all__ = ["ENGINE"]
