"""Request model of the Responses API: the fields the gateway translates are typed; other fields
are passed to the backend under the same name when vLLM's chat API knows them (sampling
extensions), and otherwise ignored, as vLLM's own Responses endpoint ignores unknown fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    input: str | list[dict[str, Any]] = Field(
        description="A user message, or a list of input items: messages (user, system, "
        "developer, assistant), function_call, function_call_output, reasoning."
    )
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="Function tools only (`type: function`)."
    )
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: StrictInt | None = Field(
        default=None, ge=1, description="At most RLGW_MAX_TOKENS_CAP (400 above)."
    )
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool | None = False
    text: dict[str, Any] | None = Field(
        default=None, description="`format`: text, json_object or json_schema."
    )
    include: list[str] | None = Field(
        default=None,
        description="`message.output_text.logprobs` returns each output token's log-prob.",
    )
    previous_response_id: str | None = Field(
        default=None,
        description="Not supported: the gateway holds no conversation state; send the whole "
        "conversation as `input` (400).",
    )
    store: bool | None = Field(default=None, description="Ignored: nothing is stored for reuse.")
    background: bool | None = Field(default=None, description="Only false (400 otherwise).")
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    user: str | None = None
