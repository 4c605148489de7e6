"""A pending review never stalls the best line (issue 32), on the real stack, for both Main Agents.

Heuristic runs under each search policy: the Main asks for a review as soon as there is something to
compare and keeps the strongest line moving meanwhile, so a continuation Worker is active while a
Reviewer is. An LLM run (the fake OpenAI endpoint on loopback): the Main's prompt and trigger say
the same, and the stack lets it start the review and the continuation together. Each run is stopped,
without its final evaluation, once that is on record: the runs last a few minutes.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from apps.experiments.models import Event
from apps.flows.runs import run_launch, run_stop
from apps.research.choices import RunStatus
from apps.research.models import Decision, ResearchNode, Run
from tests.fakes.openai_chat import Reply, Script, last_tool_answers
from tests.workers.agents.stack import run_status, wait_for
from tests.workers.agents.test_llm_run import opening_turns, short_sft_worker, use_fake_llm

pytestmark = [pytest.mark.slow]


def _overlap(run: Run) -> tuple[ResearchNode, ResearchNode] | None:
    """A continuation Worker and a Reviewer that were active at the same time, if any."""
    now = timezone.now()
    continuations = [w for w in ResearchNode.objects.filter(run=run, kind="worker").order_by("pk")
                     if "continue" in w.task.lower().splitlines()[0]]  # fmt: skip
    for reviewer in ResearchNode.objects.filter(run=run, kind="reviewer").order_by("pk"):
        for worker in continuations:
            reviewer_end, worker_end = reviewer.finalized_at or now, worker.finalized_at or now
            if worker.created_at < reviewer_end and reviewer.created_at < worker_end:
                return worker, reviewer
    return None


def _stop(run: Run, stack: Any) -> Run:
    run_stop(run=run, actor="test", reason="seen what the test needs", final_eval=False)
    wait_for(lambda: run_status(run) in (RunStatus.STOPPED, RunStatus.FINISHED, RunStatus.FAILED), timeout=180,
             what="the run to end", stack=stack, every=2)  # fmt: skip
    return Run.objects.get(pk=run.pk)


@pytest.mark.parametrize("policy", ["greedy", "uct"])
@pytest.mark.django_db(transaction=True)
def test_a_heuristic_run_keeps_a_continuation_running_while_a_review_is_pending(installed, policy):
    stack = installed
    run = run_launch(benchmark="minibench/arithmetic", policy="heuristic", name=f"agents: review not a gate {policy}",
                     wall_seconds=1800, accelerator_seconds=1800, parallel=2, max_workers=4, screen_steps=5,
                     train_steps=10, batch_size=16, search_policy=policy, actor="test")  # fmt: skip
    found = wait_for(lambda: _overlap(run), timeout=600, what="a continuation active beside a pending review",
                     stack=stack, every=2)  # fmt: skip
    run = _stop(run, stack)
    worker, reviewer = found
    assert run.search_policy == policy
    # The review was asked for by the Main's first planning step that had something to compare (the
    # first result with its θ0 baseline, else the second result), not after a count of results.
    opening = list(ResearchNode.objects.filter(run=run, kind="worker", created_by_decision__trigger="run_start")
                   .exclude(finalized_at=None).order_by("finalized_at"))  # fmt: skip
    first_review = ResearchNode.objects.filter(run=run, kind="reviewer").order_by("created_at").first()
    assert first_review is not None
    with_baseline = opening and opening[0].experiments.filter(kind="eval_only", status="succeeded").exists()
    second = opening[1].finalized_at if len(opening) > 1 else None
    comparable_at = opening[0].finalized_at if with_baseline else second
    # Every planning step of the Main reads guidance first: those reads mark where its steps start.
    starts = sorted(Event.objects.filter(run=run, actor="main", type="tool.called", tool="main_guidance_read")
                    .values_list("created_at", flat=True))  # fmt: skip
    if comparable_at is not None:
        reading = next(t for t in starts if t >= comparable_at)
        after = [t for t in starts if t > reading]
        assert not after or first_review.created_at < after[0]
    review_decision = first_review.created_by_decision
    assert review_decision is not None
    assert "as soon as there is something to compare" in review_decision.rationale
    # The continuation's decision says why this node, by which policy, and the value rule it passed.
    decision = worker.created_by_decision
    assert decision is not None
    assert decision.kind == "continue"
    assert f"why this node [{policy}]" in decision.rationale
    assert f"Value rule [{policy}]" in decision.rationale
    assert "accelerator-s" in decision.rationale
    assert decision.subject is not None
    assert decision.subject.kind == "worker"


def _llm_script() -> Script:
    def review_and_continue(body: dict[str, Any]) -> Reply:
        answers = last_tool_answers(body)
        experiment = next(e["handle"] for a in answers for e in a.get("experiments", []))
        return Reply(tool_calls=[
            ("state_add_new_reviewer", {"question": f"Does {experiment} beat θ0? Compare it with the baseline.",
                                        "scope": ["worker_0001"]}),
            ("main_optimizer_update", {"decision": {
                "kind": "continue", "trigger": "worker_finalize", "subject": "worker_0001",
                "rationale": f"A review is pending; meanwhile keep the best line moving: continue {experiment}."}}),
            ("state_add_new_worker", {"task": f"Continue training {experiment}'s checkpoint on the same data for "
                                      "longer.", "predecessors": ["worker_0001"]}),
        ])  # fmt: skip

    return Script(
        {
            "main": [
                *opening_turns("One branch to start."),
                Reply(content="The Worker is running."),
                Reply(tool_calls=[("main_guidance_read", {}), ("state_inspect_worker", {"worker": "worker_0001"})]),
                review_and_continue,
                Reply(content="The review is pending and the continuation is running."),
            ],
            "worker_0001": short_sft_worker(),
            # The continuation is at work (it polls) until the test stops the run.
            "worker_0002": [Reply(tool_calls=[("state_get_current_worker", {})]), lambda body: None],
            "reviewer_0001": [
                Reply(
                    tool_calls=[
                        (
                            "reviewer_submit_review",
                            {
                                "summary": "One result so far; too early to separate it from θ0.",
                                "uncertainties": ["a three-step SFT is too short to read"],
                                "recommendations": ["continue the line with longer training"],
                            },
                        )
                    ]
                ),  # fmt: skip
                Reply(tool_calls=[("reviewer_finalize", {"summary": "Too early to separate the result from θ0."})]),
            ],
        },
        wait=Reply(tool_calls=[("state_get_current_worker", {})]),
    )


@pytest.mark.django_db(transaction=True)
def test_an_llm_run_keeps_a_continuation_running_while_a_review_is_pending(installed, fake_llm, monkeypatch):
    stack = installed
    use_fake_llm(fake_llm, monkeypatch, _llm_script())
    run = run_launch(benchmark="minibench/arithmetic", policy="llm", name="agents: llm review not a gate",
                     wall_seconds=1800, accelerator_seconds=1200, llm_tokens=500_000, parallel=2,
                     search_policy="uct", actor="test")  # fmt: skip
    found = wait_for(lambda: _overlap(run), timeout=600, what="a continuation active beside a pending review",
                     stack=stack, every=2)  # fmt: skip
    run = _stop(run, stack)
    worker, reviewer = found
    assert (worker.handle, reviewer.handle) == ("worker_0002", "reviewer_0001")
    assert Decision.objects.filter(run=run, kind="continue", subject__handle="worker_0001").exists()
    mains = [r for r in fake_llm.requests if "You are the Main Agent (main)" in r["messages"][0]["content"]]
    system = mains[0]["messages"][0]["content"]
    # The prompt says it: a review is information, not a gate; the run's search policy is named.
    assert "Reviews are information, not a gate" in system
    assert "Search policy of this run: uct" in system
    # ... and so does the trigger that woke the Main when the first Worker finished.
    woken = [m["content"] for r in mains for m in r["messages"] if m["role"] == "user"
             and m["content"].startswith("Trigger: worker_finalize")]  # fmt: skip
    assert woken
    assert "keep the strongest line moving" in woken[0]
