"""A pool child of the agents worker killed alone mid-step, on the private servers: its silent
step heartbeat is noticed and the step re-runs from the journal, its effects not repeated.

The fault-suite version of tests/workers/agents/test_agent_pool_child.py (whose model turn,
held search and helpers it shares): here the stack's own web process and a prefork agents worker
run on this suite's private PostgreSQL and Redis, the web process runs the search connector
(pointed at a held SerpAPI fake), the agents worker talks to an OpenAI-protocol fake. The Main
Agent's first step creates a Worker, then searches; with the search held, the test SIGKILLs the
pool child that claimed the step, as the OOM killer would.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import benchmark_register
from apps.experiments.models import Event
from apps.flows.runs import run_start
from apps.research.choices import AgentLoopStatus, AgentMode, NodeKind
from apps.research.models import AgentLoop, LLMUsage, ResearchNode
from tests.factories import make_run
from tests.fakes.openai_chat import FakeChatServer, agent_handle
from tests.workers.agents.stack import wait_for
from tests.workers.agents.test_agent_pool_child import HeldSearch, opening, parent_pid, responder

pytestmark = pytest.mark.slow

STALE_SECONDS = 5  # the step heartbeat's silence that counts; the lease (600 s) cannot be what notices


@pytest.fixture
def held_search() -> Iterator[HeldSearch]:
    with HeldSearch() as fake:
        yield fake
        fake.release.set()  # a search still held ends, so the server can stop


@pytest.fixture
def fake_model() -> Iterator[FakeChatServer]:
    with FakeChatServer(responder) as fake:
        yield fake


@pytest.fixture
def benchmark(transactional_db, artifact_roots, minibench_dir: Path) -> Benchmark:
    """The minibench's arithmetic task, sealed into this test's sealed root."""
    return benchmark_register(name="minibench/arithmetic", task_dir=minibench_dir / "tasks" / "arithmetic")


def test_a_pool_child_killed_mid_step_is_noticed_and_its_step_re_runs_from_the_journal(
    project, benchmark, held_search, fake_model
):
    stack = project(
        "web", "agents", stack_options={"agent_pool": "prefork", "agent_threads": 2},
        RSI_LLM_BASE_URL=fake_model.base_url, RSI_LLM_MODEL="fake-tool-model", RSI_LLM_MAX_RETRIES="3",
        RSI_LLM_BACKOFF="0.2", RSI_AGENT_HEARTBEAT_SECONDS="0.5", RSI_AGENT_STALE_SECONDS=str(STALE_SECONDS),
        RSI_AGENT_STEP_LEASE_SECONDS="600", RSI_SEARCH_PROVIDER_URL=held_search.url,
        RSI_SEARCH_API_KEY=held_search.api_key, RSI_CONNECTOR_TIMEOUT_S="150",
    )  # fmt: skip
    worker = stack.process("agents")
    assert "prefork" in stack.log("agents")  # the banner names the pool
    run = run_start(run=make_run(name="faults: pool child killed", benchmark=benchmark, agent_mode=AgentMode.LLM,
                                 policy={"reviewers": False}), actor="test")  # fmt: skip

    wait_for(held_search.entered.is_set, timeout=180, what="the Main Agent's search", stack=stack.stack)
    main = AgentLoop.objects.get(run=run, node__kind=NodeKind.MAIN)
    assert (main.status, main.step, [entry["kind"] for entry in main.journal]) == (
        AgentLoopStatus.RUNNING, 0, ["llm", "tool"])  # fmt: skip
    claim = main.claimed_by
    child = int(claim.split(":")[1])
    assert parent_pid(child) == worker.pid  # a pool child holds the step, not the worker itself

    os.kill(child, signal.SIGKILL)
    held_search.release.set()  # the web finishes the orphaned search; nobody reads its answer

    def idle_after_re_run() -> bool:
        # Step 0 re-run and committed, then step 1 (text only): the Main Agent waits for a trigger.
        loop = AgentLoop.objects.get(pk=main.pk)
        return loop.step >= 2 and loop.status == AgentLoopStatus.WAITING

    wait_for(idle_after_re_run, timeout=120, what="the Main Agent's step 0 to be re-run", stack=stack.stack)
    assert worker.poll() is None, stack.log("agents")[-3000:]  # the worker lives on; its pool replaced the child
    assert stack.alive("web")

    # Noticed once, by that claim's silent heartbeat.
    [interrupted] = Event.objects.filter(run=run, type="agent.step_interrupted").values_list("arguments", flat=True)
    assert {key: interrupted[key] for key in ("node", "step", "claim")} == {"node": "main", "step": 0, "claim": claim}
    assert interrupted["why"].startswith(f"no heartbeat from {claim} for ")

    # Replayed from the journal, not redone: one Worker, one creation call, one opening model
    # request; every model request charged once; only the held search was sent again.
    main_requests = [body for body in fake_model.requests if agent_handle(body) == "main"]
    effects = {
        "workers": ResearchNode.objects.filter(run=run, kind=NodeKind.WORKER).count(),
        "creations": Event.objects.filter(run=run, type="tool.called", tool="state_add_new_worker").count(),
        "openings": sum(map(opening, main_requests)),
        "charged": LLMUsage.objects.filter(run=run, node__kind=NodeKind.MAIN).count(),
        "searches": len(held_search.requests),
    }
    assert effects == {"workers": 1, "creations": 1, "openings": 1, "charged": len(main_requests), "searches": 2}
    # The project fixture then verifies every event chain, this run's included.
