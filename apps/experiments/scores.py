"""How a recorded score is rounded wherever it is shown or restated: one function for both sides.

Workers see feedback scores rounded to the run policy's ``score_decimals`` (apps.expos.visibility),
and the metric-attribution check (apps.integrity.checks.reporting) accepts a stated score that is
the recorded one rounded the same way. Both call :func:`score_rounded`, so an honest restatement of
a shown score is never flagged. Django-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

DEFAULT_SCORE_DECIMALS = 2


def score_rounded(value: float, decimals: int) -> float:
    """``value`` rounded half away from zero on the decimal it prints as (0.955 → 0.96, 0.125 → 0.13).

    Python's ``round`` works on the binary float (``round(0.955, 2) == 0.95``), which is not what a
    person reading 0.955 writes; the shortest decimal repr is what both the Worker and the check see."""
    quantum = Decimal(1).scaleb(-int(decimals))
    return float(Decimal(repr(float(value))).quantize(quantum, rounding=ROUND_HALF_UP))


def score_decimals(policy: Mapping[str, Any] | None) -> int:
    """The decimals a run shows scores to Workers with (run policy ``score_decimals``)."""
    return int((policy or {}).get("score_decimals", DEFAULT_SCORE_DECIMALS))
