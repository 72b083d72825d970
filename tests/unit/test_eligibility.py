"""Training eligibility: one function lists every reason a completion may not be trained on."""

import math

import pytest

from rlgw.eligibility import (
    CROSSED_SWAP,
    DOUBTFUL_COMMIT,
    ECHO_ONLY,
    NOT_FOLLOWING,
    eligibility_reason,
    ineligible_reasons,
    session_reason,
)

GOOD = dict(
    status="complete",
    finish_reason="stop",
    policy_version=3,
    prompt_token_ids=[1, 2],
    output_token_ids=[5, 6, 7],
    output_logprobs=[-0.1, -2.0, -0.5],
)


def test_complete_evidence_passes():
    assert ineligible_reasons(**GOOD) == []


@pytest.mark.parametrize("finish_reason", ["stop", "length", "tool_calls"])
def test_every_normal_finish_passes(finish_reason):
    assert ineligible_reasons(**{**GOOD, "finish_reason": finish_reason}) == []


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
    (reason,) = ineligible_reasons(**{**GOOD, **change})
    assert fragment in reason


def test_missing_log_probs_are_counted_as_none():
    assert ineligible_reasons(**{**GOOD, "output_logprobs": None}) == [
        "0 log-probs for 3 output tokens"
    ]


def test_only_the_first_bad_log_prob_is_named():
    reasons = ineligible_reasons(**{**GOOD, "output_logprobs": [math.nan, -9999.0, math.inf]})
    assert reasons == ["log-prob nan at output position 0 is not a finite log-probability"]


def test_a_cut_stream_reports_its_status_and_its_missing_finish():
    reasons = ineligible_reasons(**{**GOOD, "status": "incomplete", "finish_reason": None})
    assert reasons == ["status is incomplete", "finish_reason None is not a normal finish"]


def test_a_failed_call_reports_every_missing_piece_of_evidence():
    reasons = ineligible_reasons(
        status="error",
        finish_reason=None,
        policy_version=None,
        prompt_token_ids=None,
        output_token_ids=[],
        output_logprobs=[],
    )
    assert reasons == [
        "status is error",
        "finish_reason None is not a normal finish",
        "served policy version unknown",
        "prompt token ids missing",
        "no output tokens",
    ]


@pytest.mark.parametrize("status", ["closed", "claimed", "consumed", "dropped"])
def test_a_session_no_longer_open_excludes_the_completion(status):
    assert ineligible_reasons(**GOOD, session_status=status) == [session_reason(status)]
    assert status in session_reason(status)


@pytest.mark.parametrize("session_status", [None, "open"])
def test_an_open_or_implicit_session_excludes_nothing(session_status):
    assert ineligible_reasons(**GOOD, session_status=session_status) == []


@pytest.mark.parametrize("doubt", [CROSSED_SWAP, NOT_FOLLOWING])
def test_a_swap_doubt_excludes_the_completion(doubt):
    assert ineligible_reasons(**GOOD, swap_doubt=doubt) == [doubt]


def test_a_swap_doubt_is_one_of_the_known_ones():
    with pytest.raises(ValueError, match="not a swap doubt"):
        ineligible_reasons(**GOOD, swap_doubt="a guess")


def test_a_doubtful_commit_excludes_the_completion():
    assert ineligible_reasons(**GOOD, doubtful_commit=True) == [DOUBTFUL_COMMIT]


def test_every_reason_is_reported_at_once_none_overwrites_another():
    reasons = ineligible_reasons(
        **{**GOOD, "status": "incomplete", "output_logprobs": [-0.1, -9999.0, -0.5]},
        session_status="closed",
        swap_doubt=CROSSED_SWAP,
        doubtful_commit=True,
    )
    assert reasons == [
        "status is incomplete",
        "placeholder log-prob -9999.0 at output position 1",
        session_reason("closed"),
        CROSSED_SWAP,
        DOUBTFUL_COMMIT,
    ]


@pytest.mark.parametrize(
    "facts",
    [
        {"session_status": "closed", "swap_doubt": CROSSED_SWAP},
        {"session_status": "closed", "doubtful_commit": True},
        {"swap_doubt": NOT_FOLLOWING, "doubtful_commit": True},
    ],
)
def test_two_causes_besides_the_evidence_are_both_reported(facts):
    assert len(ineligible_reasons(**GOOD, **facts)) == 2


def test_the_reasons_as_one_text_for_earlier_clients():
    assert eligibility_reason([]) is None
    assert eligibility_reason([CROSSED_SWAP]) == CROSSED_SWAP
    assert eligibility_reason(["a", "b"]) == "a; b"


def test_an_echo_that_only_scored_the_prompt_says_so_instead_of_no_output():
    evidence = {**GOOD, "finish_reason": "length", "output_token_ids": [], "output_logprobs": []}
    assert ineligible_reasons(**evidence, echo_only=True) == [ECHO_ONLY]
