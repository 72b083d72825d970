"""The real model's demo and benchmark task: add two small numbers, with a verifiable 0/1 reward.

The user message is ``What is 4 + 3?``. SmolLM2-135M-Instruct half-knows this: it usually
restates the question before answering (``4 + 3 = 7``), its greedy answers are mostly right and
its samples at temperature 1 mostly wrong. That gap is what online RL closes first: the skill is
there, the policy is not sharp. Sums of two two-digit numbers were 0 of 64 right at any
temperature (no signal to learn from), so the operands stay below SPAN.

reward = 1 when the LAST integer in the answer is the sum (``4 + 3 = 7``, ``The answer is 7.``,
``7``), else 0. The last integer, not the first, because the model restates the question; a
ramble that ends on another number earns nothing.

The 400 ordered pairs (a, b) with 0 <= a, b < SPAN are split once and for all by a hash of the
pair: about 1 in 4 is HELD_OUT_SPLIT, never trained on whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

TASK_NAME = "add2"
SPAN = 10  # operands 0..9
HELD_OUT_MODULUS = 4  # 1 in 4 pairs is held out

TRAIN_SPLIT = "train"
HELD_OUT_SPLIT = "held_out"
SPLITS = (TRAIN_SPLIT, HELD_OUT_SPLIT)

# The model restates the question, then answers: "12 + 7 = 19" is ~8 tokens; 24 leaves room.
MAX_NEW_TOKENS = 24
_INTEGER = re.compile(r"-?\d+")


def split_of(a: int, b: int) -> str:
    """Which split a pair belongs to (fixed by the pair alone, never by a seed)."""
    held_out = hashlib.sha256(f"{a}+{b}".encode()).digest()[0] % HELD_OUT_MODULUS == 0
    return HELD_OUT_SPLIT if held_out else TRAIN_SPLIT


@dataclass(frozen=True)
class Prompt:
    a: int
    b: int
    split: str

    @property
    def target(self) -> str:
        return str(self.a + self.b)

    @property
    def content(self) -> str:
        return f"What is {self.a} + {self.b}?"

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat messages the agent sends (a fresh list on every access)."""
        return [{"role": "user", "content": self.content}]

    @property
    def prompt_id(self) -> str:
        return f"{TASK_NAME}:{self.a}+{self.b}"


def all_prompts(split: str) -> list[Prompt]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    pairs = [(a, b) for a in range(SPAN) for b in range(SPAN)]
    return [Prompt(a, b, split) for a, b in pairs if split_of(a, b) == split]


def make_prompts(seed: int | str, n: int, split: str = TRAIN_SPLIT) -> list[Prompt]:
    """`n` prompts of `split` drawn deterministically from `seed`: the split's pairs in a seeded
    order, cycled when `n` exceeds them (an evaluation of many samples repeats pairs)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    pool = all_prompts(split)
    random.Random(f"{TASK_NAME}/{split}/{seed}").shuffle(pool)
    return [pool[i % len(pool)] for i in range(n)]


def score(target: str, completion: object) -> float:
    """1.0 when the last integer of `completion` is `target`, else 0.0."""
    if not isinstance(completion, str):
        return 0.0
    numbers = _INTEGER.findall(completion)
    return 1.0 if numbers and numbers[-1] == target else 0.0


def reward(prompt: Prompt, completion_text: object) -> float:
    """The task reward for one completion of `prompt`: deterministic, 0 or 1."""
    return score(prompt.target, completion_text)


def mean_reward(prompts: list[Prompt], completions: list[object]) -> float:
    if len(prompts) != len(completions):
        raise ValueError("one completion per prompt")
    if not prompts:
        return 0.0
    return sum(reward(p, c) for p, c in zip(prompts, completions, strict=True)) / len(prompts)
