"""The sampling settings recorded for a completion, and the ones that make it ineligible."""

from __future__ import annotations

import pytest

from rlgw.eligibility import ReasonKind, ineligible_reasons, kind_of
from rlgw.sampling import DEFAULTS, effective_sampling, sampling_problems

GOOD = dict(
    status="complete",
    finish_reason="stop",
    policy_version=0,
    prompt_token_ids=[1, 2],
    output_token_ids=[3, 4],
    output_logprobs=[-0.1, -0.2],
)


def test_an_omitted_field_takes_vllms_default():
    s = effective_sampling({"model": "m", "messages": []})
    assert {k: s[k] for k in DEFAULTS} == DEFAULTS
    assert s["min_tokens"] == 0 and s["n"] == 1 and s["seed"] is None
    assert not any(s[k] for k in ("logit_bias", "bad_words", "allowed_token_ids", "beam_search"))
    assert s["structured_output"] is None
    assert sampling_problems(s) == []


def test_null_is_the_default_and_given_values_are_kept():
    s = effective_sampling({"temperature": None, "top_p": 0.9, "top_k": 20, "min_p": 0.05})
    assert (s["temperature"], s["top_p"], s["top_k"], s["min_p"]) == (1.0, 0.9, 20, 0.05)
    assert isinstance(s["top_k"], int) and isinstance(s["temperature"], float)
    assert sampling_problems(s) == []  # the trainer reproduces these


def test_a_tiny_positive_temperature_is_the_one_vllm_raises_it_to_not_greedy():
    s = effective_sampling({"temperature": 0.000001})
    assert s["temperature"] == 0.01 and sampling_problems(s) == []
    assert effective_sampling({"temperature": 0})["temperature"] == 0.0


def test_temperature_top_p_top_k_min_p_stay_eligible():
    s = effective_sampling({"temperature": 0.3, "top_p": 0.9, "top_k": 40, "min_p": 0.1})
    assert ineligible_reasons(**GOOD, sampling=s) == []


def test_min_tokens_stays_eligible_with_the_stop_ids_it_masked_recorded():
    s = effective_sampling({"min_tokens": 4, "stop_token_ids": [7, 9]})
    assert s["min_tokens"] == 4 and s["stop_token_ids"] == [7, 9]
    assert ineligible_reasons(**GOOD, sampling=s) == []
    assert effective_sampling({})["stop_token_ids"] == []
    unrecorded = {k: v for k, v in s.items() if k != "stop_token_ids"}  # an older record
    (problem,) = sampling_problems(unrecorded)
    assert "cannot rebuild the stop-token mask" in problem


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"temperature": 0}, "sampled greedily (temperature 0.0)"),
        ({"presence_penalty": 0.5}, "sampled with presence_penalty 0.5"),
        ({"frequency_penalty": -0.2}, "sampled with frequency_penalty -0.2"),
        ({"repetition_penalty": 1.1}, "sampled with repetition_penalty 1.1"),
        ({"min_tokens": "4"}, "min_tokens '4' is not an integer"),
        ({"logit_bias": {"5": 3}}, "sampled with a logit_bias"),
        ({"bad_words": ["x"]}, "sampled with bad_words"),
        ({"allowed_token_ids": [1, 2]}, "sampled with allowed_token_ids"),
        ({"use_beam_search": True}, "sampled with beam search"),
        ({"thinking_token_budget": 10}, "sampled with a thinking_token_budget"),
        ({"response_format": {"type": "json_object"}}, "(response_format json_object)"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
            "(response_format json_schema)",
        ),
        ({"structured_outputs": {"regex": "a+"}}, "(structured_outputs)"),
        ({"tools": [{"type": "function"}], "tool_choice": "required"}, "(tool_choice required)"),
        (
            {"tools": [{"type": "function"}], "tool_choice": {"function": {"name": "f"}}},
            "(tool_choice naming a function)",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
            "(a strict tool)",
        ),
        ({"temperature": "hot"}, "temperature 'hot' is not a number"),
    ],
)
def test_each_setting_the_trainer_cannot_reproduce_is_a_named_sampling_reason(body, words):
    reasons = ineligible_reasons(**GOOD, sampling=effective_sampling(body))
    assert len(reasons) == 1, reasons
    assert words in reasons[0]
    assert kind_of(reasons[0]) is ReasonKind.SAMPLING


def test_free_tool_calls_and_neutral_values_stay_eligible():
    body = {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "auto",
        "presence_penalty": 0,
        "repetition_penalty": 1,
        "logit_bias": {},
        "response_format": {"type": "text"},
        "min_tokens": 0,
    }
    assert ineligible_reasons(**GOOD, sampling=effective_sampling(body)) == []
    strict_but_off = {
        "tools": [{"type": "function", "function": {"name": "f", "strict": True}}],
        "tool_choice": "none",
    }
    assert sampling_problems(effective_sampling(strict_but_off)) == []


def test_no_recorded_settings_is_no_reason():
    assert ineligible_reasons(**GOOD, sampling=None) == []
