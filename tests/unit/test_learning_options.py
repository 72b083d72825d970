"""The learning benchmark's `--trainer FIELD=VALUE`: TrainerConfig fields, JSON values."""

import pytest

from bench.learning import parse, trainer_options


def test_overrides_are_read_as_json_values_of_trainer_config_fields() -> None:
    args = parse(["--trainer", "batch_sessions=64", "--trainer", "imp_weight_mode=mask"])
    assert trainer_options(args.trainer) == {"batch_sessions": 64, "imp_weight_mode": "mask"}
    assert trainer_options(["lr=2e-5", "filter_zero_variance=true"]) == {
        "lr": 2e-5,
        "filter_zero_variance": True,
    }


@pytest.mark.parametrize("pair", ["batch_sessions", "no_such_field=1", "=3"])
def test_a_pair_that_names_no_field_is_refused(pair: str) -> None:
    with pytest.raises(SystemExit, match="TrainerConfig field"):
        trainer_options([pair])
