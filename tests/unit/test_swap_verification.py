"""The swap verification rule: within the backend's noise band, and clearly the new version."""

from __future__ import annotations

import pytest

from trainer.backends.parity import ProbeScores
from trainer.swap.verification import (
    LOW_PRECISION_CEILING,
    NoiseBands,
    judge,
    tolerance_for,
)

OLD = ProbeScores((-1.0, -2.0, -3.0), 5, -0.5)
NEW = ProbeScores((-1.3, -2.2, -2.7), 5, -0.6)  # 0.3 away from OLD on the probe
BF16_NOISE = 3e-3


def shifted(scores: ProbeScores, by: float) -> ProbeScores:
    return ProbeScores(
        tuple(x + by for x in scores.token_logprobs), scores.next_token, scores.next_logprob + by
    )


def halfway(a: ProbeScores, b: ProbeScores) -> ProbeScores:
    mid = tuple((x + y) / 2 for x, y in zip(a.token_logprobs, b.token_logprobs, strict=True))
    return ProbeScores(mid, a.next_token, (a.next_logprob + b.next_logprob) / 2)


def test_fp32_keeps_its_fixed_tolerance_whatever_was_measured():
    assert tolerance_for("float32", 0.01, 1e-4) == 1e-4
    assert tolerance_for("float32", None, 1e-4) == 1e-4


def test_a_low_precision_band_is_three_times_the_noise_between_the_floor_and_the_ceiling():
    assert tolerance_for("bfloat16", BF16_NOISE, 1e-4) == pytest.approx(9e-3)
    assert tolerance_for("bfloat16", 1e-7, 1e-4) == 1e-4
    assert tolerance_for("bfloat16", 0.5, 1e-4) == LOW_PRECISION_CEILING


def test_the_new_version_served_with_bf16_noise_is_accepted():
    verdict = judge(shifted(NEW, BF16_NOISE), NEW, OLD, tolerance=9e-3)
    assert verdict.accepted and verdict.reason is None
    assert verdict.diff_new == pytest.approx(BF16_NOISE)
    assert verdict.separation == pytest.approx(0.3)


def test_a_swap_that_changed_nothing_is_refused():
    verdict = judge(shifted(OLD, BF16_NOISE), NEW, OLD, tolerance=9e-3)
    assert not verdict.accepted and "> 0.009" in verdict.reason


def test_scores_halfway_between_the_versions_are_refused_even_under_a_wide_band():
    verdict = judge(halfway(OLD, NEW), NEW, OLD, tolerance=0.2)  # wide, below the 0.3 apart
    assert not verdict.accepted and "not clearly the new version" in verdict.reason


def test_versions_closer_than_the_band_are_judged_by_the_band_alone():
    near = shifted(OLD, 1e-3)
    assert judge(shifted(near, 1e-3), near, OLD, tolerance=9e-3).accepted


def test_without_an_old_reference_only_the_band_decides():
    assert judge(shifted(NEW, 1e-3), NEW, None, tolerance=9e-3).accepted
    assert not judge(OLD, NEW, None, tolerance=9e-3).accepted


def test_noise_is_kept_per_backend_and_forgotten_when_its_dtype_changes():
    bands = NoiseBands()
    bands.learn_dtype("http://a", "bfloat16")
    bands.record("http://a", 2e-3)
    bands.record("http://b", 1.0)  # unknown backend: ignored
    assert bands.get("http://a").noise == 2e-3 and bands.get("http://b") is None
    assert bands.learn_dtype("http://a", "bfloat16").noise == 2e-3
    assert bands.learn_dtype("http://a", "float32").noise is None
