"""Training hyperparameters: one typed config, validated before any compute is spent.

Agents write these dicts, so every rejection names the key, the value, the allowed range and (for
typos) the closest known key: the message is the agent's only hint for the next attempt.
The experiments domain owns this contract (the submission review and the training gate apply it);
the training core in `apps.ml` consumes it. Django-free: the GPU worker and the minibench build
import it without settings.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

RECIPES = ("sft", "dpo")
ADAPTERS = ("full", "lora")
EOS_HANDLING = ("append", "none")
CHAT_TEMPLATE_MODES = ("keep", "apply")
LR_SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")


@dataclass(frozen=True)
class TrainConfig:
    """One training job's recipe. Defaults are the minibench's known-good SFT recipe."""

    recipe: str = "sft"
    adapter: str = "full"
    learning_rate: float = 1e-3
    max_steps: int = 1000
    batch_size: int = 64
    gradient_accumulation_steps: int = 1
    lr_scheduler_type: str = "cosine"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = 256
    # "append": TRL appends EOS to every completion (so the model learns to stop).
    # "none": rows are pre-tokenized without EOS, reproducing the common never-stops bug.
    eos_handling: str = "append"
    # "keep": train on the raw prompt text; "apply": wrap rows in the tokenizer's chat template.
    chat_template: str = "keep"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    dpo_beta: float = 0.1
    seed: int = 0
    num_threads: int = 1
    logging_steps: int = 10


# (min, max, min_inclusive). Upper bounds are "absurd for this system", not physical limits.
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "learning_rate": (0.0, 1e-2, False),
    "max_steps": (1, 5000, True),
    "batch_size": (1, 256, True),
    "gradient_accumulation_steps": (1, 64, True),
    "warmup_steps": (0, 5000, True),
    "weight_decay": (0.0, 1.0, True),
    "max_grad_norm": (0.0, 100.0, False),
    "max_length": (16, 4096, True),
    "lora_r": (1, 256, True),
    "lora_alpha": (1, 1024, True),
    "lora_dropout": (0.0, 0.9, True),
    "dpo_beta": (0.0, 10.0, False),
    "seed": (0, 2**31 - 1, True),
    "num_threads": (1, 64, True),
    "logging_steps": (1, 5000, True),
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "recipe": RECIPES,
    "adapter": ADAPTERS,
    "eos_handling": EOS_HANDLING,
    "chat_template": CHAT_TEMPLATE_MODES,
    "lr_scheduler_type": LR_SCHEDULERS,
}
_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _check_number(key: str, value: Any, want_int: bool) -> float:
    # bool is an int subclass; "max_steps": true is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "an integer" if want_int else "a number"
        raise ValueError(f"{key} must be {kind}, got {value!r} ({type(value).__name__})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{key} must be finite, got {value!r}")
    if want_int:
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{key} must be an integer, got {value!r}")
            value = int(value)
    else:
        value = float(value)
    low, high, low_inclusive = _BOUNDS[key]
    too_low = value < low if low_inclusive else value <= low
    if too_low or value > high:
        bracket = "[" if low_inclusive else "("
        raise ValueError(f"{key}={value!r} is out of range; allowed {bracket}{low:g}, {high:g}]")
    return int(value) if want_int else float(value)


def validate_train_config(d: dict[str, Any]) -> TrainConfig:
    """Check an untrusted hyperparameter dict and return a `TrainConfig`.

    Raises ValueError with an actionable message for unknown keys, wrong types, NaN/inf,
    out-of-range values, unknown choices and incompatible combinations.
    """
    if not isinstance(d, dict):
        raise ValueError(f"hyperparameters must be a JSON object, got {type(d).__name__}")
    values: dict[str, Any] = {}
    for key, value in d.items():
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), list(_FIELDS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown hyperparameter {key!r}{hint} Allowed: {', '.join(sorted(_FIELDS))}")
        if key in _CHOICES:
            if value not in _CHOICES[key]:
                raise ValueError(f"{key} must be one of {list(_CHOICES[key])}, got {value!r}")
            values[key] = value
        else:
            want_int = isinstance(_FIELDS[key].default, int)
            values[key] = _check_number(key, value, want_int)
    config = TrainConfig(**values)
    if config.recipe == "dpo" and config.eos_handling != "append":
        raise ValueError("eos_handling='none' is only supported with recipe='sft'")
    if config.warmup_steps >= config.max_steps:
        raise ValueError(f"warmup_steps={config.warmup_steps} must be smaller than max_steps={config.max_steps}")
    return config
