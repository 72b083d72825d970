"""Text completions with `echo`: each choice starts with the prompt's text and log-probs, as vLLM
serves it, while the record keeps the prompt's tokens and the output's apart.

The gateway always asks vLLM for token ids (`return_token_ids`), and vLLM then leaves the prompt's
*text* out of an echoed choice (it still echoes the prompt's log-probs). The gateway puts the text
back where vLLM would have: a text prompt as the client sent it, token ids as the backend decodes
them (its `/detokenize`, the same `tokenizer.decode` vLLM echoes with).

The record: `prompt_token_ids` from the backend, `output_token_ids` the choice's `token_ids`
(never the prompt's), `output_logprobs` the choice's log-probs after the prompt's (one per prompt
token, the first null), so an echoed completion is recorded as the same request without `echo`.
With `max_tokens` 0 nothing is generated for the client: no output tokens, and the reason
ECHO_ONLY (rlgw/eligibility.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .shaping import COMPLETIONS, Extracted


@dataclass(frozen=True)
class Echo:
    """What an echoing request puts before each choice."""

    text: str  # the prompt's text
    generates: bool  # False with max_tokens 0: only the prompt is scored
    hide_prompt_logprobs: bool  # the client asked for no log-probs (the gateway did)


def echoes(wire: str, body: dict[str, Any]) -> bool:
    return wire == COMPLETIONS and bool(body.get("echo"))


def the_prompt(body: dict[str, Any]) -> str | list[int]:
    """The request's one prompt (a batch of one unwrapped): text or token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    return prompt  # type: ignore[return-value]


def echo_for(body: dict[str, Any], text: str) -> Echo:
    return Echo(
        text=text,
        generates=body.get("max_tokens") != 0,
        hide_prompt_logprobs=body.get("logprobs") is None and body.get("prompt_logprobs") is None,
    )


def restore(choice: dict[str, Any], echo: Echo) -> None:
    """A choice of a whole reply (or the first chunk of a streamed choice) as vLLM echoes it."""
    choice["text"] = echo.text + (choice.get("text") or "")
    if echo.hide_prompt_logprobs and choice.get("prompt_logprobs") is not None:
        choice["prompt_logprobs"] = None


@dataclass
class EchoStream:
    """Restores the echo on the first chunk of each streamed choice."""

    echo: Echo
    seen: set[int] = field(default_factory=set)

    def chunk(self, chunk: dict[str, Any]) -> None:
        for position, choice in enumerate(chunk.get("choices") or ()):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            index = index if isinstance(index, int) else position
            if index not in self.seen:
                self.seen.add(index)
                restore(choice, self.echo)


def output_only(tokens: Extracted, echo: Echo) -> Extracted:
    """An echoed choice's tokens with the prompt's log-probs left out. Misaligned log-probs (a
    null where an output token's should be) become NaN, which eligibility refuses."""
    if not echo.generates:  # vLLM's hidden sampled token has no log-prob: keep no output
        return replace(tokens, output_token_ids=[], output_logprobs=[])
    skip = len(tokens.prompt_token_ids or ())
    logprobs = [math.nan if lp is None else lp for lp in tokens.output_logprobs[skip:]]
    return replace(tokens, output_logprobs=logprobs)
