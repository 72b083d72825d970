"""The placement benchmark's agents: they play the demo task through the gateway like real
agents do, with the faults real agents meet, and keep a ledger of what each one actually saw.

Faults, each drawn per request or per group from the run's seed:
- client retries: a request sent with a client timeout too short to be answered, then re-sent
  unchanged (same messages and sampling fields: one retry group, the first attempt an orphan);
- disconnects: a streamed request the client drops after its first chunk, then re-sent;
- delayed rewards: a group's rewards posted seconds to a minute after its sessions closed.

The ledger keeps, per completion the agent used, the output token ids and log-probs it received
(`logprobs` and `return_token_ids` asked for, as a harness that checks its data would): after
the run, every trajectory the trainer consumed is compared with it token for token.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field

import openai

from trainer.models import demo_task

RETRY_TIMEOUT_S = 0.005  # a client timeout no reply can meet: the request is sent, then dropped


@dataclass(frozen=True)
class Faults:
    retry: float = 0.10  # share of requests first sent with a timeout, then re-sent
    disconnect: float = 0.05  # share of requests first streamed and dropped, then re-sent
    delayed_reward: float = 0.20  # share of groups whose rewards come late
    reward_delay_s: tuple[float, float] = (5.0, 60.0)


@dataclass(frozen=True)
class Seen:
    """What the agent received for one completion it used."""

    session_id: str
    output_token_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    text: str


@dataclass
class Ledger:
    seen: dict[str, Seen] = field(default_factory=dict)  # by completion id
    faults: Counter = field(default_factory=Counter)  # injected, by kind
    failed: list[str] = field(default_factory=list)  # requests that failed after the retries
    generated_groups: int = 0


class Agents:
    """`count` agent loops playing training groups until `stop` is set."""

    def __init__(
        self,
        gateway,  # rlgw_sdk.AsyncGateway
        model: str,
        *,
        seed: int,
        group_size: int,
        faults: Faults,
        ledger: Ledger,
        slots: asyncio.Semaphore,
    ) -> None:
        self.gateway, self.model, self.seed = gateway, model, seed
        self.group_size, self.faults, self.ledger, self.slots = group_size, faults, ledger, slots
        self.rng = random.Random(f"placement-faults/{seed}")
        self.late_rewards: set[asyncio.Task] = set()

    async def run(self, worker: int, stop: asyncio.Event) -> None:
        prompts = demo_task.make_prompts(f"placement-{self.seed}-{worker}", 4096)
        index = 0
        while not stop.is_set():
            prompt = prompts[index % len(prompts)]
            index += 1
            await self.play_group(prompt)
            self.ledger.generated_groups += 1

    async def play_group(self, prompt: demo_task.Prompt) -> list[float]:
        group = {
            "group_id": f"g-{uuid.uuid4().hex}",
            "group_size": self.group_size,
            "normalization": "mean_std",
        }
        late = self.rng.random() < self.faults.delayed_reward
        delay = self.rng.uniform(*self.faults.reward_delay_s) if late else 0.0
        return list(
            await asyncio.gather(
                *(self.one(prompt, group, reward_delay_s=delay) for _ in range(self.group_size))
            )
        )

    async def one(
        self, prompt: demo_task.Prompt, group: dict | None, *, reward_delay_s: float = 0.0
    ) -> float:
        """One session of one completion: ask (training sessions with faults), reward (maybe
        late), close. `group` None: a held-out evaluation session (train: false)."""
        async with self.slots:
            extra = group or {}
            session = await self.gateway.create_session(
                id=f"s-{uuid.uuid4().hex}",
                train=group is not None,
                task_id=prompt.prompt_id,
                **extra,
            )
            client = session.openai(max_retries=0, timeout=300)
            try:
                reply = await self.ask(client, prompt, inject=group is not None)
            finally:
                await client.close()
            if reply is None:
                await session.close()
                return 0.0
            text = reply.choices[0].message.content or ""
            value = demo_task.reward(prompt, text)
            if group is not None:
                self.ledger.seen[reply.id] = Seen(
                    session.id,
                    tuple(reply.choices[0].model_extra.get("token_ids") or ()),
                    tuple(t.logprob for t in reply.choices[0].logprobs.content),
                    text,
                )
            await session.close()
        if reward_delay_s:
            task = asyncio.create_task(self._late_reward(session, value, reward_delay_s))
            self.late_rewards.add(task)
            task.add_done_callback(self.late_rewards.discard)
        else:
            await session.reward(value, idempotency_key=f"{session.id}:final")
        return value

    async def _late_reward(self, session, value: float, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        try:
            await session.reward(value, idempotency_key=f"{session.id}:final")
        except Exception as exc:  # the run ended first: that group is dropped at its deadline
            self.ledger.failed.append(f"late reward: {exc!r}")

    async def ask(self, client: openai.AsyncOpenAI, prompt: demo_task.Prompt, *, inject: bool):
        """The completion the agent uses, after the injected fault (if any) and one re-send."""
        request = {
            "model": self.model,
            "messages": prompt.messages,
            "max_tokens": demo_task.MAX_NEW_TOKENS,
            "temperature": 1.0,
            "logprobs": True,
            "extra_body": {"return_token_ids": True},
        }
        draw = self.rng.random() if inject else 1.0
        if draw < self.faults.retry:
            self.ledger.faults["retry"] += 1
            quick = client.with_options(timeout=RETRY_TIMEOUT_S)
            with contextlib.suppress(openai.APITimeoutError):  # sent, then given up on
                await quick.chat.completions.create(**request)
        elif draw < self.faults.retry + self.faults.disconnect:
            self.ledger.faults["disconnect"] += 1
            stream = await client.chat.completions.create(**request, stream=True)
            async for _chunk in stream:
                break  # the agent drops the stream after its first chunk
            await stream.close()
        for attempt in range(3):  # the re-send (and, past a transient error, two more)
            try:
                return await client.chat.completions.create(**request)
            except openai.APIError as exc:
                if attempt == 2:
                    self.ledger.failed.append(repr(exc))
        return None

    async def evaluate(self, prompts: list[demo_task.Prompt], samples: int) -> float:
        """Held-out reward: `samples` train-false sessions per prompt, no faults."""
        rewards = await asyncio.gather(
            *(self.one(p, None) for p in prompts for _ in range(samples))
        )
        return sum(rewards) / max(len(rewards), 1)
