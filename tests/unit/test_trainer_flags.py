"""The trainer's options are set the same way for `rlgw train`, `rlgw up` and `rlgw demo`: one
flag per TrainerConfig field, and a TOML file; the flags win over the file."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from rlgw_cli.trainer_flags import add_trainer_flags, trainer_argv, trainer_overrides
from trainer.config import TrainerConfig


def parse(argv: list[str], skip: tuple[str, ...] = ()) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_trainer_flags(parser, skip=skip)
    return parser.parse_args(argv)


def test_every_config_field_is_a_flag() -> None:
    args = parse([])
    assert {f.name for f in dataclasses.fields(TrainerConfig)} <= set(vars(args))


def test_the_file_sets_options_and_the_flags_win(tmp_path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(
        'lr = 2e-5\nbatch_sessions = 16\nbetas = [0.9, 0.95]\nimp_weight_mode = "mask"\n'
    )
    given = trainer_overrides(parse(["--trainer-config", str(path), "--lr", "3e-5"]))
    assert given == {
        "lr": 3e-5,
        "batch_sessions": 16,
        "betas": (0.9, 0.95),
        "imp_weight_mode": "mask",
    }
    assert TrainerConfig(**given).learning_rate == 3e-5


def test_an_unknown_option_in_the_file_is_named(tmp_path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text("learning_rate = 1e-5\n")
    with pytest.raises(ValueError, match="unknown option\\(s\\) learning_rate"):
        trainer_overrides(parse(["--trainer-config", str(path)]))


def test_a_command_passes_its_trainer_options_on_to_a_child_trainer(tmp_path) -> None:
    """`rlgw up` hands the trainer flags it was given to the `rlgw train` it starts."""
    path = tmp_path / "trainer.toml"
    path.write_text("batch_sessions = 4\n")
    skip = ("dtype", "seed")
    args = parse(["--trainer-config", str(path), "--lr", "2e-5", "--betas", "0.9", "0.95",
                  "--gradient-checkpointing"], skip=skip)  # fmt: skip
    child = parse(trainer_argv(args, skip=skip))
    assert (
        trainer_overrides(child)
        == trainer_overrides(args)
        == {
            "batch_sessions": 4,
            "lr": 2e-5,
            "betas": (0.9, 0.95),
            "gradient_checkpointing": True,
        }
    )
    assert not hasattr(args, "dtype")  # the command's own --dtype means something else


def test_the_objectives_options_are_flags_with_their_choices(tmp_path) -> None:
    args = parse(
        [
            "--baseline", "rloo",
            "--singleton-baseline", "task_mean",
            "--overlong", "penalize",
            "--overlong-penalty", "0.5",
            "--filter-zero-variance",
            "--imp-weight-level", "sequence",
            "--imp-weight-floor", "0.5",
            "--clip-eps-high", "0.28",
            "--epochs", "2",
            "--lr-schedule", "cosine",
            "--lr-decay-steps", "100",
            "--lr-min-ratio", "0.1",
        ]
    )  # fmt: skip
    config = TrainerConfig(**trainer_overrides(args))
    assert (config.baseline, config.singleton_baseline, config.overlong) == (
        "rloo",
        "task_mean",
        "penalize",
    )
    assert config.filter_zero_variance and config.clip_high == 0.28 and config.epochs == 2
    assert (config.imp_weight_level, config.imp_weight_floor) == ("sequence", 0.5)
    assert (config.lr_schedule, config.lr_decay_steps, config.lr_min_ratio) == ("cosine", 100, 0.1)
    assert "--clip-eps-high" in trainer_argv(args) and "--filter-zero-variance" in trainer_argv(
        args
    )
    with pytest.raises(SystemExit):  # argparse names the choices
        parse(["--baseline", "mean"])


def test_a_field_that_defaults_to_true_can_be_turned_off_and_the_child_gets_the_same() -> None:
    assert TrainerConfig().join_turns
    off = parse(["--no-join-turns"])
    assert TrainerConfig(**trainer_overrides(off)).join_turns is False
    assert "--no-join-turns" in trainer_argv(off)
    again = parse(trainer_argv(off))  # what `rlgw up` hands its `rlgw train`
    assert TrainerConfig(**trainer_overrides(again)).join_turns is False
    assert "join_turns" not in trainer_overrides(parse([]))  # not given: the file or the default
