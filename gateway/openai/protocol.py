"""Request models of the OpenAI surface: the fields the gateway relies on are typed; the rest pass
through untouched to the backend, which accepts or refuses them as it would directly."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

# A token id as the backend and the record hold it (int32): larger ids are refused here, not
# left to overflow the recorder.
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1, max_length=64)
    content: Any = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = None


class GenerationRequest(BaseModel):
    """Fields shared by both generation APIs, OpenAI's first, then vLLM's extensions."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    n: StrictInt | None = Field(
        default=None,
        ge=1,
        description="Choices to generate, at most RLGW_MAX_N. Each is recorded as a completion of "
        "its own: choice i under `<id>-<i>` (choice 0 under the reply's `id`), named by the "
        "choice's `completion_id` field and the X-Completion-Ids header; they share a "
        "`sibling_group`.",
    )
    max_tokens: StrictInt | None = Field(
        default=None, ge=1, description="At most RLGW_MAX_TOKENS_CAP (400 above)."
    )
    max_completion_tokens: StrictInt | None = Field(
        default=None, ge=1, description="At most RLGW_MAX_TOKENS_CAP (400 above)."
    )
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = Field(
        default=None,
        description="vLLM extension: include prompt_token_ids and per-choice token_ids in the "
        "response. The gateway always asks the backend for them and records them; they reach "
        "the client only when this is true.",
    )


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = Field(
        default=None,
        description="Not supported on chat completions (400 when true): vLLM would put the last "
        "message's text before the reply, which the record and the lineage would take for output. "
        "Score a prompt with `echo` on /v1/completions.",
    )

    @field_validator("echo")
    @classmethod
    def _no_chat_echo(cls, echo: bool | None) -> bool | None:
        if echo:
            raise ValueError(
                "echo is not supported on chat completions by this gateway: "
                "use /v1/completions with echo to score a prompt"
            )
        return echo


class CompletionRequest(GenerationRequest):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = Field(
        default=None,
        description="Each choice starts with the prompt's text and (with `logprobs`) its "
        "log-probs, as vLLM serves it; the record keeps prompt and output tokens apart "
        "(docs/compatibility.md).",
    )
    max_tokens: StrictInt | None = Field(
        default=None,
        ge=0,
        description="At most RLGW_MAX_TOKENS_CAP (400 above). 0 only with `echo` (vLLM: score "
        "the prompt, generate nothing); without it, a 400 before anything is recorded.",
    )
    truncate_prompt_tokens: int | None = None

    @model_validator(mode="after")
    def _echo_of_the_whole_prompt(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError(
                "max_tokens 0 is allowed only with echo (to score the prompt): "
                "ask for at least 1 token"
            )
        if self.echo and self.truncate_prompt_tokens is not None:
            raise ValueError(
                "echo with truncate_prompt_tokens is not supported by this gateway: "
                "send the prompt already truncated"
            )
        return self

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: Any) -> Any:
        batched = isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))
        if batched and len(prompt) != 1:
            raise ValueError("only one prompt per request is supported by this gateway version")
        return prompt
