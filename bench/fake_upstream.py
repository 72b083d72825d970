"""A fast stand-in for a vLLM server (benchmarks, soaks): pre-rendered replies in vLLM's format.

Run it as its own process:

    .venv/bin/python bench/fake_upstream.py --port P [--model NAME] [--delay-ms MS] [--token-ms MS]

Python API (stable: bench/gateway_overhead.py, bench/soak.py and tests/test_soak.py use it; import
it as `bench.fake_upstream` with the repository root on sys.path):

    from bench.fake_upstream import DEFAULT_MODEL, start_fake_upstream, stop, upstream_url

    proc = start_fake_upstream(port, model="fake")   # subprocess.Popen, healthy when returned
    url = upstream_url(port)                         # http://127.0.0.1:<port>
    ...                                              # register url as a backend of "fake"
    stop(proc)                                       # SIGTERM, then SIGKILL after timeout_s

    start_fake_upstream(port, model=DEFAULT_MODEL, *, host="127.0.0.1", delay_ms=0.0,
                        token_ms=0.0, log_path=None, timeout_s=30.0) -> subprocess.Popen
    stop(proc, timeout_s=10.0) -> None

What it serves (what the gateway and `rlgw register` use of vLLM):
- GET /health (200, empty), GET /v1/models, GET /weight_info, POST /update_weight_version
  (`{"new_version": ...}`; the label starts as vLLM's "default", so registration labels it "0"),
  GET /is_paused, POST /tokenize (`count` = the fixed prompt length).
- POST /v1/chat/completions and POST /v1/completions, streamed or not: exactly `max_tokens` (or
  `max_completion_tokens`; default 16) tokens per choice, finish_reason "length", `n` choices,
  `prompt_token_ids` / per-choice `token_ids` when `return_token_ids` is true, per-token log-probs
  when `logprobs` is asked, usage (in a stream only with `stream_options.include_usage`). The
  prompt is not read: every prompt is 32 tokens (`--prompt-tokens`). Formats and field order:
  bench/fake_vllm_replies.py.
- A request naming another model gets vLLM's 404; malformed JSON a 400.

Timing: no delay by default. `--delay-ms` waits before answering; `--token-ms` adds that much per
generated token (spread between stream events; added to the delay of a whole reply). Without them
the server is CPU-bound on one core (uvicorn + uvloop + httptools, a raw ASGI app).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench.` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fake_vllm_replies import (  # noqa: E402
    CHAT,
    TEXT,
    Ask,
    error_body,
    models_body,
    render_reply,
    render_stream,
)

DEFAULT_MODEL = "fake"
DEFAULT_MAX_TOKENS = 16
MAX_MODEL_LEN = 32_768
_CACHE_LIMIT = 512
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]
_PATHS = {"/v1/chat/completions": CHAT, "/v1/completions": TEXT}


class FakeVllm:
    """The ASGI app: routes by path, answers from a cache of rendered replies."""

    def __init__(
        self, model: str, *, delay_ms: float = 0.0, token_ms: float = 0.0, prompt_tokens: int = 32
    ) -> None:
        self.model = model
        self.delay_s, self.token_s = delay_ms / 1000.0, token_ms / 1000.0
        self.prompt_tokens = prompt_tokens
        self.created = int(time.time())
        self.rid = uuid.uuid4().hex
        self.weight_version = "default"
        self.models = models_body(model, self.created, MAX_MODEL_LEN)
        self._replies: dict[Ask, Any] = {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if method == "POST" and path in _PATHS:
            await self._generate(_PATHS[path], body, send)
        elif method == "GET" and path == "/health":
            await _send(send, 200, b"", [])
        elif method == "GET" and path == "/v1/models":
            await _send(send, 200, self.models)
        elif method == "GET" and path == "/weight_info":
            await _send(send, 200, json.dumps({"weight_version": self.weight_version}).encode())
        elif method == "POST" and path == "/update_weight_version":
            self.weight_version = str(_loads(body).get("new_version"))
            reply = {"success": True, "new_version": self.weight_version}
            await _send(send, 200, json.dumps(reply).encode())
        elif method == "GET" and path == "/is_paused":
            await _send(send, 200, b'{"is_paused":false}')
        elif method == "POST" and path == "/tokenize":
            reply = {"count": self.prompt_tokens, "max_model_len": MAX_MODEL_LEN}
            reply["tokens"] = Ask(CHAT, self.model, 1, prompt_tokens=self.prompt_tokens).prompt_ids
            await _send(send, 200, json.dumps(reply).encode())
        else:
            await _send(send, 404, error_body(404, "Not Found", "NotFoundError"))

    def _ask(self, api: str, req: dict[str, Any]) -> Ask:
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or not 0 < max_tokens <= MAX_MODEL_LEN:
            raise ValueError(f"max_tokens must be an integer in 1..{MAX_MODEL_LEN}")
        n = req.get("n") or 1
        if not isinstance(n, int) or not 0 < n <= 128:
            raise ValueError("n must be an integer in 1..128")
        options = req.get("stream_options") or {}
        logprobs = bool(req.get("logprobs")) if api == CHAT else req.get("logprobs") is not None
        return Ask(
            api=api,
            model=self.model,
            max_tokens=max_tokens,
            n=n,
            stream=bool(req.get("stream")),
            logprobs=logprobs,
            token_ids=bool(req.get("return_token_ids")),
            include_usage=bool(req.get("stream") and options.get("include_usage")),
            prompt_tokens=self.prompt_tokens,
            created=self.created,
            rid=self.rid,
        )

    def _rendered(self, ask: Ask) -> Any:
        reply = self._replies.get(ask)
        if reply is None:
            if len(self._replies) >= _CACHE_LIMIT:
                self._replies.clear()
            reply = render_stream(ask) if ask.stream else render_reply(ask)
            self._replies[ask] = reply
        return reply

    async def _generate(self, api: str, body: bytes, send: Any) -> None:
        try:
            req = _loads(body)
            if req.get("model") != self.model:
                message = f"The model `{req.get('model')}` does not exist."
                await _send(send, 404, error_body(404, message, "NotFoundError"))
                return
            ask = self._ask(api, req)
        except ValueError as exc:
            await _send(send, 400, error_body(400, str(exc)))
            return
        reply = self._rendered(ask)
        if not ask.stream:
            wait = self.delay_s + self.token_s * ask.max_tokens
            if wait:
                await asyncio.sleep(wait)
            await _send(send, 200, reply)
            return
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        gap = self.token_s / ask.n if ask.n else 0.0
        for event in reply:
            if gap:
                await asyncio.sleep(gap)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _loads(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        raise ValueError("the request body is not valid JSON") from None
    if not isinstance(value, dict):
        raise ValueError("the request body is not a JSON object")
    return value


async def _send(send: Any, status: int, body: bytes, headers: list | None = None) -> None:
    headers = list(_JSON if headers is None else headers)
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ----------------------------------------------------------------------------- process helpers


def upstream_url(port: int, host: str = "127.0.0.1") -> str:
    """The base URL of a fake upstream started on `port` (register this as the backend)."""
    return f"http://{host}:{port}"


_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def _healthy(url: str) -> bool:
    try:
        with _LOCAL.open(url + "/health", timeout=1.0) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_fake_upstream(
    port: int,
    model: str = DEFAULT_MODEL,
    *,
    host: str = "127.0.0.1",
    delay_ms: float = 0.0,
    token_ms: float = 0.0,
    log_path: str | os.PathLike | None = None,
    timeout_s: float = 30.0,
) -> subprocess.Popen:
    """Start the fake upstream as a subprocess (its own session) and wait until /health answers.
    Raises RuntimeError (with the end of its log) when it exits or does not answer in time."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--port", str(port), "--host", host]
    cmd += ["--model", model, "--delay-ms", str(delay_ms), "--token-ms", str(token_ms)]
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log_path:
            log.close()
    url = upstream_url(port, host)
    deadline = time.monotonic() + timeout_s
    while not _healthy(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            tail = Path(log_path).read_text(errors="replace")[-2000:] if log_path else ""
            raise RuntimeError(f"the fake upstream on port {port} did not start\n{tail}")
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Stop a process started by start_fake_upstream (SIGTERM, then SIGKILL)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    p.add_argument("--delay-ms", type=float, default=0.0, help="wait before answering")
    p.add_argument("--token-ms", type=float, default=0.0, help="extra time per generated token")
    p.add_argument("--prompt-tokens", type=int, default=32, help="prompt length reported")
    args = p.parse_args(argv)
    app = FakeVllm(
        args.model,
        delay_ms=args.delay_ms,
        token_ms=args.token_ms,
        prompt_tokens=args.prompt_tokens,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        loop="auto",
        http="auto",
        backlog=4096,
        timeout_keep_alive=300,
    )


if __name__ == "__main__":
    main()
