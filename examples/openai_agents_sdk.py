"""The OpenAI Agents SDK through the gateway: the agent uses the Responses API (the SDK's
default), calls a function tool, and every model call is recorded token for token.

    RLGW_BASE_URL=http://127.0.0.1:8000/sessions/my-episode RLGW_MODEL=tiny-seed0 \
        python examples/openai_agents_sdk.py
"""

from __future__ import annotations

import asyncio

from _env import API_KEY, BASE_URL, EXTRA_BODY, MODEL
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)  # traces would go to OpenAI's servers


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"It is sunny in {city}."


async def main() -> None:
    # The only change an agent needs: the base URL (and the gateway's key).
    client = AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key=API_KEY)
    agent = Agent(
        name="assistant",
        instructions="Answer briefly. Use the tool for weather questions.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(max_tokens=200, extra_body=EXTRA_BODY or None),
    )
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    print("final output:", repr(result.final_output))
    # Each model call's response id is the gateway's record id (GET /admin/completions/{id}).
    print("recorded:", [r.response_id for r in result.raw_responses])


if __name__ == "__main__":
    asyncio.run(main())
