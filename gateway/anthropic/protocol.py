"""Request models of the Anthropic Messages API, as far as the gateway translates them. Fields it
does not know are ignored, as vLLM's own Messages endpoint ignores them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

BlockType = Literal[
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
]


class ContentBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: BlockType
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    defer_loading: bool | None = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class SystemBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    messages: list[Message] = Field(min_length=1)
    max_tokens: StrictInt = Field(ge=1, description="At most RLGW_MAX_TOKENS_CAP (400 above).")
    system: str | list[SystemBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    messages: list[Message] = Field(min_length=1)
    system: str | list[SystemBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
