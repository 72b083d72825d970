"""Verified weight swaps into live vLLM backends (DESIGN.md: the swap protocol)."""
