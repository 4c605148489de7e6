"""A transient fault never ends an agent's node: the step is retried later, from where it was.

Stepped in this process against the live server, as in test_agent_loop (and sorted before the
end-to-end modules for the same reason). The fault is real: the rate limiter's Redis is
unreachable (a port nobody listens on) and may not run open, so every tool call answers 503.
"""

from __future__ import annotations

import pytest

from apps.experiments.models import Event
from apps.research.choices import AgentLoopStatus, NodeStatus
from apps.research.models import AgentLoop, ResearchNode
from tests.workers.agents.test_agent_loop import started, step

pytestmark = pytest.mark.django_db(transaction=True)

UNREACHABLE_REDIS = {
    "default": {
        "BACKEND": "apps.core.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }
}


def test_a_worker_whose_calls_answer_503_keeps_its_node_and_retries_the_step(small_world, settings, monkeypatch):
    started(small_world)
    worker = AgentLoop.objects.filter(run=small_world.run, node__kind="worker").order_by("pk").first()
    assert worker.status == AgentLoopStatus.SCHEDULED
    healthy_caches = settings.CACHES
    # The step's retries fit in its lease (3 s of a 4 s lease); 503s ask for no wait.
    monkeypatch.setenv("RSI_AGENT_STEP_LEASE_SECONDS", "4")
    settings.RSI_RETRY_AFTER_SECONDS = 0
    settings.RSI_RATE_LIMIT_FAIL_OPEN_SECONDS = 0
    settings.CACHES = UNREACHABLE_REDIS

    after = step(worker)

    # Released for a later retry, not done: the node stays active, nothing counted as a failure,
    # and the step (its cursor, its phase) is where it was.
    assert after.status == AgentLoopStatus.SCHEDULED
    assert after.failures == 0
    assert "ApiUnavailable" in after.last_error
    assert "rate_limiter_unavailable" in after.last_error
    assert (after.step, after.state) == (worker.step, worker.state)
    assert ResearchNode.objects.get(pk=worker.node_id).status == NodeStatus.ACTIVE
    assert Event.objects.filter(run=small_world.run, type="rate_limit.degraded").exists()

    settings.CACHES = healthy_caches
    again = step(after)

    assert again.step == worker.step + 1
    assert again.state["phase"] == "discover"  # oriented: the retried step did its work
    assert again.status == AgentLoopStatus.SCHEDULED
    assert Event.objects.filter(run=small_world.run, type="rate_limit.restored").exists()
