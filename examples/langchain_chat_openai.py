"""LangChain's ChatOpenAI through the gateway: a tool-calling turn, a streamed answer with usage,
and n=2 choices (each choice is recorded as a completion of its own).

    RLGW_BASE_URL=http://127.0.0.1:8000/sessions/my-episode RLGW_MODEL=tiny-seed0 \
        python examples/langchain_chat_openai.py
"""

from __future__ import annotations

from _env import API_KEY, BASE_URL, EXTRA_BODY, MODEL
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"It is sunny in {city}."


def main() -> None:
    llm = ChatOpenAI(
        base_url=f"{BASE_URL}/v1",  # the only change: the gateway's base URL
        api_key=API_KEY,
        model=MODEL,
        max_tokens=64,
        stream_usage=True,
        extra_body=EXTRA_BODY or None,
    )
    question = HumanMessage("What is the weather in Paris?")
    # Force a tool call (a real model would choose it by itself).
    call = llm.bind_tools([get_weather], tool_choice="get_weather").invoke([question])
    print("tool calls:", call.tool_calls)
    history = [question, call]
    for tool_call in call.tool_calls:
        history.append(
            ToolMessage(get_weather.invoke(tool_call["args"]), tool_call_id=tool_call["id"])
        )
    answer = None
    for chunk in llm.stream(history):  # streamed; the last chunk carries the usage
        answer = chunk if answer is None else answer + chunk
    print("answer:", repr(answer.content), "usage:", answer.usage_metadata)

    several = ChatOpenAI(
        base_url=f"{BASE_URL}/v1", api_key=API_KEY, model=MODEL, n=2, max_tokens=16
    ).generate([[HumanMessage("Name a colour.")]])
    print("n=2:", [g.message.content for g in several.generations[0]])


if __name__ == "__main__":
    main()
