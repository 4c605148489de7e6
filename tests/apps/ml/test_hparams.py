"""Hyperparameter validation: bad agent input is refused with a message that says how to fix it."""

from __future__ import annotations

import math
from typing import Any

import pytest

from apps.ml.hparams import TrainConfig, validate_train_config


def test_defaults_and_overrides() -> None:
    config = validate_train_config({"learning_rate": 5e-4, "max_steps": 200.0, "adapter": "lora", "seed": 3})
    assert config == TrainConfig(learning_rate=5e-4, max_steps=200, adapter="lora", seed=3)
    assert isinstance(config.max_steps, int)
    assert validate_train_config({}) == TrainConfig()


@pytest.mark.parametrize(
    ("hparams", "message"),
    [
        ({"learning_rate": math.nan}, "finite"),
        ({"learning_rate": math.inf}, "finite"),
        ({"learning_rate": -1e-3}, "out of range"),
        ({"learning_rate": 0}, "out of range"),
        ({"learning_rate": 0.5}, "out of range"),
        ({"max_steps": 0}, "out of range"),
        ({"max_steps": 10**6}, "out of range"),
        ({"max_steps": 10.5}, "integer"),
        ({"max_steps": True}, "integer"),
        ({"max_steps": "100"}, "integer"),
        ({"batch_size": 1024}, "out of range"),
        ({"lora_r": 0}, "out of range"),
        ({"weight_decay": -0.1}, "out of range"),
        ({"recipe": "ppo"}, "one of"),
        ({"adapter": "qlora"}, "one of"),
        ({"eos_handling": "maybe"}, "one of"),
        ({"chat_template": "replace"}, "one of"),
        ({"recipe": "dpo", "eos_handling": "none"}, "only supported"),
        ({"max_steps": 10, "warmup_steps": 10}, "warmup_steps"),
    ],
)
def test_rejects_bad_values(hparams: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_train_config(hparams)


def test_unknown_key_suggests_the_right_one() -> None:
    with pytest.raises(ValueError, match="unknown hyperparameter 'learning_rat'.*did you mean 'learning_rate'"):
        validate_train_config({"learning_rat": 1e-3})


def test_rejects_non_dict() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        validate_train_config([("learning_rate", 1e-3)])  # type: ignore[arg-type]
