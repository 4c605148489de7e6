"""What a policy is, and what it sees: ``step(view: StepView) -> Outcome``.

The policy modules import these, not the package (whose ``__init__`` imports them). A policy sees
only this view (its briefing, memory, triggers, and the tools of its role through the REST API);
the step runner (workers/agents/loop.py) builds it and journals every call made through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from workers.agents.client import ToolResult
from workers.agents.policies.transcript import LLMTurn


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


class StepView(Protocol):
    """One step as its policy sees it."""

    role: str
    handle: str
    step: int
    briefing: dict[str, Any]
    state: dict[str, Any]
    inbox: list[dict[str, Any]]
    poll_seconds: float
    wait_seconds: float
    tokens_left: int
    prompt_template: str  # the LLM policy's role prompt; empty for heuristics
    context_tokens: int  # the LLM's context window; 0 for heuristics

    def definitions(self) -> list[dict[str, Any]]: ...

    def tool_names(self) -> set[str]: ...

    def call(self, name: str, args: dict[str, Any] | None = None, *, if_match: str | None = None) -> ToolResult: ...

    def llm(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, segment: int = 0, summary: str = ""
    ) -> LLMTurn:
        """One model turn. ``segment`` counts the compactions so far; ``summary`` is the one made
        for this request, if any (both go into the recorded transcript)."""
        ...


class Policy(Protocol):
    def step(self, view: StepView) -> Outcome: ...
