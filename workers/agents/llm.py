"""The pluggable LLM: any OpenAI-compatible chat-completions endpoint with tool calling.

Configuration comes from the environment (DESIGN.md "Configuration"): ``RSI_LLM_BASE_URL``,
``RSI_LLM_MODEL``, ``RSI_LLM_API_KEY``, with per-role overrides ``RSI_LLM_MODEL_MAIN``,
``RSI_LLM_BASE_URL_WORKER``, ``RSI_LLM_API_KEY_REVIEWER`` and so on, so the Main Agent can run on
a stronger model than the Workers. It is read by ``apps.research.agent_config`` (Django-free, so
``manage.py start_run`` checks it without importing this client). vLLM, DeepSeek, Kimi, GLM and
OpenAI itself all speak this protocol through the openai SDK.

Retries are ours, not the SDK's (``max_retries=0`` there), so the policy is visible and tested:
429, 5xx, timeouts and connection errors back off exponentially (honouring Retry-After) up to
``RSI_LLM_MAX_RETRIES``; anything else (400 bad request, 401 bad key) is not retried.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import openai

# The configuration is read below apps/ and workers/ alike (start_run checks it before a run exists).
from apps.research.agent_config import LLMConfig, LLMNotConfigured, llm_config

# The client's API: what a policy or the step runner needs of the model (config re-exported).
__all__ = ["SUMMARY_PREFIX", "ChatLLM", "LLMConfig", "LLMNotConfigured", "LLMTurn", "LLMUnavailable", "ToolCall",
           "compact_transcript", "estimate_tokens", "llm_config"]  # fmt: skip

logger = logging.getLogger(__name__)


class LLMUnavailable(RuntimeError):
    """The endpoint kept failing (429/5xx/timeouts) after every retry; try the step again later."""


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
        )

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


_RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError, openai.APIConnectionError)


@dataclass
class ChatLLM:
    """A chat-completions client for one role's configuration."""

    config: LLMConfig
    sleep: Any = field(default=time.sleep, repr=False)  # injectable so unit tests need not wait
    _client: openai.OpenAI | None = field(default=None, repr=False)

    def _sdk(self) -> openai.OpenAI:
        if self._client is None:
            self._client = openai.OpenAI(
                base_url=self.config.base_url, api_key=self.config.api_key, timeout=self.config.timeout, max_retries=0
            )
        return self._client

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMTurn:
        """One model turn; retries 429/5xx/timeouts with backoff, then raises LLMUnavailable."""
        attempts = 0
        while True:
            attempts += 1
            try:
                response = self._sdk().chat.completions.create(
                    model=self.config.model,
                    messages=messages,  # type: ignore[arg-type]
                    tools=tools or openai.NOT_GIVEN,  # type: ignore[arg-type]
                    max_tokens=self.config.max_output_tokens,
                    temperature=0,
                )
            except _RETRYABLE as exc:
                if attempts > self.config.max_retries:
                    raise LLMUnavailable(
                        f"{self.config.model}: {type(exc).__name__} after {attempts} attempts"
                    ) from exc
                delay = _retry_after(exc)
                if delay is None:
                    delay = min(self.config.backoff * 2 ** (attempts - 1), 60.0)
                logger.warning("LLM %s: %s; retrying in %.1fs", self.config.model, type(exc).__name__, delay)
                self.sleep(delay)
                continue
            except openai.APIStatusError as exc:
                # Other 4xx: retrying the same request cannot help. 5xx that the SDK did not map.
                if exc.status_code >= 500 and attempts <= self.config.max_retries:
                    self.sleep(min(self.config.backoff * 2 ** (attempts - 1), 60.0))
                    continue
                raise
            return self._turn(response, attempts)

    def _turn(self, response: Any, attempts: int) -> LLMTurn:
        choice = response.choices[0] if response.choices else None
        message = choice.message if choice is not None else None
        calls = []
        for index, call in enumerate(getattr(message, "tool_calls", None) or []):
            function = getattr(call, "function", None)
            calls.append(
                ToolCall(
                    id=getattr(call, "id", None) or f"call_{index}",
                    name=str(getattr(function, "name", "") or ""),
                    arguments=str(getattr(function, "arguments", "") or ""),
                )
            )
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        return LLMTurn(
            content=str(getattr(message, "content", "") or ""),
            tool_calls=calls,
            model=str(getattr(response, "model", "") or self.config.model),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=self.config.cost_usd(prompt_tokens, completion_tokens),
            finish_reason=str(getattr(choice, "finish_reason", "") or ""),
            attempts=attempts,
        )


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    value = headers.get("retry-after")
    try:
        return min(max(0.0, float(value)), 60.0) if value is not None else None
    except ValueError:
        return None


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
