"""The LLM policy: a chat model with tool calling drives the role through the same ExpOS tools.

One step = one model turn and its tool calls. The transcript (OpenAI message format) is the
policy state, saved after every step; when it outgrows the model's window, old turns are
summarised (``compact_transcript``). A malformed tool call — arguments that are not JSON, an
unknown tool — is answered back to the model as a tool error, never raised. The run's LLM token
budget is checked before every call, and each call's usage is recorded per node by the loop.
The role's prompt template and context window come with the step (``StepView``), so a policy
reads neither files nor the environment.
"""

from __future__ import annotations

import json
from typing import Any

from workers.agents.policies.base import Outcome, StepView
from workers.agents.policies.transcript import compact_transcript, estimate_tokens

# Tool answers longer than this are cut in the transcript (the agent can page with the tools).
MAX_TOOL_CHARS = 12_000
# Read-only calls that mean "I am waiting for my jobs": the next turn comes after a poll interval.
WAITING_TOOLS = frozenset({"job_status", "state_sync_results", "public_check_quota", "events_tail",
                           "state_get_current_worker", "job_logs", "training_curve_read"})  # fmt: skip
FINAL_TOOLS = {"worker": "worker_finalize", "reviewer": "reviewer_finalize"}
MAX_NUDGES = 3
# What each search policy (search.py) asks of the LLM Main Agent, in its prompt.
SEARCH_POLICY_TEXT = {
    "greedy": "Expand the line with the best feedback score.",
    "uct": "Expand the line with the highest upper confidence bound: its score plus an exploration bonus "
    "that shrinks with the follow-ups it already had; a line whose last follow-up did not improve it is "
    "stagnant — leave it and branch instead.",
}


def render_prompt(template: str, briefing: dict[str, Any], tools: list[dict[str, Any]]) -> str:
    """The role's template (``StepView.prompt_template``) with the briefing and tool list filled in."""
    tool_lines = "\n".join(f"- {t['function']['name']}: {t['function']['description']}" for t in tools)
    budgets = briefing.get("budgets", {})
    values = {
        "{{handle}}": briefing.get("handle", ""),
        "{{run}}": briefing.get("run", ""),
        "{{target_capability}}": briefing.get("target_capability", ""),
        "{{benchmark}}": f"{briefing['benchmark']['name']} ({briefing['benchmark']['task']}): "
        f"{briefing['benchmark'].get('description', '')}",
        "{{budgets}}": ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in budgets.items()),
        "{{max_parallel_workers}}": str(briefing.get("max_parallel_workers", "")),
        "{{policy}}": json.dumps(briefing.get("policy", {}), sort_keys=True),
        "{{search_policy}}": str(briefing.get("search_policy") or "greedy"),
        "{{search_policy_text}}": SEARCH_POLICY_TEXT.get(str(briefing.get("search_policy") or "greedy"), ""),
        "{{tools}}": tool_lines,
    }
    text = template
    for key, value in values.items():
        text = text.replace(key, str(value))
    return text


class LLMPolicy:
    """Any role, driven by the configured chat model."""

    def __init__(self, *, role: str) -> None:
        self.role = role

    def step(self, view: StepView) -> Outcome:
        state = dict(view.state or {})
        tools = view.definitions()
        messages: list[dict[str, Any]] = list(state.get("messages") or [])
        if not messages:
            messages = [
                {"role": "system", "content": render_prompt(view.prompt_template, view.briefing, tools)},
                {"role": "user", "content": self._opening(view)},
            ]
        for item in view.inbox:
            messages.append({"role": "user", "content": self._trigger_text(item)})
        if view.tokens_left <= 0:
            state["messages"] = messages
            return Outcome(state, "done", note="error: the run's LLM token budget is spent")
        budget = int(view.context_tokens * 0.75) - estimate_tokens(tools)
        messages, summary = compact_transcript(messages, budget_tokens=max(2000, budget))
        if summary:
            state["summaries"] = int(state.get("summaries", 0)) + 1
        turn = view.llm(messages, tools, segment=int(state.get("summaries", 0)), summary=summary)
        messages.append(turn.assistant_message())
        names = view.tool_names()
        called, finished = [], False
        for call in turn.tool_calls:
            if call.name not in names:
                content = {"error": {"code": "unknown_tool", "message": f"There is no tool {call.name!r} for the "
                                     f"{self.role} role; use one of the listed tools."}}  # fmt: skip
            else:
                try:
                    args = call.parsed()
                except ValueError as exc:
                    content = {"error": {"code": "malformed_tool_call", "message": f"{exc}. Send the arguments as "
                                         "one JSON object matching the tool's parameters."}}  # fmt: skip
                else:
                    result = view.call(call.name, args)
                    called.append(call.name)
                    content = result.data if result.ok else {"status": result.status, **result.data}
                    if call.name == FINAL_TOOLS.get(self.role) and (
                        result.ok or result.error_code == "node_not_active"
                    ):
                        finished = True
            messages.append({"role": "tool", "tool_call_id": call.id, "content": self.answer_text(content)})
        state["messages"] = messages
        if finished:
            return Outcome(state, "done")
        if not turn.tool_calls:
            if self.role == "main":
                return Outcome(state, "idle")  # the Main Agent waits for its next trigger
            nudges = int(state.get("nudges", 0)) + 1
            state["nudges"] = nudges
            if nudges > MAX_NUDGES:
                return Outcome(state, "done", note="error: the model stopped without finalizing")
            messages.append({"role": "user", "content": f"Continue with a tool call; when your work is complete, "
                             f"call {FINAL_TOOLS[self.role]}."})  # fmt: skip
            return Outcome(state)
        state["nudges"] = 0
        if called and set(called) <= WAITING_TOOLS:
            # Waiting for jobs: the supervisor wakes this loop when one of its experiments ends.
            return Outcome(state, "wait", view.wait_seconds if self.role == "worker" else view.poll_seconds)
        return Outcome(state)

    def answer_text(self, content: Any) -> str:
        """A tool's answer as the tool message the model reads (JSON, cut at ``MAX_TOOL_CHARS``)."""
        text = json.dumps(content, ensure_ascii=False, default=str)
        if len(text) > MAX_TOOL_CHARS:
            text = text[:MAX_TOOL_CHARS] + "…[truncated]"
        return text

    def _opening(self, view: StepView) -> str:
        if self.role == "main":
            return "The run has started. Plan the research: read pending guidance first, then act."
        return f"Your task:\n{view.briefing.get('task', '')}"

    def _trigger_text(self, item: dict[str, Any]) -> str:
        detail = {k: v for k, v in item.items() if k not in ("id", "trigger", "at")}
        text = f"Trigger: {item.get('trigger')}"
        if detail:
            text += " " + json.dumps(detail, sort_keys=True)
        text += ". Read pending guidance first (main_guidance_read), then decide."
        if self.role == "main" and item.get("trigger") == "worker_finalize":
            # The trigger schedule says what the prompt says: a result is a reason to compare and to move on.
            text += (" If there is something to compare (this result and a baseline, or two results) and no "
                     "review is pending, request one now; whether or not a review is pending, keep the strongest "
                     "line moving (continue or verify it) if it has no follow-up running.")  # fmt: skip
        return text
