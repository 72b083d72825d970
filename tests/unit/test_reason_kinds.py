"""Every ineligibility reason carries its kind as data, given where the reason is decided."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from gateway.recording.lineage import continues_orphan
from rlgw.eligibility import (
    CROSSED_SWAP,
    DOUBTFUL_COMMIT,
    ECHO_ONLY,
    NOT_FOLLOWING,
    Reason,
    ReasonKind,
    ineligible_reasons,
    kind_of,
    session_reason,
)

GOOD = dict(
    status="complete",
    finish_reason="stop",
    policy_version=0,
    prompt_token_ids=[1, 2],
    output_token_ids=[3, 4],
    output_logprobs=[-0.1, -0.2],
)


def test_a_reason_is_its_text_and_carries_its_kind():
    reason = Reason("served policy version unknown", ReasonKind.VERSION)
    assert reason == "served policy version unknown"
    assert reason.kind is ReasonKind.VERSION
    assert json.dumps([reason]) == '["served policy version unknown"]'


def test_a_reason_keeps_its_kind_when_copied_or_pickled():
    for copied in (copy.deepcopy(CROSSED_SWAP), pickle.loads(pickle.dumps(CROSSED_SWAP))):
        assert copied == CROSSED_SWAP and copied.kind is ReasonKind.CROSSED_SWAP


def test_a_plain_text_has_no_kind_whatever_its_wording():
    assert kind_of("session was closed before this completion was recorded") is ReasonKind.OTHER
    assert kind_of(str(CROSSED_SWAP)) is ReasonKind.OTHER


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        (CROSSED_SWAP, ReasonKind.CROSSED_SWAP),
        (NOT_FOLLOWING, ReasonKind.NOT_FOLLOWING),
        (DOUBTFUL_COMMIT, ReasonKind.DOUBTFUL_COMMIT),
        (ECHO_ONLY, ReasonKind.ECHO_ONLY),
        (session_reason("claimed"), ReasonKind.SESSION_CLOSED),
        (continues_orphan("chatcmpl-1"), ReasonKind.ORPHAN),
    ],
)
def test_each_named_reason_has_its_kind(reason, kind):
    assert kind_of(reason) is kind


def test_every_reason_of_the_evidence_check_has_a_kind():
    reasons = ineligible_reasons(
        status="error",
        finish_reason=None,
        policy_version=None,
        prompt_token_ids=None,
        output_token_ids=[],
        output_logprobs=None,
        session_status="closed",
        swap_doubt=CROSSED_SWAP,
    )
    assert [kind_of(r) for r in reasons] == [
        ReasonKind.STATUS,
        ReasonKind.FINISH,
        ReasonKind.VERSION,
        ReasonKind.TOKENS,
        ReasonKind.TOKENS,
        ReasonKind.LOGPROBS,
        ReasonKind.SESSION_CLOSED,
        ReasonKind.CROSSED_SWAP,
    ]
    assert ineligible_reasons(**GOOD) == []


def test_kinds_are_their_metric_label_values():
    assert [str(k) for k in ReasonKind][-1] == "other"
    assert f"{ReasonKind.SESSION_CLOSED}" == "session_closed"
