"""The `rlgw demo` task: copy a short random letter string, with a verifiable reward in [0, 1].

The user message is ``Copy: kxqm``; the right answer is ``kxqm`` (then `<|im_end|>`), 5 tokens
with the byte-level tokenizer. The reward is per-position character accuracy with a length
penalty, so it is dense (3 of 4 letters right earns 0.75) but only the exact answer earns 1.0:

    reward = #{i : answer[i] == target[i]} / max(len(answer), len(target))

The input space (26**4 strings) is split once and for all by a hash of the string: a string is
in HELD_OUT_SPLIT iff the first byte of its sha256 is divisible by 8 (about 1 in 8 strings),
otherwise in TRAIN_SPLIT. The warm start and the online RL only ever draw TRAIN_SPLIT prompts, so
a held-out prompt is never trained on, whatever the seeds.

Why this task (measured with the tiny preset, 2 layers / 2 heads, on CPU; see the report in
trainer/models/warm_start.py): copying is the one candidate the tiny model learns in a short
supervised run (~130 steps of 128 examples). Reversing 3-4 letters, shifting each letter to the next
one, and 8-letter alphabets stayed at the unigram plateau for 300-1000 steps; "count from K by 2"
(KMOQ) was learned gradually but online RL made it worse. Online RL does not reliably finish a
circuit the warm start left half-built (from half-trained copy policies 3 of 8 runs reached +0.3
in 150 updates, some got worse); it sharpens one that is there, which is what the
label-smoothed warm start leaves: greedy answers right, temperature-1 samples ~0.35-0.45.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

TASK_NAME = "copy4"
ALPHABET = "abcdefghijklmnopqrstuvwxyz"
LENGTH = 4
INSTRUCTION = "Copy: "
HELD_OUT_MODULUS = 8  # 1 in 8 strings is held out

TRAIN_SPLIT = "train"
HELD_OUT_SPLIT = "held_out"
SPLITS = (TRAIN_SPLIT, HELD_OUT_SPLIT)

# Completions are short: LENGTH letters then <|im_end|>; 8 leaves room for the policy to ramble.
MAX_NEW_TOKENS = 8


def split_of(text: str) -> str:
    """Which split an input string belongs to (fixed by the string alone, never by a seed)."""
    held_out = hashlib.sha256(text.encode()).digest()[0] % HELD_OUT_MODULUS == 0
    return HELD_OUT_SPLIT if held_out else TRAIN_SPLIT


@dataclass(frozen=True)
class Prompt:
    """One task instance: `text` is the string to copy, `target` the exact right answer."""

    text: str
    target: str
    split: str

    @property
    def content(self) -> str:
        return INSTRUCTION + self.text

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat messages the agent sends (a fresh list on every access)."""
        return [{"role": "user", "content": self.content}]

    @property
    def prompt_id(self) -> str:
        return f"{TASK_NAME}:{self.text}"


def make_prompt(text: str) -> Prompt:
    """The prompt for a given input string (its split is derived from the string)."""
    if len(text) != LENGTH or any(c not in ALPHABET for c in text):
        raise ValueError(f"expected {LENGTH} letters from {ALPHABET!r}, got {text!r}")
    return Prompt(text=text, target=text, split=split_of(text))


def make_prompts(seed: int | str, n: int, split: str = TRAIN_SPLIT) -> list[Prompt]:
    """`n` distinct prompts of `split`, drawn deterministically from `seed`.

    The same (seed, n, split) always gives the same list, and a longer list starts with the
    shorter one. Different seeds give different (possibly overlapping) lists of the same split.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(f"{TASK_NAME}/{split}/{seed}")
    seen: set[str] = set()
    prompts: list[Prompt] = []
    while len(prompts) < n:
        text = "".join(rng.choice(ALPHABET) for _ in range(LENGTH))
        if text in seen or split_of(text) != split:
            continue
        seen.add(text)
        prompts.append(Prompt(text=text, target=text, split=split))
    return prompts


def _as_text(completion: object) -> str:
    if completion is None:
        return ""
    if isinstance(completion, bytes | bytearray | memoryview):
        return bytes(completion).decode("utf-8", errors="replace")
    if not isinstance(completion, str):
        return ""
    return completion


_SPECIAL_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>")


def score(target: str, completion: object) -> float:
    """Positional character accuracy of `completion` against `target`, in [0, 1].

    Surrounding whitespace and a trailing end-of-turn marker (a server that does not skip special
    tokens) are ignored; anything else (a longer or shorter answer, a wrong letter, U+FFFD)
    costs credit. 1.0 only for the exact answer.
    """
    answer = _as_text(completion).strip()
    while answer.endswith(_SPECIAL_TOKEN_TEXTS):
        for marker in _SPECIAL_TOKEN_TEXTS:
            answer = answer.removesuffix(marker).rstrip()
    if not answer or not target:
        return 0.0
    hits = sum(a == t for a, t in zip(answer, target, strict=False))
    return hits / max(len(answer), len(target))


def reward(prompt: Prompt, completion_text: object) -> float:
    """The task reward for one completion of `prompt`: deterministic, in [0, 1]."""
    return score(prompt.target, completion_text)


def mean_reward(prompts: list[Prompt], completions: list[object]) -> float:
    if len(prompts) != len(completions):
        raise ValueError("one completion per prompt")
    if not prompts:
        return 0.0
    return sum(reward(p, c) for p, c in zip(prompts, completions, strict=True)) / len(prompts)
