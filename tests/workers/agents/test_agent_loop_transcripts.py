"""Transcripts of real agent steps (issue 17): recorded, readable within scope, replayable.

Stepped in this process against the live server, as in test_agent_loop (and sorted before the
end-to-end modules for the same reason: no stack consumes these steps). The heuristic's steps and
an LLM Worker's steps against the loopback OpenAI-protocol fake are recorded as they run; the LLM
conversation is then replayed through a second fake that answers with the recorded turns.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from apps.expos.auth import agent_token_issue
from apps.flows.runs import run_start
from apps.jobs.models import Job
from apps.research.choices import AgentLoopStatus
from apps.research.models import LLMUsage, ResearchNode, Run, TranscriptTurn
from apps.research.services import reviewer_add
from apps.research.transcripts import node_turns, segment_conversations
from tests.apps.dashboard.world import make_people
from tests.fakes.openai_chat import FakeChatServer, Reply, Script, agent_handle, last_tool_answers
from tests.workers.agents.test_agent_loop import started, step, step_until
from workers.agents.policies.llm import LLMPolicy
from workers.agents.replay import recorded_replies, replay_node

pytestmark = pytest.mark.django_db(transaction=True)


def _bearer(run: Run, node: ResearchNode, role: str) -> Client:
    token, _ = agent_token_issue(run=run, node=node, role=role, actor="test")
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def test_heuristic_steps_are_recorded_as_tool_calls_and_read_only_within_scope(small_world):
    started(small_world)
    step_until(small_world, "worker_0001", until="wait")
    run = small_world.refresh()
    main, worker = small_world.main, ResearchNode.objects.get(run=run, handle="worker_0001")
    # The Main Agent's planning step: its tool calls as one assistant message, answered in order.
    first = node_turns(main)[0]
    assert first["source"] == "heuristic"
    calls = first["response"]["tool_calls"]
    assert calls[0]["function"]["name"] == "main_guidance_read"
    assert [m["tool_call_id"] for m in first["tool_messages"]] == [c["id"] for c in calls]
    assert all(m["role"] == "tool" for m in first["tool_messages"])
    # The Worker's submissions link to the experiments and jobs they created.
    submitted = [t for t in node_turns(worker)
                 if any(c["function"]["name"] == "worker_submit" for c in t["response"]["tool_calls"])]  # fmt: skip
    assert submitted
    answers = [json.loads(m["content"]) for t in submitted for m in t["tool_messages"]]
    answer = next(a for a in answers if a.get("experiment") and a.get("job"))
    conversation = segment_conversations(worker)[0]["messages"]
    assert [m["role"] for m in conversation[:3]] == ["system", "user", "assistant"]
    assert TranscriptTurn.objects.filter(node=worker).count() == run.events.filter(
        type="transcript.turn", actor="worker_0001").count()  # fmt: skip

    # The REST API: operators and the Reviewers of this Worker read it; nobody else does.
    people = make_people()
    url = f"/api/v1/nodes/{worker.uuid}/transcript/"
    operator = Client()
    operator.force_login(people["operator"])
    body = operator.get(url).json()
    assert [t["seq"] for t in body["turns"]] == list(range(1, len(node_turns(worker)) + 1))
    viewer = Client()
    viewer.force_login(people["viewer"])
    assert viewer.get(url).status_code == 403
    refused = _bearer(run, worker, "worker").get(url)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden_role"
    reviewer = reviewer_add(run=run, question="Was the screening honest?", scope=[worker], actor="test")
    as_reviewer = _bearer(run, reviewer, "reviewer")
    assert as_reviewer.get(url).json()["turns"][0]["seq"] == 1
    other = ResearchNode.objects.get(run=run, handle="worker_0002")
    out_of_scope = as_reviewer.get(f"/api/v1/nodes/{other.uuid}/transcript/")
    assert out_of_scope.status_code == 404  # a Worker outside its scope is not even visible to it

    # The node's page: the conversation turn by turn, the submission linked to its experiment and job.
    page = operator.get(f"/runs/{run.uuid}/nodes/{worker.uuid}/").content.decode()
    assert "worker_submit" in page
    assert f"/runs/{run.uuid}/experiments/{answer['experiment']}/" in page
    job = Job.objects.get(uuid=answer["job"])
    assert f"/jobs/{job.uuid}/" in page
    assert viewer.get(f"/runs/{run.uuid}/nodes/{worker.uuid}/").status_code == 403


def _submit(body: dict[str, Any]) -> Reply:
    handle = last_tool_answers(body)[0]["entry"]["handle"]
    return Reply(tool_calls=[("worker_submit", {"claim": "a short SFT on the clean set", "train": {
        "recipe": "sft", "datasets": [handle], "max_steps": 3, "hyperparameters": {"batch_size": 8}}})])  # fmt: skip


def _script() -> Script:
    return Script({
        "main": [Reply(tool_calls=[("main_guidance_read", {}), ("state_add_new_worker", {
            "task": "Register arithmetic-clean and train a short SFT."})]), Reply(content="Waiting for the Worker.")],
        "worker_0001": [
            Reply(tool_calls=[("state_get_current_worker", {}), ("hf_search_datasets", {"query": "arithmetic"})]),
            Reply(tool_calls=[("worker_add_data", {"catalog": "arithmetic-clean"})]),
            _submit,
            Reply(content="Submitted; I will wait for the result."),
        ],
    })  # fmt: skip


class _Replayer:
    """Answers with the recorded assistant messages, in order (the fake's responder for a replay)."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)

    def __call__(self, body: dict[str, Any]) -> Reply:
        message = self.replies.pop(0)
        return Reply(content=message.get("content") or "", tool_calls=[
            (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []])  # fmt: skip


class _TerseAnswers(LLMPolicy):
    """A policy change: tool answers are cut at 300 characters for the model."""

    def answer_text(self, content: Any) -> str:
        return super().answer_text(content)[:300]


def test_an_llm_conversation_is_recorded_and_replays_and_a_changed_policy_diverges(small_world, monkeypatch):
    with FakeChatServer(_script()) as fake:
        monkeypatch.setenv("RSI_LLM_BASE_URL", fake.base_url)
        monkeypatch.setenv("RSI_LLM_MODEL", "fake-tool-model")
        Run.objects.filter(pk=small_world.run.pk).update(agent_mode="llm", budget_llm_tokens=2_000_000)
        run_start(run=Run.objects.get(pk=small_world.run.pk), actor="test")
        step(small_world.loop("main"))
        loop = small_world.loop("worker_0001")
        for _ in range(4):
            assert loop.status == AgentLoopStatus.SCHEDULED
            loop = step(loop)
        sent = [r for r in fake.requests if agent_handle(r) == "worker_0001"]
    worker = ResearchNode.objects.get(run=small_world.run, handle="worker_0001")
    turns = node_turns(worker)
    assert [t["source"] for t in turns] == ["llm"] * 4
    # What was recorded is exactly what the model was sent, with the tools offered.
    assert [t["request"]["messages"] for t in turns] == [r["messages"] for r in sent]
    assert all(t["request"]["tools"] == r["tools"] for t, r in zip(turns, sent, strict=True))
    assert turns[0]["response"]["tool_calls"][1]["function"]["name"] == "hf_search_datasets"
    assert [m["role"] for m in turns[0]["tool_messages"]] == ["tool", "tool"]
    assert turns[3]["finish_reason"] == "stop"
    assert turns[0]["finish_reason"] == "tool_calls"
    usage = list(LLMUsage.objects.filter(node=worker).order_by("pk").values_list("prompt_tokens", flat=True))
    assert [t["usage"]["prompt_tokens"] for t in turns] == usage
    assert all(t["segment"] == 0 and t["model"] == "fake-tool-model" for t in turns)

    # Replayed through the fake, answering with the recorded turns: the same sequence, turn by turn.
    with FakeChatServer(_Replayer(recorded_replies(worker))) as replay_fake:
        report = replay_node(worker, llm_base_url=replay_fake.base_url)
    assert report.matches, report.detail
    assert report.replayed == report.original
    assert len(report.original) == 4

    # A changed policy is caught at the first turn whose tool answers it writes differently.
    expected = next(n for n, t in enumerate(turns, 1) if any(len(m["content"]) > 300 for m in t["tool_messages"]))
    with FakeChatServer(_Replayer(recorded_replies(worker))) as replay_fake:
        changed = replay_node(worker, llm_base_url=replay_fake.base_url, policy=_TerseAnswers(role="worker"))
    assert changed.first_divergence == expected
    assert changed.detail.startswith(f"turn {expected}: tool answer")
    assert changed.replayed[:-1] == changed.original[: expected - 1]

    # A changed prompt differs at the first request's system message.
    with FakeChatServer(_Replayer(recorded_replies(worker))) as replay_fake:
        reprompted = replay_node(worker, llm_base_url=replay_fake.base_url, prompt_template="You are {{handle}}.")
    assert reprompted.first_divergence == 1
    assert "request message 1 (system)" in reprompted.detail
