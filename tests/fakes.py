"""Stand-ins for vLLM used where a real one is not the point: an upstream transport answering in
vLLM's format (for the proxy), and a tiny HTTP server that looks like vLLM to registration."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from migrations.runner import upgrade

FAKE_MODEL = "fake"
FAKE_BACKEND = "http://fake-backend.invalid"


def _chat_reply(model: str) -> dict[str, Any]:
    return {
        "id": "up",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "token_ids": [7, 8],
                "logprobs": {
                    "content": [
                        {"token": "o", "logprob": -0.25, "bytes": [111], "top_logprobs": []},
                        {"token": "k", "logprob": -0.5, "bytes": [107], "top_logprobs": []},
                    ]
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def _text_reply(model: str) -> dict[str, Any]:
    return {
        "id": "up",
        "object": "text_completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": "ok",
                "token_ids": [7, 8],
                "prompt_token_ids": [1, 2, 3],
                "logprobs": {
                    "tokens": ["o", "k"],
                    "token_logprobs": [-0.25, -0.5],
                    "text_offset": [0, 1],
                    "top_logprobs": [{}, {}],
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def _sse_chunks(chat: bool, model: str) -> list[bytes]:
    chunks = []
    for i, (tok, lp) in enumerate((("o", -0.25), ("k", -0.5))):
        last = i == 1
        choice: dict[str, Any] = {
            "index": 0,
            "token_ids": [7 + i],
            "finish_reason": "stop" if last else None,
        }
        if chat:
            choice["delta"] = {"content": tok}
            choice["logprobs"] = {"content": [{"token": tok, "logprob": lp}]}
        else:
            choice["text"] = tok
            choice["logprobs"] = {"tokens": [tok], "token_logprobs": [lp]}
        chunk = {
            "id": "up",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": model,
            "choices": [choice],
        }
        if i == 0:
            chunk["prompt_token_ids"] = [1, 2, 3]
        chunks.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return [*chunks, b"data: [DONE]\n\n"]


def vllm_like(delay_s: float = 0.0, stream_gap_s: float = 0.0) -> Callable[[httpx.Request], Any]:
    """An httpx.MockTransport handler answering generation requests as vLLM does: after
    `delay_s`, and with `stream_gap_s` between the chunks of a stream."""

    async def handler(request: httpx.Request) -> httpx.Response:
        if delay_s:
            await asyncio.sleep(delay_s)
        path = request.url.path
        if path == "/weight_info":
            return httpx.Response(200, json={"weight_version": "0"})
        if path == "/is_paused":
            return httpx.Response(200, json={"is_paused": False})
        if path == "/health":
            return httpx.Response(200)
        if request.method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            return httpx.Response(404, json={"error": {"message": "not found", "code": 404}})
        try:
            body = json.loads(request.content or b"{}")
        except ValueError:
            return httpx.Response(400, json={"error": {"message": "bad json", "code": 400}})
        chat = path.endswith("chat/completions")
        model = str(body.get("model", FAKE_MODEL)) if isinstance(body, dict) else FAKE_MODEL
        if isinstance(body, dict) and body.get("stream"):

            async def events():
                for i, chunk in enumerate(_sse_chunks(chat, model)):
                    if i and stream_gap_s:
                        await asyncio.sleep(stream_gap_s)
                    yield chunk

            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=events()
            )
        return httpx.Response(200, json=_chat_reply(model) if chat else _text_reply(model))

    return handler


def fake_backend_database(make_database: Callable[[], str]) -> str:
    """A migrated database with model `fake` served by one ACTIVE backend at FAKE_BACKEND."""
    url = make_database()
    upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO models (id, name) VALUES (1, :m)"), {"m": FAKE_MODEL})
        conn.execute(
            text(
                "INSERT INTO backends (model_id, url, state, served_version) "
                "VALUES (1, :url, 'active', 0)"
            ),
            {"url": FAKE_BACKEND},
        )
    engine.dispose()
    return url


# ----------------------------------------------------------------------------- HTTP servers


class FakeVllmServer:
    """A real HTTP server on 127.0.0.1 that answers /v1/models, /weight_info and
    /update_weight_version like vLLM, or redirects every request when `redirect_to` is set.
    It records each request's path and Host header."""

    def __init__(self, model: str | list[str] = FAKE_MODEL, redirect_to: str | None = None) -> None:
        self.models = [model] if isinstance(model, str) else model
        self.redirect_to = redirect_to
        self.label = "default"
        self.requests: list[tuple[str, str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                server.requests.append((self.command, self.path, self.headers.get("Host")))
                if server.redirect_to is not None:
                    self.send_response(302)
                    self.send_header("Location", server.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                if self.path == "/v1/models":
                    payload: Any = {"object": "list", "data": [{"id": m} for m in server.models]}
                elif self.path == "/weight_info":
                    payload = {"weight_version": server.label}
                elif self.path == "/update_weight_version" and self.command == "POST":
                    server.label = str(body.get("new_version"))
                    payload = {}
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeVllmServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def fake_vllm(**kwargs: Any) -> Iterator[FakeVllmServer]:
    with FakeVllmServer(**kwargs) as server:
        yield server
