"""The gate's held-out evaluation: its file format, its scorers, and the built-in task.

An evaluation is JSON Lines, one prompt per line:

    {"messages": [{"role": "user", "content": "Copy: kxqm"}], "target": "kxqm",
     "scorer": "copy4", "max_tokens": 8}

- `messages`: the chat messages sent (OpenAI chat format), at least one.
- `target`: the answer expected.
- `scorer` (default `exact`): `exact` 1.0 when the answer, stripped, equals the target, else 0.0;
  `contains` 1.0 when the target occurs in the answer; `copy4` the `rlgw demo` task's reward
  (positional character accuracy with a length penalty, trainer/models/demo_task.py), in [0, 1].
- `max_tokens` (default 16): the longest answer generated.
Answers are generated greedily (temperature 0), so a version's score is reproducible. A version's
score is the mean over the prompts. Blank lines and unknown fields are refused, with the line.

The built-in task `copy4` is the demo task's held-out split (prompts never trained on by the
demo, whatever the seed) with its reward: `rlgw gate set --eval copy4 [--items N]`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainer.models import demo_task

DEFAULT_TASK_ITEMS = 32
TASKS = (demo_task.TASK_NAME,)


class EvalFormatError(ValueError):
    """The evaluation cannot be used; the message names the line."""


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class EvalItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[Message] = Field(min_length=1)
    target: str
    scorer: Literal["exact", "contains", "copy4"] = "exact"
    max_tokens: int = Field(default=16, ge=1, le=4096)


def score(item: dict[str, Any], answer: str) -> float:
    """One answer's score in [0, 1] under its item's scorer."""
    target, scorer = item["target"], item.get("scorer", "exact")
    if scorer == "exact":
        return float(answer.strip() == target.strip())
    if scorer == "contains":
        return float(target in answer)
    return demo_task.score(target, answer)


def parse(lines: list[str], source: str) -> list[dict[str, Any]]:
    items = []
    for number, line in enumerate(lines, start=1):
        try:
            items.append(EvalItem.model_validate(json.loads(line)).model_dump())
        except (ValueError, ValidationError) as exc:
            first = str(exc).strip().splitlines()
            why = " ".join(first[:3]) if isinstance(exc, ValidationError) else first[0]
            raise EvalFormatError(f"{source} line {number}: {why}") from None
    if not items:
        raise EvalFormatError(f"{source} holds no prompt")
    return items


def task_items(name: str, count: int = DEFAULT_TASK_ITEMS) -> list[dict[str, Any]]:
    """The built-in task's held-out prompts."""
    if name != demo_task.TASK_NAME:
        raise EvalFormatError(f"no built-in task {name!r} (built in: {', '.join(TASKS)})")
    if count < 1:
        raise EvalFormatError("a task needs at least one item")
    prompts = demo_task.make_prompts("gate", count, demo_task.HELD_OUT_SPLIT)
    return [
        {
            "messages": p.messages,
            "target": p.target,
            "scorer": "copy4",
            "max_tokens": demo_task.MAX_NEW_TOKENS,
        }
        for p in prompts
    ]


def load(source: str, count: int | None = None) -> tuple[str, list[dict[str, Any]]]:
    """A built-in task name or a JSONL file: its name as recorded, and its prompts."""
    if source in TASKS:
        return source, task_items(source, count or DEFAULT_TASK_ITEMS)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalFormatError(
            f"cannot read {source} ({type(exc).__name__}); give a JSONL file or a built-in "
            f"task ({', '.join(TASKS)})"
        ) from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()  # a final newline, or a few
    return str(path.resolve()), parse(lines, source)


def digest(items: list[dict[str, Any]]) -> str:
    """The identity of an evaluation: scores are compared only between equal digests."""
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()
