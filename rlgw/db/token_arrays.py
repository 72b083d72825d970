"""Compact encoding of token arrays: little-endian int32 ids and float32 log-probs, 4 bytes each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_IDS = np.dtype("<i4")
_LOGPROBS = np.dtype("<f4")


def pack_ids(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype=_IDS).tobytes()


def unpack_ids(blob: bytes | None) -> list[int]:
    return [] if not blob else np.frombuffer(blob, dtype=_IDS).tolist()


def pack_logprobs(logprobs: Sequence[float]) -> bytes:
    # vLLM computes log-probs in float32, so float32 storage is exact for what it served.
    return np.asarray(logprobs, dtype=_LOGPROBS).tobytes()


def unpack_logprobs(blob: bytes | None) -> list[float]:
    return [] if not blob else np.frombuffer(blob, dtype=_LOGPROBS).tolist()
