"""Samples built from an exported trajectory's JSON equal those built from the loaded schema."""

from __future__ import annotations

from test_samples import siblings, step, trajectory

from rlgw import trajectory as trajectory_module
from trainer.config import TrainerConfig
from trainer.loop import records
from trainer.loop.records import trajectory_from_export
from trainer.loop.samples import build_samples


def test_exported_json_builds_the_same_samples_and_skips() -> None:
    normalized = {"c1": 1.2, "c1-1": -0.2, "c1-2": -1.0}
    steps = [step("first"), step("old", version=0), *(step(c, 5, "c1") for c in normalized)]
    steps[0] = steps[0].model_copy(update={"policy_version": 5})
    ready = trajectory(steps, return_normalized=0.5, sibling_groups=[siblings("ready", normalized)])
    pending = trajectory(
        [step("c1", 5, "c1")], session_id="t", sibling_groups=[siblings("pending", {})]
    )
    config = TrainerConfig(max_staleness=2)
    loaded = build_samples([ready, pending], current_version=5, config=config)
    exported = [trajectory_from_export(t.model_dump(mode="json")) for t in (ready, pending)]
    assert build_samples(exported, current_version=5, config=config) == loaded
    assert len(loaded[0]) == 4 and {s.reason.split(":")[0] for s in loaded[1]} == {
        "stale",
        "its sibling group is pending (not every sibling choice is rewarded)",
    }


def test_the_default_sibling_normalization_is_the_schemas() -> None:
    assert records.DEFAULT_SIBLING_NORMALIZATION == trajectory_module.DEFAULT_SIBLING_NORMALIZATION
