"""orjson on the relay's hot path, with the stdlib json's results wherever orjson would differ."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
from fastapi.responses import JSONResponse


class NonFinite(float):
    """A NaN or infinity read from the backend (which orjson neither parses nor writes): it is
    written back as the stdlib json writes it (`NaN`, `Infinity`, `-Infinity`)."""

    __slots__ = ()


def _float(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else NonFinite(value)


def loads(data: bytes | str, errors: str = "strict") -> Any:
    """What json.loads(data) returns (orjson when it can parse `data`; it reads an integer
    beyond 64 bits as a float). With `errors` "replace", bytes that are not UTF-8 are decoded
    as a text stream decodes them."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # NaN, Infinity, 1e999, lone surrogates, not UTF-8, invalid
        if errors != "strict" and isinstance(data, bytes):
            data = data.decode("utf-8", errors)
        return json.loads(data, parse_float=_float, parse_constant=_float)


def _non_finite(value: Any) -> orjson.Fragment:
    if isinstance(value, NonFinite):
        return orjson.Fragment(json.dumps(value).encode())
    raise TypeError


def dumps(payload: Any) -> bytes:
    """json.dumps(payload, separators=(",", ":")), in UTF-8 rather than ASCII with escapes."""
    try:
        return orjson.dumps(payload, default=_non_finite)
    except orjson.JSONEncodeError:  # a non-str key, an int beyond 64 bits, a lone surrogate
        return json.dumps(payload, separators=(",", ":")).encode()


class FastJSONResponse(JSONResponse):
    """A JSONResponse rendered by orjson; what orjson cannot write (a NaN or infinity the
    backend sent included) renders, or fails, as JSONResponse does."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except orjson.JSONEncodeError:
            return super().render(content)
