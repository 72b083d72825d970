"""The benchmarks' fake vLLM (bench/fake_upstream.py): its replies are what vLLM 0.32 writes, the
gateway reads complete, training-eligible evidence from them, and registration accepts it."""

from __future__ import annotations

import json

import httpx
import pytest

from bench.fake_upstream import FakeVllm, start_fake_upstream, stop, upstream_url
from bench.fake_vllm_replies import CHAT, TEXT, Ask, render_reply, render_stream
from gateway.proxy.assembly import StreamAssembly
from gateway.proxy.shaping import CHAT as WIRE_CHAT
from gateway.proxy.shaping import COMPLETIONS as WIRE_TEXT
from gateway.proxy.shaping import extract_choices, upstream_body
from rlgw.eligibility import ineligible_reasons
from rlgw.registry import check_target, probe_backend

from conftest import free_port

WIRE = {CHAT: WIRE_CHAT, TEXT: WIRE_TEXT}
SHAPES = [
    Ask(CHAT, "m", 5),
    Ask(CHAT, "m", 5, n=2, logprobs=True, token_ids=True),
    Ask(TEXT, "m", 5),
    Ask(TEXT, "m", 5, n=2, logprobs=True, token_ids=True),
]


def _events(ask: Ask) -> list[dict]:
    lines = [e.decode()[len("data: ") :].strip() for e in render_stream(ask)]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _ask_as_gateway(api: str, n: int, stream: bool) -> Ask:
    """The shape of what the gateway sends upstream for a plain client request."""
    body = upstream_body(WIRE[api], {"model": "m", "max_tokens": 7, "n": n, "stream": stream})
    logprobs = bool(body["logprobs"]) if api == CHAT else body["logprobs"] is not None
    return Ask(api, "m", 7, n=n, stream=stream, logprobs=logprobs, token_ids=True)


@pytest.mark.parametrize("ask", SHAPES, ids=str)
def test_whole_replies_round_trip_through_vllms_own_models(ask: Ask) -> None:
    if ask.api == CHAT:
        protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
        model = protocol.ChatCompletionResponse
    else:
        protocol = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
        model = protocol.CompletionResponse
    body = render_reply(ask)
    dumped = model.model_validate_json(body).model_dump()
    assert json.dumps(dumped, separators=(",", ":")).encode() == body  # fields, order, nulls


@pytest.mark.parametrize("ask", SHAPES, ids=str)
def test_stream_chunks_validate_as_vllm_chunks(ask: Ask) -> None:
    if ask.api == CHAT:
        protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
        model = protocol.ChatCompletionStreamResponse
    else:
        protocol = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
        model = protocol.CompletionStreamResponse
    for event in render_stream(ask)[:-1]:
        data = event.decode()[len("data: ") :].strip()
        assert model.model_validate_json(data).model_dump_json(exclude_unset=True) == data


def evidence_of(tokens) -> list[str]:
    """What the gateway would find wrong with these tokens as a complete, served record."""
    return ineligible_reasons(
        status="complete",
        finish_reason=tokens.finish_reason,
        policy_version=0,
        prompt_token_ids=tokens.prompt_token_ids,
        output_token_ids=tokens.output_token_ids,
        output_logprobs=tokens.output_logprobs,
    )


@pytest.mark.parametrize("api", [CHAT, TEXT])
@pytest.mark.parametrize("n", [1, 3])
def test_the_gateway_reads_eligible_evidence_from_whole_replies(api: str, n: int) -> None:
    choices = extract_choices(WIRE[api], json.loads(render_reply(_ask_as_gateway(api, n, False))))
    assert sorted(choices) == list(range(n))
    for tokens in choices.values():
        assert len(tokens.output_token_ids) == 7 and tokens.finish_reason == "length"
        assert evidence_of(tokens) == []


@pytest.mark.parametrize("api", [CHAT, TEXT])
@pytest.mark.parametrize("n", [1, 3])
def test_the_gateway_reads_eligible_evidence_from_streams(api: str, n: int) -> None:
    assembly = StreamAssembly(WIRE[api])
    for chunk in _events(_ask_as_gateway(api, n, True)):
        assembly.add(chunk)
    assert assembly.finished(n)
    for index in range(n):
        tokens = assembly.choices[index].tokens
        assert len(tokens.output_token_ids) == 7
        assert evidence_of(tokens) == []


async def test_the_app_answers_like_vllm() -> None:
    transport = httpx.ASGITransport(app=FakeVllm("m"))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as http:
        assert (await http.get("/v1/models")).json()["data"][0]["id"] == "m"
        assert (await http.get("/weight_info")).json() == {"weight_version": "default"}
        await http.post("/update_weight_version", json={"new_version": "0"})
        assert (await http.get("/weight_info")).json() == {"weight_version": "0"}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
        reply = (await http.post("/v1/chat/completions", json=body)).json()
        assert reply["usage"]["completion_tokens"] == 9
        assert reply["choices"][0]["finish_reason"] == "length"
        other = await http.post("/v1/chat/completions", json={**body, "model": "x"})
        assert other.status_code == 404 and other.json()["error"]["code"] == 404
        bad = await http.post("/v1/completions", content=b"{not json")
        assert bad.status_code == 400


def test_a_started_fake_upstream_passes_backend_registration(tmp_path) -> None:
    port = free_port()
    proc = start_fake_upstream(port, "bench-model", log_path=tmp_path / "upstream.log")
    try:
        url = upstream_url(port)
        assert probe_backend(check_target(url, None), "bench-model") == 0
        assert httpx.get(url + "/weight_info").json() == {"weight_version": "0"}
    finally:
        stop(proc)
    assert proc.poll() is not None
