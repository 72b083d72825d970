"""The soak's agents: sessions of a few turns through the gateway, with retries, streams and
rewards, each remembering exactly what the gateway told it."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field

import httpx


@dataclass
class Ledger:
    """What the clients saw: the ground truth the database is compared with."""

    sessions: list[str] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)  # session -> completion calls made
    delivered: set[str] = field(default_factory=set)  # ids of completions received in full
    failed: list[str] = field(default_factory=list)  # why a call did not succeed
    # Calls refused because their record could not be written: by design they leave no row.
    unrecorded: dict[str, int] = field(default_factory=dict)
    retried: int = 0
    rewards: dict[str, int] = field(default_factory=dict)  # session -> distinct rewards posted
    duplicate_reward_posts: int = 0
    episodes: int = 0


RECORD_FAILURES = ("database_unavailable", "recorder_overloaded", "record_failed")


def _refused_for_recording(ledger: Ledger, session_id: str, code: str | None) -> None:
    if code in RECORD_FAILURES:
        ledger.unrecorded[session_id] = ledger.unrecorded.get(session_id, 0) + 1


def _error_code(payload: object) -> str | None:
    error = payload.get("error") if isinstance(payload, dict) else None
    return error.get("code") if isinstance(error, dict) else None


async def _complete(
    http: httpx.AsyncClient, base: str, body: dict, ledger: Ledger, session_id: str
) -> dict | None:
    """One chat completion; the message it returned when it was delivered in full, else None."""
    ledger.calls[session_id] = ledger.calls.get(session_id, 0) + 1
    if not body.get("stream"):
        reply = await http.post(f"{base}/chat/completions", json=body)
        if reply.status_code != 200:
            ledger.failed.append(f"HTTP {reply.status_code}: {reply.text[:200]}")
            _refused_for_recording(ledger, session_id, _error_code(reply.json()))
            return None
        payload = reply.json()
        ledger.delivered.add(payload["id"])
        return payload["choices"][0]["message"]
    completion_id, parts, done = None, [], False
    async with http.stream("POST", f"{base}/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            ledger.failed.append(f"HTTP {reply.status_code} (stream)")
            _refused_for_recording(ledger, session_id, _error_code(json.loads(await reply.aread())))
            return None
        async for line in reply.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                ledger.failed.append(f"stream error: {chunk['error']}")
                _refused_for_recording(ledger, session_id, _error_code(chunk))
                return None
            completion_id = chunk.get("id", completion_id)
            for choice in chunk.get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
    if not done or completion_id is None:
        ledger.failed.append("stream ended without [DONE]")
        return None
    ledger.delivered.add(completion_id)
    return {"role": "assistant", "content": "".join(parts)}


async def episode(http: httpx.AsyncClient, model: str, rng: random.Random, ledger: Ledger) -> None:
    """One session: 1-3 turns (some streamed, some retried), a reward (sometimes posted twice
    with the same Idempotency-Key), then close."""
    created = await http.post("/v1/sessions", json={"task_id": "soak"})
    created.raise_for_status()
    session_id = created.json()["id"]
    ledger.sessions.append(session_id)
    base = f"/sessions/{session_id}/v1"
    messages = [{"role": "user", "content": f"soak {uuid.uuid4().hex[:8]}"}]
    for turn in range(rng.randint(1, 3)):
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": rng.choice((8, 16, 32)),
            "stream": rng.random() < 0.5,
            "logprobs": True,
        }
        reply = await _complete(http, base, body, ledger, session_id)
        if reply is not None and rng.random() < 0.2:  # the agent retries the same turn
            ledger.retried += 1
            reply = await _complete(http, base, body, ledger, session_id)
        if reply is None:
            break
        messages = [*messages, reply, {"role": "user", "content": f"turn {turn + 1}"}]
    key, value = uuid.uuid4().hex, rng.random()
    posts = 2 if rng.random() < 0.3 else 1  # a client retrying its reward post
    for _ in range(posts):
        reward = await http.post(
            f"/v1/sessions/{session_id}/rewards",
            json={"value": value},
            headers={"Idempotency-Key": key},
        )
        if reward.status_code not in (200, 201):
            ledger.failed.append(f"reward HTTP {reward.status_code}: {reward.text[:200]}")
            break
    else:
        ledger.rewards[session_id] = 1
        ledger.duplicate_reward_posts += posts - 1
    await http.post(f"/v1/sessions/{session_id}/close")
    ledger.episodes += 1


async def run_agents(
    gateway_url: str, model: str, *, sessions: int, duration_s: float, seed: int = 0
) -> Ledger:
    """`sessions` agents at once, each playing episodes back to back until `duration_s` ends."""
    ledger = Ledger()
    deadline = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=sessions + 8, max_keepalive_connections=sessions + 8)
    async with httpx.AsyncClient(base_url=gateway_url, timeout=120, limits=limits) as http:

        async def agent(n: int) -> None:
            rng = random.Random(seed * 100_003 + n)
            while time.monotonic() < deadline:
                try:
                    await episode(http, model, rng, ledger)
                except httpx.HTTPError as exc:  # counted; the comparison shows what it left
                    ledger.failed.append(f"transport: {exc!r}")

        await asyncio.gather(*(agent(n) for n in range(sessions)))
    return ledger
