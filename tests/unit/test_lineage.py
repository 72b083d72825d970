"""Parent finding and orphan resolution on hand-built sessions."""

from datetime import UTC, datetime, timedelta

from gateway.recording.lineage import (
    LineageRow,
    continuation,
    find_parent,
    message_digest,
    request_sequence,
    resolve_orphans,
    retry_key,
    sequence_hash,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(i: int, group: str | None, parent: str | None = None) -> LineageRow:
    return LineageRow(
        f"c{i}", "chat.completions", T0 + timedelta(seconds=i), group, parent, None, None
    )


def test_message_digest_ignores_client_dressing_but_not_content():
    plain = {"role": "assistant", "content": "hi"}
    dressed = {"role": "assistant", "content": [{"type": "text", "text": "hi"}], "refusal": None}
    assert message_digest(plain) == message_digest(dressed)
    assert message_digest(plain) != message_digest({"role": "assistant", "content": "hi!"})


def test_tool_call_arguments_compare_as_json():
    a = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}
    b = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x":1}'}}]}
    assert message_digest(a) == message_digest(b)


def test_parent_is_the_completion_whose_continuation_prefixes_the_request():
    body = {"messages": [{"role": "user", "content": "q"}]}
    reply = {"choices": [{"message": {"role": "assistant", "content": "a"}}]}
    cont = continuation("chat.completions", body, reply, [])
    parent = LineageRow("p", "chat.completions", T0, "g", None, sequence_hash(cont), len(cont))
    follow = {
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "q2"},
        ]
    }
    assert (
        find_parent("chat.completions", request_sequence("chat.completions", follow), [parent])
        == "p"
    )
    other = {"messages": [*body["messages"], {"role": "assistant", "content": "b"}]}
    assert (
        find_parent("chat.completions", request_sequence("chat.completions", other), [parent])
        is None
    )


def test_token_prompt_parent_for_text_completions():
    body = {"prompt": [1, 2, 3]}
    cont = continuation("completions", body, {"choices": [{"text": "x"}]}, [9, 9])
    parent = LineageRow("p", "completions", T0, None, None, sequence_hash(cont), len(cont))
    assert find_parent("completions", [1, 2, 3, 9, 9, 4], [parent]) == "p"
    assert find_parent("completions", [1, 2, 3, 9, 8], [parent]) is None


def test_retry_key_ignores_stream_flags_but_not_sampling():
    base = {"model": "m", "messages": [], "temperature": 1.0}
    assert retry_key("s", "chat", base, None) == retry_key(
        "s", "chat", {**base, "stream": True}, None
    )
    assert retry_key("s", "chat", base, None) != retry_key(
        "s", "chat", {**base, "temperature": 0.5}, None
    )
    assert retry_key("s", "chat", base, None) != retry_key("other", "chat", base, None)
    assert retry_key("s", "chat", base, "k") == retry_key("s", "chat", {"x": 1}, "k")


def test_last_attempt_is_kept_when_none_was_continued():
    reasons = resolve_orphans([row(1, "g"), row(2, "g"), row(3, "g")])
    assert reasons["c3"] is None
    assert reasons["c1"] == reasons["c2"] == "retry superseded by c3"


def test_continued_attempt_is_kept_over_a_later_one():
    reasons = resolve_orphans([row(1, "g"), row(2, "g"), row(3, "h", parent="c1")])
    assert reasons["c1"] is None and reasons["c3"] is None
    assert reasons["c2"] == "retry superseded by c1"


def test_descendants_of_an_orphan_are_orphans():
    rows = [
        row(1, "g"),
        row(2, "h", parent="c1"),
        row(3, "g"),
        row(4, "i", parent="c3"),
        row(5, "j", parent="c4"),
    ]
    reasons = resolve_orphans(rows)  # c3 was continued later (by c4) than c1 (by c2)
    assert reasons["c1"] == "retry superseded by c3"
    assert reasons["c2"] == "continues orphan c1"
    assert reasons["c3"] is None and reasons["c4"] is None and reasons["c5"] is None
