"""Metrics as the database may hold them: a NaN or an infinity becomes null.

JSON has no NaN, and Postgres refuses the token in a jsonb value (`Token "NaN" is invalid`): a
version's metrics holding one would fail the transaction that records the version, after the
update, with the sessions still claimed. The update path refuses non-finite updates before they
get here (trainer/loop/update.py); this is the last guard for any metric that still is one.
"""

from __future__ import annotations

import math
from typing import Any


def finite_metrics(value: Any) -> Any:
    """`value` with every non-finite float, at any depth of dicts, lists and tuples, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_metrics(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_metrics(v) for v in value]
    return value
