"""Agent policies: what an agent does with one step. Two kinds, with exactly the same tools.

- ``heuristic``: deterministic rules per role, no LLM (the offline demo, the test driver, a
  baseline). Never presented as an LLM result: runs record ``agent_mode=heuristic``.
- ``llm``: an OpenAI-compatible chat model with tool calling, prompted by the role templates in
  ``apps/research/prompts/`` (versioned with the run: ``run_start`` stores their hashes).

A policy gets a :class:`~workers.agents.policies.base.StepView` (briefing, memory, triggers, the
journaled tool calls) and returns an :class:`Outcome`. It never touches the database, and imports
only the API client (``workers.agents.client``): the import-linter contract in pyproject.toml.
"""

from __future__ import annotations

from workers.agents.policies import heuristic
from workers.agents.policies.base import Outcome, Policy, StepView
from workers.agents.policies.llm import LLMPolicy

__all__ = ["Outcome", "Policy", "StepView", "policy_for"]


def policy_for(kind: str, role: str) -> Policy:
    """The policy object for a loop's kind (``heuristic`` | ``llm``) and role."""
    if kind == "llm":
        return LLMPolicy(role=role)
    if kind == "heuristic":
        return {"main": heuristic.MainHeuristic, "worker": heuristic.WorkerHeuristic,
                "reviewer": heuristic.ReviewerHeuristic}[role]()  # fmt: skip
    raise ValueError(f"no agent policy {kind!r} (heuristic or llm)")
