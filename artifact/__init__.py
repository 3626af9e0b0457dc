"""Reproducibility artifact for "Same Request, Different Answer": prefix caching and LLM serving determinism."""

__version__ = "0.1.0"
