"""vLLM's `vllm serve` (`engine.kind = "vllm"`): see adapter.py; its environment (env.py, probe.py); what differs between
the versions it serves, 0.11.0 (the paper's) and 0.25.0 (the H200 configurations): versions.py."""

from artifact.engines.vllm.adapter import ENGINE

__all__ = ["ENGINE"]
