"""llama.cpp's llama-server (`engine.kind = "llama.cpp"`): see adapter.py."""

from artifact.engines.llama_cpp.adapter import ENGINE

__all__ = ["ENGINE"]
