"""A pool child of the agents worker killed alone mid-step (as the OOM killer does) is noticed by its
silent step heartbeat, and its step is re-run from the journal: no effect happens twice.

The agents worker is a real ``celery worker`` with the prefork pool, as compose.yaml runs it, on the
test database and this suite's Redis; it reaches the REST API at pytest-django's live server (this
process) and the model at a loopback OpenAI-protocol fake. The Main Agent's first turn creates a
Worker, then searches the web; the search provider (a SerpAPI fake) holds that request, so the
step is in flight, its journal already holding the model turn and the Worker's creation, when the
test SIGKILLs the child that claimed it.

This module sorts before the end-to-end ones on purpose (as test_agent_loop does): the session's
stack, whose agents worker would also consume these steps, is not running yet.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from apps.benchmarks.services import benchmark_register
from apps.experiments.events import chain_verify
from apps.experiments.models import Event
from apps.flows.management.commands.demo import Stack
from apps.flows.runs import run_start
from apps.research.choices import AgentLoopStatus, AgentMode, NodeKind
from apps.research.models import AgentLoop, LLMUsage, ResearchNode
from apps.research.services import run_create
from tests.factories import CheckpointFactory
from tests.fakes.openai_chat import FakeChatServer, Reply, agent_handle
from tests.fakes.serpapi import FakeSerpApi
from tests.support.procs import child_env
from tests.workers.agents.stack import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STALE_SECONDS = 5  # the worker's RSI_AGENT_STALE_SECONDS; its lease (600 s) cannot be what notices


class HeldSearch(FakeSerpApi):
    """SerpAPI whose first search is answered only when the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def route(self, request):  # type: ignore[no-untyped-def]
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(timeout=120)
        return super().route(request)


def opening(body: dict) -> bool:
    return not any(message.get("role") == "assistant" for message in body.get("messages", []))


def responder(body: dict) -> Reply:
    if agent_handle(body) == "main" and opening(body):
        return Reply(tool_calls=[("state_add_new_worker", {"task": "Direction: data-screen\nCapability: arithmetic"}),
                                 ("search_web_google_search", {"query": "lora"})])  # fmt: skip
    return Reply(content="Nothing more to do for now.")


def parent_pid(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after its ')'.
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def held_search(monkeypatch):
    with HeldSearch() as fake:
        # The live server (this process) runs the connector: it reads these per call.
        monkeypatch.setenv("RSI_SEARCH_PROVIDER_URL", fake.url)
        monkeypatch.setenv("RSI_SEARCH_API_KEY", fake.api_key)
        monkeypatch.setenv("RSI_CONNECTOR_TIMEOUT_S", "150")
        yield fake
        fake.release.set()


@pytest.fixture
def fake_model():
    with FakeChatServer(responder) as fake:
        yield fake


@pytest.fixture
def agents_worker(transactional_db, agent_roots: Path, live_api: str, fake_model, tmp_path: Path):
    """A prefork agents worker (two children) with a fast step heartbeat; it dies with this process."""
    env = child_env(
        REDIS_URL=settings.CELERY_BROKER_URL, RSI_ARTIFACT_ROOT=settings.ARTIFACT_ROOT,
        RSI_SEALED_ROOT=settings.SEALED_ROOT, RSI_WORKSPACE_ROOT=settings.WORKSPACE_ROOT,
        RSI_MINIBENCH_ROOT=settings.MINIBENCH_ROOT, RSI_LLM_BASE_URL=fake_model.base_url,
        RSI_LLM_MODEL="fake-tool-model", RSI_LLM_MAX_RETRIES="3", RSI_LLM_BACKOFF="0.2",
        RSI_AGENT_HEARTBEAT_SECONDS="0.5", RSI_AGENT_STALE_SECONDS=str(STALE_SECONDS),
        RSI_AGENT_STEP_LEASE_SECONDS="600", RSI_RUN_SUPERVISE_SECONDS="1", RSI_AGENT_POLL_SECONDS="1",
        RSI_TOKEN_RATE="", OMP_NUM_THREADS="1",
    )  # fmt: skip
    api = urlsplit(live_api)  # the stack's RSI_API_URL: here the live server, not a web process of its own
    stack = Stack(env=env, log_dir=tmp_path / "logs", host=api.hostname, port=api.port, agent_pool="prefork",
                  agent_threads=2)  # fmt: skip
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("agents")
    stack.start(("agents",))  # tied to this process by the Stack's Lifeline
    try:
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()
        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("agents", "gpu", "default")


def test_a_pool_child_killed_mid_step_is_noticed_by_its_heartbeat_and_the_step_re_runs_once(
    agents_worker, agent_roots, held_search, fake_model
):
    benchmark = benchmark_register(name="test/arith", task_dir=agent_roots / "task")
    run = run_create(name="agents: pool child killed", benchmark=benchmark,
                     base_checkpoint=CheckpointFactory(is_base=True), target_capability="Two-digit addition",
                     budget_wall_seconds=3600, budget_accelerator_seconds=3600, budget_llm_tokens=1_000_000,
                     agent_mode=AgentMode.LLM, policy={"reviewers": False})  # fmt: skip
    run_start(run=run, actor="test")
    logs = agents_worker.log

    # The Main Agent's first step is in flight: its search is held, its journal has the rest.
    wait_for(held_search.entered.is_set, timeout=180, what="the Main Agent's search", stack=agents_worker)
    main = AgentLoop.objects.get(run=run, node__kind=NodeKind.MAIN)
    assert (main.status, main.step) == (AgentLoopStatus.RUNNING, 0)
    assert [entry["kind"] for entry in main.journal] == ["llm", "tool"]
    claim = main.claimed_by
    host, pid, _thread = claim.split(":")
    worker = agents_worker.processes["agents"]
    assert parent_pid(int(pid)) == worker.pid  # a pool child, not the worker itself

    os.kill(int(pid), signal.SIGKILL)
    held_search.release.set()  # the web finishes the orphaned request; nobody reads its answer

    def re_run_and_idle() -> bool:
        # Step 0 re-run and committed, then step 1 (text only): the Main Agent waits for a trigger.
        loop = AgentLoop.objects.get(pk=main.pk)
        return loop.step >= 2 and loop.status == AgentLoopStatus.WAITING

    wait_for(re_run_and_idle, timeout=120, what="the Main Agent's step 0 to be re-run", stack=agents_worker)
    assert worker.poll() is None, logs()[-3000:]  # the worker lived on; only its child died

    # Noticed by the silent heartbeat of that claim (the lease is 600 s), once.
    interrupted = Event.objects.filter(run=run, type="agent.step_interrupted")
    assert interrupted.count() == 1
    why = interrupted.get().arguments
    assert (why["node"], why["step"], why["claim"]) == ("main", 0, claim)
    assert why["why"].startswith(f"no heartbeat from {claim} for ")

    # Re-run from the journal: the model turn and the Worker's creation were replayed, not redone.
    workers = ResearchNode.objects.filter(run=run, kind=NodeKind.WORKER)
    assert workers.count() == 1
    created = Event.objects.filter(run=run, type="tool.called", tool="state_add_new_worker")
    assert created.count() == 1
    main_requests = [body for body in fake_model.requests if agent_handle(body) == "main"]
    assert sum(opening(body) for body in main_requests) == 1
    # Each answered model turn is charged once: the replayed one is not charged again.
    main_node = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
    assert LLMUsage.objects.filter(run=run, node=main_node).count() == len(main_requests)
    # The in-flight search was the one call sent again.
    assert len(held_search.requests) == 2
    assert chain_verify(str(run.uuid)).ok
