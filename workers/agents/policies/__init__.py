"""Agent policies: what an agent does with one step. Two kinds, with exactly the same tools.

- ``heuristic``: deterministic rules per role, no LLM (the offline demo, the test driver, a
  baseline). Never presented as an LLM result: runs record ``agent_mode=heuristic``.
- ``llm``: an OpenAI-compatible chat model with tool calling, prompted by the role templates in
  ``workers/agents/prompts/``.

A policy gets a :class:`workers.agents.loop.StepView` (briefing, memory, triggers, the journaled
tool calls) and returns an :class:`workers.agents.loop.Outcome`. It never touches the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from workers.agents.loop import Outcome, StepView


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
