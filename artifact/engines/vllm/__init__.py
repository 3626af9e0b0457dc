"""vLLM 0.11.0's `vllm serve` (`engine.kind = "vllm"`): see adapter.py; its environment (env.py, probe.py)."""

from artifact.engines.vllm.adapter import ENGINE

__all__ = ["ENGINE"]
