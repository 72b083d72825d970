"""Shared by the compatibility tests (chat, Responses, Messages, agent stacks)."""

from __future__ import annotations

import httpx
import numpy as np

from rlgw.sampling import sampling_problems

# Strict tool schemas are enforced by vLLM's grammar, but JSON allows whitespace anywhere and the
# tiny random model pads with it forever; tests that need a finished tool call forbid whitespace
# (tab, newline, carriage return, space) with logit_bias, a pass-through sampling field.
NO_WHITESPACE = {"9": -100, "10": -100, "13": -100, "32": -100}
# The tiny model's <|im_end|> (trainer/models/init_model.py): a large bias ends free text at once,
# so an agent loop that needs a finished (not length-cut) answer gets one.
END_NOW = {"258": 100}


def only_sampling_reasons(record: dict) -> bool:
    """Whether every reason a record may not be trained on is one its recorded sampling settings
    give (rlgw/sampling.py), in their order, and nothing else: its evidence is whole. The
    compatibility tests decode greedily (to compare with vLLM token for token) and steer the tiny
    model with logit_bias and forced tool calls, which the trainer cannot reproduce."""
    sampling = record["sampling"]
    return sampling is not None and record["ineligible_reasons"] == sampling_problems(sampling)


def replay_greedy_on_vllm(vllm_url: str, record: dict) -> dict:
    """The stored translated chat request (`backend_request`) sent straight to vLLM's chat
    endpoint, greedy, with token ids and log-probs, not streamed: vLLM's own answer to it."""
    backend = dict(record["backend_request"], return_token_ids=True, logprobs=True)
    assert backend.get("temperature") == 0, backend  # the client asked for greedy decoding
    backend.pop("stream", None)
    backend.pop("stream_options", None)
    reply = httpx.post(f"{vllm_url}/v1/chat/completions", json=backend, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def assert_token_exact(record: dict, vllm_url: str) -> dict:
    """A translated (Responses or Messages) record holds exactly what vLLM's chat API produces
    for the stored `backend_request`: the same prompt and output token ids, the same log-probs
    (within 1e-4). Returns vLLM's answer."""
    want = replay_greedy_on_vllm(vllm_url, record)
    choice = want["choices"][0]
    assert record["prompt_token_ids"] == want["prompt_token_ids"]
    assert record["output_token_ids"] == choice["token_ids"]
    expected = [t["logprob"] for t in choice["logprobs"]["content"]]
    assert len(record["output_logprobs"]) == len(expected) == len(choice["token_ids"])
    np.testing.assert_allclose(record["output_logprobs"], expected, rtol=0, atol=1e-4)
    return want
