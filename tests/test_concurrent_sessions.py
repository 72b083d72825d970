"""50 agents at once, each with several turns and a retry: each export equals its transcript."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from conftest import MODEL_NAME

AGENTS = 50
TURNS = 3


async def agent(http: httpx.AsyncClient, n: int) -> tuple[str, list, list[str]]:
    """Plays one episode; returns the session id, the replies it kept, and the retried ids."""
    session = (await http.post("/v1/sessions", json={"task_id": f"agent-{n}"})).json()
    # Generous timeouts: 50 agents and the gateway share this process and 2 busy cores. A plain
    # number: openai 3 runs on httpx2 and refuses an httpx.Timeout.
    client = openai.AsyncOpenAI(
        base_url=session["base_url"], api_key="unused", max_retries=0, timeout=300.0
    )
    messages = [{"role": "user", "content": f"Agent {n} says hello."}]
    kept, dropped = [], []
    for turn in range(TURNS):
        ask = dict(
            model=MODEL_NAME,
            messages=messages,
            max_tokens=6,
            temperature=1.0,
            logprobs=True,  # the export's output_logprobs are compared with these
            extra_body={"return_token_ids": True},
        )
        reply = await client.chat.completions.create(**ask)
        if turn == 1:  # the agent retries this turn and continues from the retry
            dropped.append(reply.id)
            reply = await client.chat.completions.create(**ask)
        kept.append(reply)
        messages = [
            *messages,
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": f"turn {turn + 1}"},
        ]
    await client.close()
    await http.post(f"/v1/sessions/{session['id']}/close")
    return session["id"], kept, dropped


async def test_fifty_concurrent_sessions_export_their_own_transcripts(gateway_url):
    async with httpx.AsyncClient(base_url=gateway_url, timeout=300) as http:
        results = await asyncio.gather(*(agent(http, n) for n in range(AGENTS)))
        for session_id, kept, dropped in results:
            trajectory = (await http.get(f"/v1/sessions/{session_id}/trajectory")).json()
            steps = trajectory["steps"]
            assert [s["completion_id"] for s in steps] == [r.id for r in kept]
            assert [e["completion_id"] for e in trajectory["excluded"]] == dropped
            for step, reply in zip(steps, kept, strict=True):
                dumped = reply.model_dump()
                assert step["prompt_token_ids"] == dumped["prompt_token_ids"]
                assert step["output_token_ids"] == dumped["choices"][0]["token_ids"]
                # The log-probs the agent was sent (it asked for them), one per output token;
                # stored as float32, so equal to vLLM's float32 values within 1e-6.
                received = [t.logprob for t in reply.choices[0].logprobs.content]
                assert len(received) == len(step["output_token_ids"])
                assert step["output_logprobs"] == pytest.approx(received, rel=0, abs=1e-6)
            assert [s["parent_id"] for s in steps] == [None, kept[0].id, kept[1].id]
