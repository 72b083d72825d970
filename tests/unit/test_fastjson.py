"""The relay reads and writes JSON as the stdlib json did, and splits SSE lines as SSE does."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from gateway.proxy.fastjson import FastJSONResponse, dumps, loads
from gateway.proxy.sse import sse, sse_event, sse_line_batches, sse_lines


def _stdlib(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"logprob":-Infinity,"b":NaN,"c":Infinity,"d":1e999,"e":-9999.0}',
        b'{"content":"\\ud800 lone surrogate"}',
        b'{"token_ids":[1,2,3],"text":"caf\\u00e9 \\u2028"}',
    ],
)
def test_reads_and_writes_as_the_stdlib_json(raw: bytes) -> None:
    ours, theirs = loads(raw), json.loads(raw)
    assert repr(ours) == repr(theirs)  # NaN != NaN: compare the texts
    assert repr(json.loads(dumps(ours))) == repr(json.loads(_stdlib(theirs)))


def test_non_finite_log_probs_keep_their_value_and_spelling() -> None:
    chunk = loads(b'{"choices":[{"logprobs":{"content":[{"logprob":-Infinity}]}}]}')
    value = chunk["choices"][0]["logprobs"]["content"][0]["logprob"]
    assert value == -math.inf and not math.isfinite(value)  # the evidence check refuses it
    assert sse(chunk) == b"data: " + _stdlib(chunk) + b"\n\n"
    assert sse_event("x", {"v": loads(b"[NaN]")}) == b'event: x\ndata: {"v":[NaN]}\n\n'
    with pytest.raises(ValueError):  # a whole reply: refused, as JSONResponse refuses it
        FastJSONResponse(chunk)


def test_text_not_utf8_is_replaced_in_a_stream_and_refused_in_a_reply() -> None:
    assert loads(b'{"t":"\xff"}', errors="replace") == {"t": "\ufffd"}
    with pytest.raises(ValueError):
        loads(b'{"t":"\xff"}')
    with pytest.raises(ValueError):
        loads(b'{"t": 1')


class _Upstream:
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    async def aiter_bytes(self):
        for data in self.reads:
            yield data


def _lines(reads: list[bytes]) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [line async for line in sse_lines(_Upstream(reads))]

    return asyncio.run(collect())


def testsse_lines_end_at_cr_lf_or_crlf_even_across_reads() -> None:
    reads = [b"data: a\r", b"\ndata: b\n\ndata: \xe2\x80\xa8c\rdata: d", b"\r\n", b"data: [DONE]"]
    assert _lines(reads) == [
        b"data: a",
        b"data: b",
        b"",
        b"data: \xe2\x80\xa8c",
        b"data: d",
        b"data: [DONE]",
    ]
    assert _lines([b"data: x\r"]) == [b"data: x"]


def test_the_lines_one_read_completes_come_together() -> None:
    async def collect(reads: list[bytes]) -> list[list[bytes]]:
        return [lines async for lines in sse_line_batches(_Upstream(reads))]

    reads = [b"data: a\n\ndata: b\n\nda", b"ta: c", b"\n\n", b"data: [DONE]"]
    assert asyncio.run(collect(reads)) == [
        [b"data: a", b"", b"data: b", b""],
        [b"data: c", b""],
        [b"data: [DONE]"],
    ]
