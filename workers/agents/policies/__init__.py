"""Agent policies: what an agent does with one step. Two kinds, with exactly the same tools.

- ``heuristic``: deterministic rules per role, no LLM (the offline demo, the test driver, a
  baseline). Never presented as an LLM result: runs record ``agent_mode=heuristic``.
- ``llm``: an OpenAI-compatible chat model with tool calling, prompted by the role templates in
  ``workers/agents/prompts/``.

A policy gets a :class:`workers.agents.loop.StepView` (briefing, memory, triggers, the journaled
tool calls) and returns an :class:`Outcome`. It never touches the database.
"""

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


def policy_for(kind: str, role: str) -> Policy:
    """The policy object for a loop's kind (``heuristic`` | ``llm``) and role."""
    if kind == "llm":
        from workers.agents.policies.llm import LLMPolicy

        return LLMPolicy(role=role)
    if kind == "heuristic":
        from workers.agents.policies import heuristic

        return {"main": heuristic.MainHeuristic, "worker": heuristic.WorkerHeuristic,
                "reviewer": heuristic.ReviewerHeuristic}[role]()  # fmt: skip
    raise ValueError(f"no agent policy {kind!r} (heuristic or llm)")
