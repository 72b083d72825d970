"""An echoed text completion: the prompt's text goes back on each choice once, and its log-probs
never reach the record's output."""

from __future__ import annotations

import math

from gateway.proxy.echo import EchoStream, echo_for, output_only, restore
from gateway.proxy.shaping import Extracted
from rlgw.eligibility import ineligible_reasons

ECHO = echo_for({"prompt": "Hi there", "echo": True, "logprobs": 1, "max_tokens": 2}, "Hi there")


def tokens(logprobs: list[float | None]) -> Extracted:
    return Extracted(
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[7, 8],
        output_logprobs=logprobs,
        finish_reason="length",
    )


def test_the_prompt_log_probs_are_left_out_of_the_output():
    out = output_only(tokens([None, -1.0, -2.0, -0.5, -0.25]), ECHO)
    assert (out.prompt_token_ids, out.output_token_ids) == ([1, 2, 3], [7, 8])
    assert out.output_logprobs == [-0.5, -0.25]


def test_misaligned_log_probs_are_refused_by_eligibility():
    short = output_only(tokens([None, -1.0, -0.5, -0.25]), ECHO)  # one prompt entry missing
    assert short.output_logprobs == [-0.25]
    shifted = output_only(tokens([-1.0, -2.0, -0.5, None, -0.25]), ECHO)
    assert math.isnan(shifted.output_logprobs[0])
    for bad in (short, shifted):
        reasons = ineligible_reasons(
            status="complete",
            finish_reason=bad.finish_reason,
            policy_version=0,
            prompt_token_ids=bad.prompt_token_ids,
            output_token_ids=bad.output_token_ids,
            output_logprobs=bad.output_logprobs,
        )
        assert reasons and "log-prob" in reasons[0]


def test_max_tokens_zero_keeps_no_output():
    only = echo_for({"echo": True, "max_tokens": 0, "logprobs": 1}, "Hi")
    out = output_only(tokens([None, -1.0, -2.0]), only)
    assert (out.output_token_ids, out.output_logprobs) == ([], [])


def test_the_text_goes_back_once_per_choice_of_a_stream():
    stream = EchoStream(ECHO)
    first = {"choices": [{"index": 0, "text": " A"}, {"index": 1, "text": " B"}]}
    later = {"choices": [{"index": 0, "text": " C"}]}
    stream.chunk(first)
    stream.chunk(later)
    assert [c["text"] for c in first["choices"]] == ["Hi there A", "Hi there B"]
    assert later["choices"][0]["text"] == " C"


def test_prompt_log_probs_the_client_did_not_ask_for_are_hidden():
    unasked = echo_for({"echo": True, "max_tokens": 1}, "Hi")
    choice = {"text": " x", "prompt_logprobs": [None, {"5": {"logprob": -1.0}}]}
    restore(choice, unasked)
    assert choice == {"text": "Hi x", "prompt_logprobs": None}
    asked = {"text": " x", "prompt_logprobs": [None]}
    restore(asked, ECHO)
    assert asked["prompt_logprobs"] == [None]
