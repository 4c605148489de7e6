"""The LLM client against a loopback server speaking the OpenAI chat-completions protocol."""

from __future__ import annotations

import json

import pytest

from apps.research.agent_config import LLMConfig, LLMNotConfigured, llm_config
from tests.fakes.openai_chat import FakeChatServer, Reply
from workers.agents.llm import ChatLLM, LLMUnavailable
from workers.agents.policies.transcript import SUMMARY_PREFIX, compact_transcript, estimate_tokens

TOOLS = [{"type": "function", "function": {"name": "public_check_quota", "description": "Budget left.",
                                           "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip


def make_llm(fake: FakeChatServer, **changes) -> tuple[ChatLLM, list[float]]:
    slept: list[float] = []
    config = LLMConfig(base_url=fake.base_url, model="fake-tool-model", api_key="k", timeout=5, max_retries=3,
                       backoff=0.25, price_prompt=2.0, price_completion=6.0, **changes)  # fmt: skip
    return ChatLLM(config, sleep=slept.append), slept


def test_a_scripted_tool_call_comes_back_parsed_with_usage_and_cost():
    with FakeChatServer(lambda body: Reply(content="checking", tool_calls=[("public_check_quota", {})])) as fake:
        llm, _ = make_llm(fake)
        turn = llm.complete([{"role": "user", "content": "go"}], TOOLS)
    assert [c.name for c in turn.tool_calls] == ["public_check_quota"]
    assert turn.tool_calls[0].parsed() == {}
    assert turn.content == "checking"
    assert turn.prompt_tokens > 0
    assert turn.completion_tokens > 0
    assert turn.cost_usd == pytest.approx((turn.prompt_tokens * 2 + turn.completion_tokens * 6) / 1e6)
    sent = fake.requests[0]
    assert sent["model"] == "fake-tool-model"
    assert sent["tools"][0]["function"]["name"] == "public_check_quota"
    assert turn.assistant_message()["tool_calls"][0]["function"]["arguments"] == "{}"


def test_a_429_then_success_is_retried_after_retry_after():
    with FakeChatServer(lambda body: Reply(content="ok")) as fake:
        fake.fail_next(429, retry_after=0.5)
        llm, slept = make_llm(fake)
        turn = llm.complete([{"role": "user", "content": "go"}], [])
    assert turn.content == "ok"
    assert turn.attempts == 2
    assert len(fake.requests) == 2
    assert slept == [0.5]  # the server's Retry-After, not the default backoff


def test_5xx_and_timeouts_back_off_exponentially_then_give_up():
    with FakeChatServer(lambda body: Reply(content="never")) as fake:
        fake.fail_next(503, times=10, retry_after=None)
        llm, slept = make_llm(fake)
        with pytest.raises(LLMUnavailable):
            llm.complete([{"role": "user", "content": "go"}], [])
    assert len(fake.requests) == 4  # one try and three retries
    assert slept == [0.25, 0.5, 1.0]


def test_a_malformed_tool_call_is_returned_raw_and_explains_itself():
    with FakeChatServer(lambda body: Reply(tool_calls=[("public_check_quota", "{not json")])) as fake:
        llm, _ = make_llm(fake)
        turn = llm.complete([{"role": "user", "content": "go"}], TOOLS)
    call = turn.tool_calls[0]
    assert call.arguments == "{not json"
    with pytest.raises(ValueError, match="not valid JSON"):
        call.parsed()


def test_per_role_configuration_overrides_the_default(monkeypatch):
    monkeypatch.setenv("RSI_LLM_BASE_URL", "http://llm.example/v1")
    monkeypatch.setenv("RSI_LLM_MODEL", "small")
    monkeypatch.setenv("RSI_LLM_MODEL_MAIN", "large")
    monkeypatch.setenv("RSI_LLM_CONTEXT_TOKENS_WORKER", "8000")
    assert llm_config("main").model == "large"
    assert llm_config("worker").model == "small"
    assert llm_config("worker").context_tokens == 8000
    assert llm_config("reviewer").context_tokens == 32000
    monkeypatch.delenv("RSI_LLM_MODEL")
    with pytest.raises(LLMNotConfigured, match="RSI_LLM_MODEL"):
        llm_config("worker")


def _transcript(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "role prompt " * 50}, {"role": "user", "content": "your task"}]
    for i in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "job_status", "arguments": json.dumps({"n": i})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": json.dumps({"jobs": ["x" * 400]})})
    return messages


def test_old_turns_are_summarised_to_fit_the_window_without_splitting_tool_calls():
    messages = _transcript(40)
    budget = estimate_tokens(messages) // 4
    compacted, summary = compact_transcript(messages, budget_tokens=budget)
    assert estimate_tokens(compacted) <= budget
    assert compacted[:2] == messages[:2]  # instructions and task stay
    assert compacted[2]["content"].startswith(SUMMARY_PREFIX)
    assert "job_status" in summary
    body = compacted[3:]
    assert body[0]["role"] == "assistant"  # the kept part starts at a turn boundary
    ids = {c["id"] for m in body if m["role"] == "assistant" for c in m["tool_calls"]}
    assert {m["tool_call_id"] for m in body if m["role"] == "tool"} == ids
    # Compacting again folds the earlier summary in rather than stacking summaries.
    again, _ = compact_transcript([*compacted, *_transcript(40)[2:]], budget_tokens=budget)
    assert sum(1 for m in again if str(m.get("content", "")).startswith(SUMMARY_PREFIX)) == 1


def test_a_transcript_under_the_budget_is_left_alone():
    messages = _transcript(2)
    assert compact_transcript(messages, budget_tokens=100_000) == (messages, "")
