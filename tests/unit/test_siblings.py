"""n > 1: one record per choice, siblings kept or superseded together, normalized as a group."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.proxy.assembly import StreamAssembly
from gateway.proxy.shaping import (
    CHAT,
    client_asks,
    extract_choices,
    make_visible,
    only_choice,
    sibling_id,
)
from gateway.recording.lineage import LineageRow, find_parent, resolve_orphans, sequence_hash
from rlgw.trajectory import Step, sibling_groups

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(rid: str, second: int, group: str | None, siblings: str | None = None, parent=None):
    return LineageRow(
        rid, "chat.completions", T0 + timedelta(seconds=second), group, parent, None, None, siblings
    )


def test_sibling_ids_and_the_visible_field():
    assert [sibling_id("chatcmpl-x", i) for i in range(3)] == [
        "chatcmpl-x",
        "chatcmpl-x-1",
        "chatcmpl-x-2",
    ]
    payload = {"id": "up", "choices": [{"index": 0, "token_ids": [1]}, {"index": 1}]}
    make_visible(CHAT, payload, client_asks(CHAT, {}), "chatcmpl-x")
    assert [c["completion_id"] for c in payload["choices"]] == ["chatcmpl-x", "chatcmpl-x-1"]
    assert "token_ids" not in payload["choices"][0]
    assert only_choice(payload, 1)["choices"] == [payload["choices"][1]]


def test_every_choice_is_extracted():
    payload = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {"index": 1, "token_ids": [5], "logprobs": {"content": [{"logprob": -1.0}]}},
            {"index": 0, "token_ids": [4], "logprobs": {"content": [{"logprob": -2.0}]}},
        ],
    }
    got = extract_choices(CHAT, payload)
    assert got[0].output_token_ids == [4] and got[1].output_logprobs == [-1.0]
    assert got[0].prompt_token_ids == got[1].prompt_token_ids == [1, 2]


def test_stream_assembly_keeps_choices_apart():
    asm = StreamAssembly(CHAT)
    asm.add({"prompt_token_ids": [9], "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    asm.add({"choices": [{"index": 1, "delta": {"content": "b"}, "token_ids": [2]}]})
    asm.add({"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [1]}]})
    asm.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    assert not asm.finished(2)
    asm.add({"choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]})
    assert asm.finished(2)
    assert asm.choices[1].tokens.prompt_token_ids == [9]
    one = asm.response("chatcmpl-x", only=1)
    assert one["choices"] == [
        {
            "index": 1,
            "message": {"role": "assistant", "content": "b"},
            "finish_reason": "length",
            "completion_id": "chatcmpl-x-1",
        }
    ]


def test_siblings_do_not_supersede_each_other():
    rows = [row("a", 0, "g", "a"), row("a-1", 0, "g", "a"), row("a-2", 0, "g", "a")]
    assert resolve_orphans(rows) == {"a": None, "a-1": None, "a-2": None}


def test_a_retry_supersedes_a_whole_sibling_group_unless_the_group_was_continued():
    first = [row("a", 0, "g", "a"), row("a-1", 0, "g", "a")]
    retry = [row("b", 1, "g", "b"), row("b-1", 1, "g", "b")]
    reasons = resolve_orphans(first + retry)
    assert reasons["a"] == reasons["a-1"] == "retry superseded by b-1"
    assert reasons["b"] is None and reasons["b-1"] is None
    follow = row("c", 2, "h", parent="a-1")
    reasons = resolve_orphans([*first, *retry, follow])
    assert reasons["a"] is None and reasons["a-1"] is None and reasons["c"] is None
    assert reasons["b"] == reasons["b-1"] == "retry superseded by a-1"


def test_a_conversation_may_continue_across_the_chat_family():
    seq = ["m1", "m2", "m3"]
    earlier = LineageRow("p", "messages", T0, None, None, sequence_hash(seq[:2]), 2)
    assert find_parent("chat.completions", seq, [earlier]) == "p"
    assert find_parent("completions", "m1m2", [earlier]) is None


def step(cid: str, group: str | None, reward: float | None) -> Step:
    return Step(
        completion_id=cid,
        parent_id=None,
        api="chat.completions",
        policy_version=0,
        prompt_token_ids=[1],
        output_token_ids=[2],
        output_logprobs=[-1.0],
        finish_reason="stop",
        sibling_group=group,
        ineligible_reasons=[],
        rewards=[],
        reward_raw=reward,
        response=None,
        created_at=T0,
    )


def test_sibling_groups_are_normalized_once_every_sibling_is_rewarded():
    steps = [step("a", "a", 1.0), step("a-1", "a", 3.0), step("x", None, 5.0)]
    (group,) = sibling_groups(steps, "mean")
    assert group.status == "ready" and group.normalized == {"a": -1.0, "a-1": 1.0}
    (group,) = sibling_groups(steps, "mean_std")
    assert group.normalized == pytest.approx({"a": -1.0, "a-1": 1.0}, abs=1e-5)
    (group,) = sibling_groups(steps, "none")
    assert group.normalized == {"a": 1.0, "a-1": 3.0}
    (pending,) = sibling_groups([step("a", "a", 1.0), step("a-1", "a", None)], "mean")
    assert (
        pending.status == "pending" and pending.normalized == {} and pending.returns == {"a": 1.0}
    )
