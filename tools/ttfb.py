"""Time to first byte of streamed completions, directly against vLLM and through the gateway.

Requests alternate between the targets (so load on the machine hits both alike); each one streams
a short completion and the time from sending to the first body byte (TTFB) and to the first event
that follows the backend's first output (first token: for chat the first chunk with a choice, for
the Responses API the first event after response.created/in_progress, for the Messages API
message_start) is taken. Prints JSON with the medians and p90s.

    .venv/bin/python tools/ttfb.py --vllm http://127.0.0.1:8001 --gateway http://127.0.0.1:8000 \
        --model tiny-seed0 --requests 100 [--api-key rlgw_ak_...]

The gateway is measured on /v1 (an implicit session) and on /sessions/<id>/v1 (a named session,
which costs one more database round trip before the backend is reached), for chat completions,
the Responses API and the Messages API (both served through the chat path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import httpx

QUESTION = [{"role": "user", "content": "Say something."}]


def _chat(model: str) -> dict:
    return {"model": model, "messages": QUESTION, "max_tokens": 8, "stream": True}


def _responses(model: str) -> dict:
    return {"model": model, "input": QUESTION, "max_output_tokens": 8, "stream": True}


def _messages(model: str) -> dict:
    return {"model": model, "messages": QUESTION, "max_tokens": 8, "stream": True}


def _first_choice(line: str, path: str) -> bool:
    if not line.startswith("data:"):
        return False
    if path.endswith("/chat/completions"):
        data = line[5:].strip()
        return data != "[DONE]" and bool(json.loads(data).get("choices"))
    # The first event that follows the backend's first chunk: vLLM and the gateway both send
    # message_start (Messages) on it; response.created/in_progress (Responses) come before it.
    kind = json.loads(line[5:]).get("type", "")
    return kind not in ("response.created", "response.in_progress")


def measure(client: httpx.Client, url: str, path: str, body: dict) -> tuple[float, float]:
    start = time.perf_counter()
    ttfb = first = None
    buffer = ""
    with client.stream("POST", url + path, json=body) as reply:
        reply.raise_for_status()
        for raw in reply.iter_text():
            now = time.perf_counter() - start
            if ttfb is None and raw:
                ttfb = now
            buffer += raw
            *lines, buffer = buffer.split("\n")
            if first is None and any(_first_choice(line, path) for line in lines):
                first = now
    assert ttfb is not None, f"no answer from {url}{path}"
    return ttfb * 1000, (first if first is not None else now) * 1000


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--api-key", default="unused")
    args = parser.parse_args()
    session = f"ttfb-{uuid.uuid4().hex[:8]}"
    targets = {
        "vllm chat": (args.vllm, "/v1/chat/completions", _chat),
        "gateway chat": (args.gateway, "/v1/chat/completions", _chat),
        "gateway chat (session)": (
            args.gateway,
            f"/sessions/{session}/v1/chat/completions",
            _chat,
        ),
        "vllm responses": (args.vllm, "/v1/responses", _responses),
        "gateway responses": (args.gateway, "/v1/responses", _responses),
        "vllm messages": (args.vllm, "/v1/messages", _messages),
        "gateway messages": (args.gateway, "/v1/messages", _messages),
    }
    results: dict[str, dict[str, list[float]]] = {n: {"ttfb": [], "first": []} for n in targets}
    headers = {"Authorization": f"Bearer {args.api_key}"}
    with httpx.Client(timeout=60, headers=headers) as client:
        for url, path, body in targets.values():  # warm up every path once
            measure(client, url, path, body(args.model))
        for _ in range(args.requests):
            for name, (url, path, body) in targets.items():
                ttfb, first = measure(client, url, path, body(args.model))
                results[name]["ttfb"].append(ttfb)
                results[name]["first"].append(first)
    report = {
        name: {"ttfb": summary(r["ttfb"]), "first_token": summary(r["first"])}
        for name, r in results.items()
    }
    print(json.dumps({"requests": args.requests, "results": report}, indent=2))


if __name__ == "__main__":
    main()
