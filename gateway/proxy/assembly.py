"""A streamed reply, accumulated chunk by chunk into the token record and the response the
client saw (what a whole reply would have been)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .shaping import CHAT, Extracted, choice_logprobs, prompt_ids, sibling_id


@dataclass
class ChoiceAssembly:
    """One choice of a stream, accumulated."""

    index: int
    tokens: Extracted = field(default_factory=Extracted)
    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    role: str = "assistant"
    stop_reason: Any = None  # vLLM: the stop string or stop token that ended it

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.text)}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message


@dataclass
class StreamAssembly:
    """Accumulates stream chunks into the token record and the response the client saw."""

    api: str
    choices: dict[int, ChoiceAssembly] = field(default_factory=dict)
    prompt_token_ids: list[int] | None = None
    usage: dict[str, Any] | None = None
    first: dict[str, Any] | None = None
    echo_text: str = ""  # an echoing text completion's prompt, before each choice's text

    def choice(self, index: int) -> ChoiceAssembly:
        if index not in self.choices:
            self.choices[index] = ChoiceAssembly(index)
            self.choices[index].tokens.prompt_token_ids = self.prompt_token_ids
        return self.choices[index]

    def finished(self, n: int) -> bool:
        return all(self.choice(i).tokens.finish_reason for i in range(n))

    def add(self, chunk: dict[str, Any]) -> None:
        if self.first is None:
            self.first = {k: chunk.get(k) for k in ("object", "created", "model")}
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if self.prompt_token_ids is None and chunk.get("prompt_token_ids") is not None:
            self._set_prompt(list(chunk["prompt_token_ids"]))
        for position, choice in enumerate(chunk.get("choices") or ()):
            index = choice.get("index")
            slot = self.choice(index if isinstance(index, int) else position)
            if slot.tokens.prompt_token_ids is None:
                ids = prompt_ids(chunk, choice)
                if ids is not None:
                    slot.tokens.prompt_token_ids = ids
                    if self.prompt_token_ids is None:
                        self._set_prompt(ids)
            slot.tokens.output_token_ids.extend(choice.get("token_ids") or ())
            slot.tokens.output_logprobs.extend(choice_logprobs(self.api, choice))
            if choice.get("finish_reason"):
                slot.tokens.finish_reason = choice["finish_reason"]
                slot.stop_reason = choice.get("stop_reason")
            if self.api == CHAT:
                self._add_delta(slot, choice.get("delta") or {})
            elif choice.get("text"):
                slot.text.append(choice["text"])

    def _set_prompt(self, ids: list[int]) -> None:
        self.prompt_token_ids = ids
        for slot in self.choices.values():
            if slot.tokens.prompt_token_ids is None:
                slot.tokens.prompt_token_ids = ids

    @staticmethod
    def _add_delta(slot: ChoiceAssembly, delta: dict[str, Any]) -> None:
        slot.role = delta.get("role") or slot.role
        if delta.get("content"):
            slot.text.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            entry = slot.tool_calls.setdefault(
                call.get("index", 0),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            entry["id"] = call.get("id") or entry["id"]
            fn = call.get("function") or {}
            entry["function"]["name"] += fn.get("name") or ""
            entry["function"]["arguments"] += fn.get("arguments") or ""

    def choice_view(self, index: int) -> dict[str, Any]:
        """Choice `index` in the non-streamed shape."""
        slot = self.choice(index)
        if self.api == CHAT:
            choice: dict[str, Any] = {"index": index, "message": slot.message()}
        else:
            choice = {"index": index, "text": "".join(slot.text)}
        choice["finish_reason"] = slot.tokens.finish_reason
        return choice

    def response(self, record_id: str, only: int | None = None) -> dict[str, Any]:
        """The reply as the client assembled it, in the non-streamed shape (only choice `only`
        when given: a sibling's record)."""
        first = self.first or {}
        indexes = sorted(self.choices) if only is None else [only]
        choices = []
        for i in indexes:
            choice = self.choice_view(i)
            if self.echo_text:
                choice["text"] = self.echo_text + choice["text"]
            choice["completion_id"] = sibling_id(record_id, i)
            choices.append(choice)
        out = {
            "id": record_id,
            "object": "chat.completion" if self.api == CHAT else "text_completion",
            "created": first.get("created"),
            "model": first.get("model"),
            "choices": choices or [self.choice_view(0)],
        }
        if self.usage:
            out["usage"] = self.usage
        return out
