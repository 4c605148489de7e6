"""What every policy is: a ``step(view) -> Outcome`` (the policy modules import this, not the package)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from workers.agents.loop import StepView


@dataclass
class Outcome:
    """What a step decided: the policy's new state and when the loop should step again.

    ``next``: ``continue`` (at once), ``wait`` (after ``wait_seconds``; a Worker polling its jobs),
    ``idle`` (until a trigger: the Main Agent), ``done`` (the agent finished).
    """

    state: dict[str, Any]
    next: str = "continue"
    wait_seconds: float = 0.0
    note: str = ""

    def __post_init__(self) -> None:
        if self.next not in ("continue", "wait", "idle", "done"):
            raise ValueError(f"Outcome.next must be continue, wait, idle or done, not {self.next!r}")


class Policy(Protocol):
    def step(self, view: StepView) -> Outcome: ...
