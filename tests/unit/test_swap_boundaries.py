"""Per-token versions of a request that weight swaps paused in place (rlgw/swap_boundaries.py)."""

from __future__ import annotations

from rlgw.swap_boundaries import (
    FAILED,
    PAUSING,
    SERVED,
    Boundary,
    engine_request_key,
    request_key,
    resolve,
    runs,
)

HEX = "0123456789abcdef0123456789abcdef"
KEY = f"{HEX}:0"


def boundary(epoch, from_v, to_v, running=None, finished=(), outcome=SERVED) -> Boundary:
    return Boundary(epoch, from_v, to_v, outcome, running, frozenset(finished))


def resolved(n_tokens, boundaries, *, lease_version=3, lease_epoch=0, current_epoch=None):
    return resolve(
        key=KEY,
        lease_version=lease_version,
        lease_epoch=lease_epoch,
        n_tokens=n_tokens,
        boundaries=boundaries,
        current_epoch=max((b.epoch for b in boundaries), default=lease_epoch)
        if current_epoch is None
        else current_epoch,
    )


# ---------------------------------------------------------------------------- request keys


def test_choice_zero_is_keyed_by_its_reply_id():
    assert request_key(f"chatcmpl-{HEX}") == f"{HEX}:0"


def test_choice_i_record_suffix_gives_choice_i():
    assert request_key(f"chatcmpl-{HEX}-2") == f"{HEX}:2"


def test_completions_api_ids_key_like_chat_ids():
    assert request_key(f"cmpl-{HEX}-1") == f"{HEX}:1"
    assert engine_request_key(f"cmpl-cmpl-{HEX}-a1b2c3d4") == f"{HEX}:0"


def test_engine_id_of_a_single_choice_is_choice_zero():
    assert engine_request_key(f"chatcmpl-chatcmpl-{HEX}-a1b2c3d4") == f"{HEX}:0"


def test_engine_child_id_matches_the_record_id_of_the_same_choice():
    for i in (0, 1, 12):
        engine = f"{i}_chatcmpl-chatcmpl-{HEX}-a1b2c3d4"
        record = f"chatcmpl-{HEX}" if i == 0 else f"chatcmpl-{HEX}-{i}"
        assert engine_request_key(engine) == request_key(record) == f"{HEX}:{i}"


def test_ids_without_32_hex_digits_have_no_key():
    assert request_key("chatcmpl-abc123-1") is None
    assert engine_request_key("1_chatcmpl-chatcmpl-abc123-a1b2c3d4") is None
    assert request_key("chatcmpl-" + HEX.upper()) is None  # the gateway writes lowercase hex


# ---------------------------------------------------------------------------- resolve


def test_no_pause_crossed_puts_every_token_at_the_lease_version():
    out = resolved(4, [], lease_epoch=2, current_epoch=2)
    assert out.versions == [3, 3, 3, 3] and out.reason is None
    assert out.policy_version == 3


def test_one_pause_splits_at_the_tokens_sampled_before_it():
    out = resolved(5, [boundary(1, 3, 4, running={KEY: 2})])
    assert runs(out.versions) == [(3, 2), (4, 3)]
    assert out.policy_version == 3


def test_a_request_not_started_before_the_pause_is_all_new_version():
    out = resolved(3, [boundary(1, 3, 4, running={"other:0": 7})])
    assert out.versions == [4, 4, 4]
    assert out.policy_version == 4


def test_a_request_running_with_no_token_yet_is_all_new_version():
    assert resolved(2, [boundary(1, 3, 4, running={KEY: 0})]).versions == [4, 4]


def test_a_request_finished_before_the_pause_is_all_old_version():
    out = resolved(3, [boundary(1, 3, 4, running={}, finished=[KEY])])
    assert out.versions == [3, 3, 3]


def test_two_pauses_give_three_runs():
    pauses = [boundary(1, 3, 4, running={KEY: 2}), boundary(2, 4, 5, running={KEY: 5})]
    assert runs(resolved(8, pauses).versions) == [(3, 2), (4, 3), (5, 3)]


def test_finished_between_two_pauses_ends_at_the_middle_version():
    pauses = [boundary(1, 3, 4, running={KEY: 2}), boundary(2, 4, 5, running={}, finished=[KEY])]
    assert runs(resolved(6, pauses).versions) == [(3, 2), (4, 4)]


def test_a_missing_boundary_leaves_the_tokens_unattributed():
    out = resolved(4, [boundary(2, 4, 5, running={KEY: 1})], current_epoch=2)
    assert out.versions is None
    assert out.reason == "the backend's pause at epoch 1 recorded no boundary"
    assert out.policy_version is None


def test_a_pausing_boundary_whose_counts_are_unread_gives_a_reason():
    out = resolved(4, [boundary(1, 3, 4, running=None, outcome=PAUSING)])
    assert out.versions is None
    assert "epoch 1 recorded no boundary" in out.reason


def test_a_boundary_with_unread_counts_gives_a_reason_whatever_its_outcome():
    out = resolved(4, [boundary(1, 3, 4, running=None)])
    assert out.versions is None and out.reason is not None


def test_failed_weights_with_tokens_after_them_give_a_reason():
    out = resolved(4, [boundary(1, 3, 4, running={KEY: 2}, outcome=FAILED)])
    assert out.versions is None
    assert out.reason == "tokens were sampled under weights that failed verification"


def test_failed_weights_with_no_token_after_them_are_harmless():
    out = resolved(4, [boundary(1, 3, 4, running={}, finished=[KEY], outcome=FAILED)])
    assert out.versions == [3, 3, 3, 3]
    every_token_before = resolved(4, [boundary(1, 3, 4, running={KEY: 4}, outcome=FAILED)])
    assert every_token_before.versions == [3, 3, 3, 3]


def test_failed_weights_followed_by_a_pause_before_any_token_are_harmless():
    pauses = [
        boundary(1, 3, None, running={KEY: 2}, outcome=FAILED),
        boundary(2, None, 5, running={KEY: 2}),
    ]
    assert runs(resolved(5, pauses).versions) == [(3, 2), (5, 3)]


def test_failed_weights_with_tokens_before_a_later_pause_give_a_reason():
    pauses = [
        boundary(1, 3, 4, running={KEY: 2}, outcome=FAILED),
        boundary(2, 4, 5, running={KEY: 3}),
    ]
    assert resolved(5, pauses).reason == (
        "tokens were sampled under weights that failed verification"
    )


def test_more_tokens_before_the_pause_than_recorded_are_clamped():
    # stop strings: the engine sampled past the text the answer kept
    assert resolved(3, [boundary(1, 3, 4, running={KEY: 5})]).versions == [3, 3, 3]
    pauses = [boundary(1, 3, 4, running={KEY: 2}), boundary(2, 4, 5, running={KEY: 9})]
    assert runs(resolved(4, pauses).versions) == [(3, 2), (4, 2)]


def test_a_count_that_goes_down_between_pauses_gives_a_reason():
    pauses = [boundary(1, 3, 4, running={KEY: 3}), boundary(2, 4, 5, running={KEY: 1})]
    assert resolved(5, pauses).reason == "the pause at epoch 2 counts fewer tokens than before"


def test_a_request_an_earlier_pause_held_and_a_later_one_forgot_gives_a_reason():
    pauses = [boundary(1, 3, 4, running={KEY: 2}), boundary(2, 4, 5, running={})]
    assert resolved(5, pauses).reason == "the pause at epoch 2 does not know the request"


def test_a_request_held_with_no_token_and_then_forgotten_gives_a_reason():
    # running at the first pause (no token yet), finished and forgotten before the second:
    # its tokens were the middle version's, not the last one's
    pauses = [boundary(1, 3, 4, running={KEY: 0}), boundary(2, 4, 5, running={})]
    assert resolved(5, pauses).reason == "the pause at epoch 2 does not know the request"


def test_an_unmatched_request_or_unknown_lease_version_gives_a_reason():
    unmatched = resolve(
        key=None, lease_version=3, lease_epoch=0, n_tokens=2, boundaries=[], current_epoch=0
    )
    unknown = resolve(
        key=KEY, lease_version=None, lease_epoch=0, n_tokens=2, boundaries=[], current_epoch=0
    )
    for out in (unmatched, unknown):
        assert out.versions is None
        assert out.reason == "the request cannot be matched to the backend's pauses"


def test_an_empty_output_has_no_versions_and_no_policy_version():
    out = resolved(0, [boundary(1, 3, 4, running={KEY: 0})])
    assert out.versions == [] and out.reason is None and out.policy_version is None


def test_runs_groups_equal_neighbours():
    assert runs([1, 1, 2, 1]) == [(1, 2), (2, 1), (1, 1)]
    assert runs([]) == []
