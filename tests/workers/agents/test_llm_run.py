"""The LLM path: agents driven by a model over the OpenAI chat-completions protocol (a loopback fake).

``test_llm_agents_drive_a_short_real_run`` runs on the real stack: the Main Agent and a Worker are
LLM agents whose turns the fake plays from a script — including a rate-limited first request and
a malformed tool call — while the Worker's training and evaluation run for real.
(The LLM token-budget test runs in test_agent_loop.py, in this process, before the stack starts.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db.models import Count

from apps.experiments.models import Experiment
from apps.flows.runs import run_launch
from apps.research.choices import RunStatus
from apps.research.models import AgentLoop, Decision, LLMUsage, ResearchNode, Run
from tests.fakes.openai_chat import Reply, Script, last_tool_answers
from tests.workers.agents.stack import run_status, wait_for

pytestmark = [pytest.mark.slow]


def _submit(body: dict[str, Any]) -> Reply:
    handle = last_tool_answers(body)[0]["entry"]["handle"]
    return Reply(
        tool_calls=[
            (
                "worker_submit",
                {
                    "claim": "a three-step SFT smoke test on the clean set",
                    "train": {
                        "recipe": "sft",
                        "datasets": [handle],
                        "max_steps": 3,
                        "hyperparameters": {"batch_size": 8},
                    },
                },
            )
        ]
    )


def _finalize_when_done(body: dict[str, Any]) -> Reply | None:
    answers = last_tool_answers(body)
    experiments = answers[0].get("experiments", []) if answers else []
    if not experiments or experiments[0]["status"] in ("queued", "running", "held"):
        return None  # keep polling
    exp = experiments[0]
    summary = (
        f"Trained a three-step SFT on arithmetic-clean.\n- {exp['handle']}: {exp['status']}, feedback score "
        f"{exp['feedback_score']}\nConclusion: too short to learn the task; continue with longer training"
    )
    return Reply(tool_calls=[("worker_finalize", {"summary": summary, "experiments": [exp["handle"]]})])


def script() -> Script:
    return Script(
        {
            "main": [
                Reply(content="Reading guidance first.", tool_calls=[("main_guidance_read", "{oops: not json")]),
                *opening_turns("One branch: a short SFT on the cleanest catalog data."),
                Reply(content="The Worker is running; nothing more to do until it reports."),
                Reply(tool_calls=[("main_guidance_read", {}), ("state_inspect_worker", {"worker": "worker_0001"})]),
                Reply(
                    tool_calls=[
                        (
                            "main_optimizer_update",
                            {
                                "decision": {
                                    "kind": "continue",
                                    "trigger": "worker_finalize",
                                    "subject": "worker_0001",
                                    "rationale": "The pipeline works end to end; longer training is the next step.",
                                }
                            },
                        )
                    ]
                ),  # fmt: skip
                Reply(tool_calls=[("stop_loop", {"reason": "a smoke run: one branch is enough"})]),
                Reply(content="Stopped; the final evaluation follows."),
            ],
            "worker_0001": short_sft_worker(),
        },
        wait=Reply(tool_calls=[("state_get_current_worker", {})]),
    )


def opening_turns(rationale: str) -> list[Reply]:
    """The Main Agent's opening: read guidance, record one branch, spawn the Worker of ``short_sft_worker``."""
    task = ("Search the catalog for arithmetic data, register arithmetic-clean, train a short SFT and report the "
            "feedback score.")  # fmt: skip
    decision = {"kind": "branch", "trigger": "run_start", "rationale": rationale}
    return [Reply(tool_calls=[("main_guidance_read", {}), ("main_optimizer_update", {"decision": decision})]),
            Reply(tool_calls=[("state_add_new_worker", {"task": task})])]  # fmt: skip


def short_sft_worker() -> list[Reply | Any]:
    """An LLM Worker's turns: register the clean set, train three steps, finalize once it has ended."""
    return [
        Reply(tool_calls=[("state_get_current_worker", {}), ("hf_search_datasets", {"query": "arithmetic"})]),
        Reply(tool_calls=[("worker_add_data", {"catalog": "arithmetic-clean"})]),
        _submit,
        _finalize_when_done,
    ]


def use_fake_llm(fake_llm: Any, monkeypatch: Any, responder: Script) -> None:
    """Point this process's launcher at the fake (the stack's agents worker already is) with a new script."""
    monkeypatch.setenv("RSI_LLM_BASE_URL", fake_llm.base_url)
    monkeypatch.setenv("RSI_LLM_MODEL", "fake-tool-model")
    fake_llm.responder = responder
    fake_llm.requests.clear()


@pytest.mark.django_db(transaction=True)
def test_llm_agents_drive_a_short_real_run(installed, fake_llm, monkeypatch):
    stack = installed
    # The agents worker was started with this configuration; the launcher checks it too.
    use_fake_llm(fake_llm, monkeypatch, script())
    fake_llm.fail_next(429, retry_after=0)  # the very first request is rate-limited
    run = run_launch(benchmark="minibench/arithmetic", policy="llm", name="agents: llm smoke run",
                     wall_seconds=1800, accelerator_seconds=1200, llm_tokens=500_000, parallel=1,
                     actor="test")  # fmt: skip
    wait_for(lambda: run_status(run) in (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.STOPPED),
             timeout=900, what="the LLM run to finish", stack=stack, every=2)  # fmt: skip
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.FINISHED, list(run.status_changes.values_list("to_status", "reason"))
    worker = ResearchNode.objects.get(run=run, handle="worker_0001")
    experiment = Experiment.objects.get(run=run, owner=worker)
    assert experiment.status == "succeeded"
    assert experiment.action["hyperparameters"]["max_steps"] == 3
    assert worker.status == "finalized"
    assert worker.summary_experiments == [experiment.handle]
    decision = Decision.objects.get(run=run, kind="continue")
    assert decision.trigger == "worker_finalize"
    assert decision.subject == worker
    # Tokens and cost per node, summed on the run and within its budget.
    per_node = dict(LLMUsage.objects.filter(run=run).values_list("node__handle").annotate(n=Count("id")))
    assert set(per_node) == {"main", "worker_0001"}
    assert min(per_node.values()) >= 3
    total = sum(u.prompt_tokens + u.completion_tokens for u in LLMUsage.objects.filter(run=run))
    assert total > 0
    assert run.used_llm_tokens == total <= run.budget_llm_tokens
    assert run.prompt_hashes["policy"] == "llm"
    assert not AgentLoop.objects.filter(run=run, status__in=("scheduled", "running", "waiting")).exists()
    mains = [r for r in fake_llm.requests if "You are the Main Agent (main)" in r["messages"][0]["content"]]
    # The 429 was retried with the same request.
    assert mains[0]["messages"] == mains[1]["messages"]
    # The malformed tool call was answered back to the model as an error, and the run went on.
    answers = [json.loads(m["content"]) for r in mains for m in r["messages"] if m["role"] == "tool"]
    assert any(a.get("error", {}).get("code") == "malformed_tool_call" for a in answers)
    assert all("tools" in r and r["tools"] for r in fake_llm.requests)
