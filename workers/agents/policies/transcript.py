"""The model conversation as a policy keeps it: turns, tool calls, and compaction to fit the window.

Plain data and pure functions (no SDK, no I/O): the LLM policy builds its transcript with these,
the LLM client (workers/agents/llm.py) returns an ``LLMTurn``, and the step runner journals it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model wrote it; ``arguments`` is the raw string (it may not be JSON)."""

    id: str
    name: str
    arguments: str

    def parsed(self) -> dict[str, Any]:
        """The arguments as an object; ValueError with a message the model can act on otherwise."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"the arguments of {self.name} are not valid JSON ({exc.msg} at {exc.pos})") from None
        if not isinstance(value, dict):
            raise ValueError(f"the arguments of {self.name} must be a JSON object, not {type(value).__name__}")
        return value


@dataclass(frozen=True)
class LLMTurn:
    """One model response: text, tool calls, and what it cost."""

    content: str
    tool_calls: list[ToolCall]
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float = 0.0
    finish_reason: str = ""
    attempts: int = 1
    latency_ms: int = 0  # the wall time of the call, retries included

    def assistant_message(self) -> dict[str, Any]:
        """The turn as the assistant message to append to the transcript."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message

    def as_json(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls],
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "finish_reason": self.finish_reason,
            "attempts": self.attempts,
            "latency_ms": self.latency_ms,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> LLMTurn:
        return cls(
            content=value.get("content") or "",
            tool_calls=[ToolCall(**c) for c in value.get("tool_calls", [])],
            model=value.get("model", ""),
            prompt_tokens=int(value.get("prompt_tokens", 0)),
            completion_tokens=int(value.get("completion_tokens", 0)),
            cost_usd=float(value.get("cost_usd", 0.0)),
            finish_reason=value.get("finish_reason", ""),
            attempts=int(value.get("attempts", 1)),
            latency_ms=int(value.get("latency_ms", 0)),
        )

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# --- keeping the transcript under the context window -----------------------------------------------


def estimate_tokens(value: Any) -> int:
    """A cheap, model-agnostic estimate (about four characters a token in JSON-ish English)."""
    return len(json.dumps(value, ensure_ascii=False, default=str)) // 4 + 1


def compact_transcript(
    messages: list[dict[str, Any]], *, budget_tokens: int, keep_last: int = 12, summary_chars: int = 6000
) -> tuple[list[dict[str, Any]], str]:
    """Summarise old turns until the transcript fits ``budget_tokens``; returns (messages, summary added).

    The system message and the first user message (the role's instructions and task) always stay;
    older turns are replaced by one summary message. Cuts fall only before an assistant message,
    so a tool-call message is never separated from its tool answers (the API refuses that).
    """
    if estimate_tokens(messages) <= budget_tokens or len(messages) <= 3:
        return messages, ""
    head = messages[:2]
    body = [m for m in messages[2:] if not _is_summary(m)]
    previous = "\n".join(m["content"] for m in messages[2:] if _is_summary(m))
    keep = min(keep_last, len(body))
    while True:
        cut = len(body) - keep
        while cut > 0 and body[cut].get("role") != "assistant":
            cut -= 1
        dropped, kept = body[:cut], body[cut:]
        # The summary gets at most about a quarter of the budget (four characters a token).
        summary = _summarise(dropped, previous, min(summary_chars, budget_tokens))
        compacted = [*head, {"role": "user", "content": summary}, *kept]
        if estimate_tokens(compacted) <= budget_tokens or keep <= 2:
            return compacted, summary
        keep = max(2, keep // 2)


SUMMARY_PREFIX = "Summary of earlier turns (older messages were removed to fit the context window):"


def _is_summary(message: dict[str, Any]) -> bool:
    return message.get("role") == "user" and str(message.get("content", "")).startswith(SUMMARY_PREFIX)


def _summarise(dropped: list[dict[str, Any]], previous: str, limit: int) -> str:
    lines = [line for line in previous.splitlines()[1:] if line.strip()]
    for message in dropped:
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                lines.append(f"- called {function.get('name')}({str(function.get('arguments', ''))[:200]})")
            if message.get("content"):
                lines.append(f"- said: {str(message['content'])[:300]}")
        elif role == "tool":
            lines.append(f"  -> {str(message.get('content', ''))[:300]}")
        elif role == "user":
            lines.append(f"- note: {str(message.get('content', ''))[:300]}")
    text = "\n".join(lines)
    if len(text) > limit:
        # The most recent history matters most; the oldest lines go first.
        text = "…\n" + text[-limit:]
    return f"{SUMMARY_PREFIX}\n{text}"
