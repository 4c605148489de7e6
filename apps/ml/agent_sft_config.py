"""The agent-training recipe (`AgentSFTConfig`) and its check, without the ML stack.

An agent_sft job request is checked by the web server (apps.dojo.services) before the job is
queued; the training itself (agent_sft.py) runs in the gpu worker and loads TRL and torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AgentSFTConfig:
    """The agent-training recipe; defaults are the RSI-Dojo paper's."""

    epochs: int = 4
    learning_rate: float = 1e-5
    min_learning_rate: float = 2e-6
    batch_size: int = 1
    gradient_accumulation_steps: int = 8
    max_length: int = 8192
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # The token that ends a turn; empty means the tokenizer's EOS token.
    end_of_turn_token: str = ""
    seed: int = 0
    num_threads: int = 1
    logging_steps: int = 1


_BOUNDS: dict[str, tuple[float, float]] = {
    "epochs": (1, 100),
    "learning_rate": (1e-9, 1e-2),
    "min_learning_rate": (0.0, 1e-2),
    "batch_size": (1, 256),
    "gradient_accumulation_steps": (1, 256),
    "max_length": (16, 131072),
    "warmup_ratio": (0.0, 0.5),
    "weight_decay": (0.0, 1.0),
    "max_grad_norm": (1e-6, 100.0),
    "seed": (0, 2**31 - 1),
    "num_threads": (1, 64),
    "logging_steps": (1, 10000),
}


def agent_sft_config(values: dict[str, Any] | None) -> AgentSFTConfig:
    """An `AgentSFTConfig` from an untrusted dict; every rejection names the key and the range."""
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(AgentSFTConfig)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown agent_sft setting(s) {unknown}; allowed: {sorted(fields)}")
    for key, value in values.items():
        if key == "end_of_turn_token":
            if not isinstance(value, str):
                raise ValueError(f"end_of_turn_token must be a string, got {value!r}")
            continue
        want_int = isinstance(fields[key].default, int)
        if isinstance(value, bool) or not isinstance(value, int if want_int else int | float):
            raise ValueError(f"{key} must be {'an integer' if want_int else 'a number'}, got {value!r}")
        low, high = _BOUNDS[key]
        if not low <= value <= high:
            raise ValueError(f"{key}={value!r} is out of range; allowed [{low:g}, {high:g}]")
    config = AgentSFTConfig(**values)
    if config.min_learning_rate > config.learning_rate:
        raise ValueError(f"min_learning_rate={config.min_learning_rate} exceeds learning_rate={config.learning_rate}")
    return config
