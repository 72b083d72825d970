"""Retry lineage and conversation parents (docs/architecture.md, "Evidence, retries and rewards"),
as pure functions.

A completion's *sequence* is what it was conditioned on: for chat, one digest per message; for
text completions, the prompt's token ids or its text. Its *continuation* is that sequence plus its
own output. A later request whose sequence starts with an earlier completion's continuation
continued from it: that earlier completion is its parent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from rlgw.eligibility import Reason, ReasonKind

# Fields that change how an answer is delivered, not what was asked: a retry may differ in them.
_DELIVERY_FIELDS = frozenset({"stream", "stream_options"})
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})

Sequence_ = list[str] | list[int] | str


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text") or ""
            for part in content
            if isinstance(part, dict) and part.get("type") in _TEXT_PART_TYPES
        )
    return json.dumps(content, sort_keys=True)


def _arguments(raw: Any) -> Any:
    # Agents often parse tool arguments and serialise them again: compare them as JSON values.
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def message_digest(message: dict[str, Any]) -> str:
    """A digest of what a message says: role, text, tool calls; not how the client dressed it."""
    calls = [
        [
            (c.get("function") or {}).get("name"),
            _arguments((c.get("function") or {}).get("arguments")),
        ]
        for c in message.get("tool_calls") or ()
        if isinstance(c, dict)
    ]
    essence = [
        message.get("role"),
        _text(message.get("content")),
        calls,
        message.get("tool_call_id"),
    ]
    return hashlib.sha256(_canonical(essence)).hexdigest()[:32]


def request_sequence(api: str, body: dict[str, Any]) -> Sequence_:
    """The sequence a request is conditioned on."""
    if api == "chat.completions":
        return [message_digest(m) for m in body.get("messages") or () if isinstance(m, dict)]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    return prompt if isinstance(prompt, (str, list)) else ""


def continuation_of(
    api: str, seq: Sequence_, choice: dict[str, Any] | None, output_token_ids: Sequence[int]
) -> Sequence_:
    """`seq` (a request's sequence) followed by one choice's output, as the client received it:
    for chat, the choice's message; for text completions, its text (or token ids)."""
    choice = choice or {}
    if api == "chat.completions":
        return [*seq, message_digest(choice.get("message") or {})]  # type: ignore[misc]
    if isinstance(seq, str):
        return seq + (choice.get("text") or "")
    return [*seq, *output_token_ids]  # type: ignore[misc]


def continuation(
    api: str, body: dict[str, Any], response: dict[str, Any] | None, output_token_ids: Sequence[int]
) -> Sequence_:
    """The request's sequence followed by the output of the reply's first choice."""
    choice = ((response or {}).get("choices") or [{}])[0]
    return continuation_of(api, request_sequence(api, body), choice, output_token_ids)


def sequence_hash(seq: Sequence_) -> str:
    if isinstance(seq, str):
        data = b"t" + seq.encode()
    elif seq and isinstance(seq[0], str):
        data = b"m" + "\x1f".join(seq).encode()  # type: ignore[arg-type]
    else:
        data = b"i" + np.asarray(seq, dtype="<i4").tobytes()
    return hashlib.sha256(data).hexdigest()


def retry_key(session_id: str, api: str, body: dict[str, Any], idempotency_key: str | None) -> str:
    """Requests of one session with the same key (or the same body) form one retry group."""
    if idempotency_key:
        basis = b"key\x00" + idempotency_key.encode()
    else:
        basis = b"body\x00" + _canonical(
            {k: v for k, v in body.items() if k not in _DELIVERY_FIELDS}
        )
    return hashlib.sha256(
        session_id.encode() + b"\x00" + api.encode() + b"\x00" + basis
    ).hexdigest()[:40]


# APIs whose sequences are chat message digests: the Responses and Messages APIs are recorded
# through the chat path (their requests translated to chat messages), so a conversation may
# continue across them.
_CHAT_FAMILY = frozenset({"chat.completions", "responses", "messages"})


def lineage_family(api: str) -> str:
    return "chat" if api in _CHAT_FAMILY else api


@dataclass
class LineageRow:
    """What lineage needs of one completion of a session."""

    id: str
    api: str
    created_at: datetime
    retry_group: str | None
    parent_id: str | None
    continuation_hash: str | None
    continuation_len: int | None
    sibling_group: str | None = None  # the choices of one request with n > 1 share it


def find_parent(api: str, seq: Sequence_, earlier: Iterable[LineageRow]) -> str | None:
    """The earlier completion with the longest continuation that `seq` starts with."""
    best: LineageRow | None = None
    prefix_hashes: dict[int, str] = {}
    family = lineage_family(api)
    for row in earlier:
        n = row.continuation_len
        if (
            lineage_family(row.api) != family
            or n is None
            or n == 0
            or n > len(seq)
            or row.continuation_hash is None
        ):
            continue
        if n not in prefix_hashes:
            prefix_hashes[n] = sequence_hash(seq[:n])
        if prefix_hashes[n] != row.continuation_hash:
            continue
        if best is None or (n, row.created_at, row.id) > (
            best.continuation_len,
            best.created_at,
            best.id,
        ):
            best = row
    return best.id if best else None


def continues_orphan(parent_id: str) -> Reason:
    """Why a completion that continues the orphan `parent_id` is an orphan too."""
    return Reason(f"continues orphan {parent_id}", ReasonKind.ORPHAN)


def resolve_orphans(rows: Sequence[LineageRow]) -> dict[str, str | None]:
    """For every completion of a session: None when kept, else why it is an orphan.

    In each retry group the attempt the conversation continued from is kept (the most recently
    continued, if several were); when none was continued, the last attempt is kept. An attempt is
    one request: the sibling choices of a request with n > 1 are kept or superseded together (a
    sibling is not a retry of its siblings). A completion that continues an orphan is an orphan
    too.
    """
    latest_child: dict[str, tuple[datetime, str]] = {}
    for row in rows:
        if row.parent_id is not None:
            key = (row.created_at, row.id)
            if row.parent_id not in latest_child or key > latest_child[row.parent_id]:
                latest_child[row.parent_id] = key

    def keep_rank(row: LineageRow) -> tuple:
        child = latest_child.get(row.id)
        return (child is not None, child or (datetime.min, ""), row.created_at, row.id)

    groups: dict[str, dict[str, list[LineageRow]]] = {}
    for row in rows:
        if row.retry_group is not None:
            attempt = row.sibling_group or row.id
            groups.setdefault(row.retry_group, {}).setdefault(attempt, []).append(row)
    reasons: dict[str, str | None] = {row.id: None for row in rows}
    for attempts in groups.values():
        keeper = max(attempts.values(), key=lambda members: max(map(keep_rank, members)))
        kept_id = max(keeper, key=keep_rank).id
        for members in attempts.values():
            if members is not keeper:
                for row in members:
                    reasons[row.id] = Reason(f"retry superseded by {kept_id}", ReasonKind.ORPHAN)
    for row in sorted(rows, key=lambda r: (r.created_at, r.id)):  # parents before children
        parent = row.parent_id
        if reasons[row.id] is None and parent in reasons and reasons[parent] is not None:
            reasons[row.id] = continues_orphan(parent)
    return reasons
