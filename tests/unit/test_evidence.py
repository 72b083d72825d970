"""The evidence check admits only complete, finite, version-stamped completions."""

import math

import pytest

from rlgw.evidence import evidence_problem

GOOD = dict(
    status="complete",
    finish_reason="stop",
    policy_version=3,
    prompt_token_ids=[1, 2],
    output_token_ids=[5, 6, 7],
    output_logprobs=[-0.1, -2.0, -0.5],
)


def test_complete_evidence_passes():
    assert evidence_problem(**GOOD) is None


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"status": "incomplete"}, "status is incomplete"),
        ({"finish_reason": "abort"}, "not a normal finish"),
        ({"finish_reason": None}, "not a normal finish"),
        ({"policy_version": None}, "version unknown"),
        ({"prompt_token_ids": []}, "prompt token ids missing"),
        ({"output_token_ids": [], "output_logprobs": []}, "no output tokens"),
        ({"output_logprobs": [-0.1, -2.0]}, "2 log-probs for 3 output tokens"),
        ({"output_logprobs": [-0.1, math.nan, -0.5]}, "not a finite"),
        ({"output_logprobs": [-0.1, -math.inf, -0.5]}, "not a finite"),
        ({"output_logprobs": [-0.1, 0.5, -0.5]}, "not a finite log-probability"),
        ({"output_logprobs": [-0.1, -9999.0, -0.5]}, "placeholder"),
    ],
)
def test_incomplete_evidence_is_refused_with_a_reason(change, fragment):
    assert fragment in evidence_problem(**{**GOOD, **change})
