"""The RSI-Craft filters' thresholds (`CraftConfig`) and their check, without the ML stack.

A dojo build request is checked by the web server (apps.dojo.services) before any row is
written; the steps that use the thresholds (craft.py) run in the gpu worker and load torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class CraftConfig:
    """The filters' thresholds. Defaults are the paper's (size, discriminability) or ours (the rest)."""

    min_items: int = 50
    max_items: int = 300
    repeats: int = 5  # K evaluations of the strong model with the task's own decoding
    # Unstable when the K scores span more than this, or more than this share of items flips.
    max_score_range: float = 0.02
    max_flip_rate: float = 0.05
    # The metric reads the output only if some mutation moves the score at least this much.
    min_mutation_move: float = 0.05
    min_gap: float = 0.10
    both_above: float = 0.80
    both_below: float = 0.20
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def craft_config(values: dict[str, Any] | None) -> CraftConfig:
    """A `CraftConfig` from an untrusted dict; unknown keys and out-of-range values raise ValueError."""
    values = dict(values or {})
    known = CraftConfig.__dataclass_fields__
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown filter setting(s) {unknown}; allowed: {sorted(known)}")
    config = CraftConfig(**values)
    for name in ("max_score_range", "max_flip_rate", "min_mutation_move", "min_gap", "both_above", "both_below"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ValueError(f"{name} must be a fraction in [0, 1], got {value!r}")
    for name in ("min_items", "max_items", "repeats", "seed"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "seed" else 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if config.repeats < 2:
        raise ValueError("repeats must be at least 2: one evaluation cannot show instability")
    if config.min_items > config.max_items:
        raise ValueError(f"min_items={config.min_items} exceeds max_items={config.max_items}")
    return config
