"""Verified weight swaps into live vLLM backends (docs/architecture.md, "Weight swaps")."""
