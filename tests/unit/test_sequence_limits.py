"""The settings that decide a session's sequences have one source of defaults (rlgw/sequences.py),
which the trainer's config reads and the gateway's training view falls back to."""

from __future__ import annotations

import dataclasses
import inspect
import re

from rlgw.sequences import DEFAULT_LIMITS, SequenceLimits
from trainer.config import TrainerConfig


def test_the_trainers_defaults_are_the_sequence_limits_defaults():
    names = [f.name for f in dataclasses.fields(SequenceLimits)]
    assert names == [
        "max_staleness",
        "max_tokens_per_sample",
        "overlong",
        "overlong_penalty",
        "join_turns",
    ]
    config = TrainerConfig()
    assert {n: getattr(config, n) for n in names} == dataclasses.asdict(DEFAULT_LIMITS)
    assert dataclasses.asdict(DEFAULT_LIMITS) == {
        "max_staleness": 4,
        "max_tokens_per_sample": 2048,
        "overlong": "keep",
        "overlong_penalty": 1.0,
        "join_turns": True,
    }


def test_the_trainers_config_reads_the_constant_rather_than_a_copy():
    """One source of truth: each field's default is written as DEFAULT_LIMITS.<field> in
    TrainerConfig's body, so a changed constant changes both (a typed copy would drift)."""
    source = inspect.getsource(TrainerConfig)
    for name in (f.name for f in dataclasses.fields(SequenceLimits)):
        assert re.search(rf"\n    {name}: [\w ]+ = DEFAULT_LIMITS\.{name}\b", source), name
