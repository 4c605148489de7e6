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

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import openai

# The configuration is read below apps/ and workers/ alike (start_run checks it before a run exists).
from apps.research.agent_config import LLMConfig, LLMNotConfigured, llm_config

# A turn is the policy's data (the transcript it keeps); this client only produces it.
from workers.agents.policies.transcript import LLMTurn, ToolCall

__all__ = ["ChatLLM", "LLMConfig", "LLMNotConfigured", "LLMTurn", "LLMUnavailable", "ToolCall", "llm_config"]

logger = logging.getLogger(__name__)


class LLMUnavailable(RuntimeError):
    """The endpoint kept failing (429/5xx/timeouts) after every retry; try the step again later."""


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
        started = time.monotonic()
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
            turn = self._turn(response, attempts)
            return dataclasses.replace(turn, latency_ms=int((time.monotonic() - started) * 1000))

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
