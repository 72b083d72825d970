"""Metric labels stay bounded: reasons reduce to kinds, routes to APIs; a completion counts once."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.main import create_app
from gateway.metrics.middleware import api_of
from gateway.metrics.reasons import KINDS, reason_kind
from gateway.metrics.registry import GatewayMetrics
from gateway.recording.lineage import LineageRow, continues_orphan, resolve_orphans
from rlgw.eligibility import (
    CROSSED_SWAP,
    DOUBTFUL_COMMIT,
    ECHO_ONLY,
    NOT_FOLLOWING,
    ineligible_reasons,
    session_reason,
)
from rlgw.settings import Settings

GOOD = dict(
    status="complete",
    finish_reason="stop",
    policy_version=0,
    prompt_token_ids=[1, 2],
    output_token_ids=[3, 4],
    output_logprobs=[-0.1, -0.2],
)


def problem(**changes) -> str:
    """The first reason the evidence check gives."""
    reasons = ineligible_reasons(**{**GOOD, **changes})
    assert reasons
    return reasons[0]


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ({"status": "incomplete"}, "status"),
        ({"finish_reason": "abort"}, "finish"),
        ({"policy_version": None}, "version"),
        ({"prompt_token_ids": []}, "tokens"),
        ({"output_token_ids": [], "output_logprobs": []}, "tokens"),
        ({"output_logprobs": [-0.1]}, "logprobs"),
        ({"output_logprobs": [-0.1, float("nan")]}, "logprobs"),
        ({"output_logprobs": [-0.1, -9999.0]}, "logprobs"),
    ],
)
def test_evidence_reasons_have_their_kind(changes, kind):
    assert reason_kind(problem(**changes)) == kind


def test_exclusion_and_orphan_reasons_have_their_kind():
    rows = [
        LineageRow(
            i, "chat.completions", datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC), "g", None, None, None
        )
        for s, i in enumerate("ab")
    ]
    superseded = resolve_orphans(rows)["a"]
    assert reason_kind(superseded) == "orphan"
    assert reason_kind(continues_orphan("chatcmpl-1")) == "orphan"
    assert reason_kind(session_reason("closed")) == "session_closed"
    assert reason_kind(CROSSED_SWAP) == "crossed_swap"
    assert reason_kind(NOT_FOLLOWING) == "not_following"
    assert reason_kind(DOUBTFUL_COMMIT) == "doubtful_commit"
    assert reason_kind(ECHO_ONLY) == "echo_only"


def test_an_unknown_reason_is_other():
    assert reason_kind("a reason written next year") == "other"
    assert KINDS[-1] == "other"


def test_a_completion_is_counted_once_under_its_first_reason():
    metrics = GatewayMetrics()
    metrics.completion_recorded([])
    metrics.completion_recorded([problem(status="error"), CROSSED_SWAP])
    metrics.completion_recorded([CROSSED_SWAP])
    counts = metrics.completion_counts()
    assert (counts["eligible"], counts["status"], counts["crossed_swap"]) == (1, 1, 1)
    assert sum(counts.values()) == 3


def test_two_apps_do_not_share_counters():
    one, other = GatewayMetrics(), GatewayMetrics()
    one.observe_request("chat", "200", "m", 0.1)
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(generate_latest(other.registry).decode())
        for s in f.samples
    }
    assert "rlgw_http_requests_total" not in samples


def test_every_route_of_the_app_has_an_api_label():
    settings = Settings(
        database_url="postgresql+psycopg://postgres@127.0.0.1:5432/unused",
        admin_key="k" * 24,
        home=Path("/nonexistent"),
    )
    paths = {getattr(route, "path", "") for route in create_app(settings).routes}
    assert {p: api_of(p) for p in paths if api_of(p) == "other"} == {}
    assert api_of("/sessions/{session_id}/v1/chat/completions") == "chat"
    assert api_of("/v1/messages/count_tokens") == "count_tokens"
    assert api_of("/v1/sessions/{session_id}/rewards") == "sessions"
