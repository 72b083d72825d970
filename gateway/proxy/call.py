"""One generation request in flight through the gateway, and how it ends up in its records."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..recording import lineage
from ..recording.record import CompletionRecord
from .echo import Echo, output_only
from .shaping import Extracted
from .surface import Surface


def now() -> datetime:
    return datetime.now(UTC)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


@dataclass
class Call:
    """One generation request in flight through the gateway: one record per choice."""

    surface: Surface
    records: list[CompletionRecord]
    t0: float
    sequence: Any = None  # what the request was conditioned on (lineage)
    choices: dict[int, dict[str, Any]] = field(default_factory=dict)  # wire-format, by index
    swap_doubt: Any = None  # () -> str | None, set once a backend is leased
    pin: int | None = None  # the session's pinned version: only a backend serving it may answer
    echo: Echo | None = None  # a text completion with `echo` (gateway/proxy/echo.py)

    @property
    def record(self) -> CompletionRecord:
        """The record of choice 0 (whose id is the reply's id)."""
        return self.records[0]

    def finish(self, status: str, reason: str | None = None) -> list[CompletionRecord]:
        doubt = self.swap_doubt() if self.swap_doubt is not None else None
        latency, finished = ms_since(self.t0), now()
        wire = self.surface.wire
        for index, rec in enumerate(self.records):
            rec.status, rec.status_reason = status, reason
            if status == "complete" and index not in self.choices:
                rec.status = "error"
                rec.status_reason = f"the backend's reply has no choice {index}"
            elif status == "complete" and rec.finish_reason == "abort":
                # vLLM ends an aborted request (a swap's drain timed out, a stop) like a finished
                # one: its output was cut, so the record must not look complete.
                rec.status = "incomplete"
                rec.status_reason = "the backend aborted the generation (finish_reason abort)"
            # Its tokens may come from two weight versions: never train on a guessed label.
            # Not following: the recorder settles it against the registry when it writes.
            rec.swap_doubt = doubt
            rec.latency_ms = latency
            rec.finished_at = finished
            if rec.response is not None:
                seq = lineage.continuation_of(
                    wire, self.sequence, self.choices.get(index), rec.output_token_ids
                )
                rec.continuation_hash, rec.continuation_len = lineage.sequence_hash(seq), len(seq)
        return self.records


def fill(rec: CompletionRecord, tokens: Extracted | None, echo: Echo | None = None) -> None:
    if tokens is None:
        return
    if echo is not None:  # the echoed prompt's log-probs are not the output's
        tokens = output_only(tokens, echo)
        rec.echo_only = not echo.generates
    rec.prompt_token_ids, rec.finish_reason = tokens.prompt_token_ids, tokens.finish_reason
    rec.output_token_ids, rec.output_logprobs = tokens.output_token_ids, tokens.output_logprobs
