"""Real agent stacks pointed at the gateway by their base URL alone: the OpenAI Agents SDK
(Responses API), LangChain's ChatOpenAI (chat completions) and the examples under examples/.
Every model call they make is recorded, and a tool-using episode links its turns."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import httpx
import pytest

from compat_helpers import END_NOW, NO_WHITESPACE, only_sampling_reasons
from conftest import MODEL_NAME, fetch_record

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=120) as client:
        yield client


def session_completions(http: httpx.Client, session_id: str) -> list[dict]:
    return http.get(f"/v1/sessions/{session_id}").json()["completions"]


def assert_chain(completions: list[dict], admin_http) -> None:
    """Each turn continues the one before it; all are recorded whole."""
    assert [c["parent_id"] for c in completions] == [None] + [c["id"] for c in completions[:-1]]
    for c in completions:
        assert c["status"] == "complete" and not c["is_orphan"]
        record = fetch_record(admin_http, c["id"])
        # greedy, biased, forced tool calls: not trained on, for those reasons only
        assert only_sampling_reasons(record), record["ineligible_reasons"]
        assert record["prompt_token_ids"] and record["output_token_ids"]
        assert len(record["output_logprobs"]) == len(record["output_token_ids"])


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_openai_agents_sdk_tool_loop_is_recorded(http, admin_http, streamed):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}."

    session = http.post("/v1/sessions", json={}).json()

    async def run():
        client = AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
        agent = Agent(
            name="weather",
            instructions="Use the tool.",
            tools=[get_weather],
            model=OpenAIResponsesModel(model=MODEL_NAME, openai_client=client),
            # The first turn must call the tool (the SDK resets tool_choice after it); the
            # biases keep the tiny model's JSON short and end its free text at once.
            model_settings=ModelSettings(
                tool_choice="required",
                temperature=0,
                max_tokens=150,
                extra_body={"logit_bias": {**NO_WHITESPACE, **END_NOW}},
            ),
        )
        if not streamed:
            result = await Runner.run(agent, "Weather in Paris?", max_turns=4)
        else:
            result = Runner.run_streamed(agent, "Weather in Paris?", max_turns=4)
            kinds = {event.type async for event in result.stream_events()}
            assert "raw_response_event" in kinds
        await client.close()
        return result

    result = asyncio.run(run())
    assert len(calls) == 1 and calls[0] in ("Paris", "Oslo")
    response_ids = [r.response_id for r in result.raw_responses]
    completions = session_completions(http, session["id"])
    assert [c["id"] for c in completions] == response_ids and len(response_ids) == 2
    assert completions[0]["finish_reason"] in ("tool_calls", "stop")
    assert_chain(completions, admin_http)
    second = fetch_record(admin_http, response_ids[1])
    assert second["api"] == "responses" and second["stream"] is streamed
    tool_message = second["backend_request"]["messages"][-1]
    assert tool_message["role"] == "tool" and "Sunny" in tool_message["content"]


def test_langchain_chat_openai_tools_streaming_and_n(http, admin_http, gateway_url):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    session = http.post("/v1/sessions", json={}).json()
    llm = ChatOpenAI(
        base_url=session["base_url"],
        api_key="unused",
        model=MODEL_NAME,
        temperature=0,
        max_tokens=150,
        stream_usage=True,
        max_retries=0,
        extra_body={"logit_bias": NO_WHITESPACE},
    )

    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        return "Sunny."

    question = HumanMessage("Weather in Paris?")
    call = llm.bind_tools([get_weather], tool_choice="get_weather", strict=True).invoke([question])
    (tool_call,) = call.tool_calls
    assert tool_call["name"] == "get_weather" and tool_call["args"]["city"] in ("Paris", "Oslo")
    history = [question, call, ToolMessage("Sunny.", tool_call_id=tool_call["id"])]
    answer = None
    for chunk in llm.bind(max_tokens=5).stream(history):
        answer = chunk if answer is None else answer + chunk
    assert answer.usage_metadata["output_tokens"] == 5  # stream_options.include_usage
    assert_chain(session_completions(http, session["id"]), admin_http)

    several = ChatOpenAI(
        base_url=f"{gateway_url}/v1", api_key="unused", model=MODEL_NAME, n=2, max_tokens=3
    ).generate([[HumanMessage("Name a colour.")]])
    assert len(several.generations[0]) == 2


@pytest.mark.parametrize(
    "example", ["openai_agents_sdk.py", "langchain_chat_openai.py", "anthropic_sdk.py"]
)
def test_examples_run_against_the_gateway(http, admin_http, example):
    session = http.post("/v1/sessions", json={}).json()
    env = {
        **os.environ,
        "RLGW_BASE_URL": session["base_url"].removesuffix("/v1"),
        "RLGW_MODEL": MODEL_NAME,
        "RLGW_API_KEY": "unused",
        # The tiny model would write until max_tokens; the Agents SDK treats that as a failure.
        "RLGW_EXTRA_BODY": json.dumps({"logit_bias": END_NOW}),
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    completions = session_completions(http, session["id"])
    assert completions and all(c["status"] == "complete" for c in completions)
