"""Every research and review service announces its change to the run page, after commit, itself.

Each test listens on the run's group of the real channel layer (channels_redis), calls one
service, and compares what arrives with the record's selector read afterwards: what a fresh
snapshot would show. Nothing here publishes (STYLE.md 31a). Transactional, so on_commit fires.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils.module_loading import import_string

from apps.flows import agent_reports, runs
from apps.live.groups import run_group
from apps.research import services
from apps.research.choices import EdgeKind, NodeKind, PredictionVerdict, RunStatus
from apps.research.models import Guidance, Prediction, Run
from apps.research.selectors import (
    decision_live,
    edge_live,
    guidance_live_get,
    node_live,
    prediction_live_get,
    run_live_get,
)
from apps.reviews.models import ReviewReport
from apps.reviews.selectors import report_live_get
from apps.reviews.services import review_finalize, review_submit
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def as_json(value: Any) -> Any:
    """A payload as it travels (UUIDs and datetimes as strings)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


class Listener:
    """A channel on run groups of the configured layer; ``events()`` drains what has arrived.

    Its own layer instance on its own event loop (one thread): channels_redis binds a channel's
    receive buffer to the loop that first read it, so every read must come from that one loop.
    """

    def __init__(self) -> None:
        config = settings.CHANNEL_LAYERS["default"]
        self.layer = import_string(config["BACKEND"])(**config.get("CONFIG", {}))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.channel = self._run(self.layer.new_channel())
        self.groups: list[str] = []

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def listen(self, run: Run) -> None:
        self.groups.append(run_group(run.uuid))
        self._run(self.layer.group_add(self.groups[-1], self.channel))

    def events(self, quiet: float = 0.3) -> list[tuple[str, dict[str, Any]]]:
        async def drain() -> list[dict[str, Any]]:
            received = []
            while True:
                try:
                    received.append(await asyncio.wait_for(self.layer.receive(self.channel), quiet))
                except TimeoutError:
                    return received

        return [(m["event"], m["payload"]) for m in self._run(drain())]

    def only(self, event: str) -> list[dict[str, Any]]:
        return [payload for name, payload in self.events() if name == event]

    def close(self) -> None:
        for group in self.groups:
            self._run(self.layer.group_discard(group, self.channel))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()  # here, with no loop running: channels_redis closes its connections on it


@pytest.fixture
def live(transactional_db):
    listener = Listener()
    yield listener
    listener.close()
    # run_start and run_resume put messages on the Celery queues; no worker will read them here.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("gpu", "agents", "default")


@pytest.fixture
def run(live):
    run = make_run()
    live.listen(run)
    return run


@pytest.fixture
def person(transactional_db):
    return User.objects.create_user("olga")


def worker(run: Run, **kwargs: Any):
    return services.node_create(run=run, kind=NodeKind.WORKER, task="w", **kwargs)


def test_a_created_run_is_announced(live):
    with transaction.atomic():
        run = make_run()
        live.listen(run)  # before the commit: the event leaves on it
    assert live.only("run.updated") == [as_json(run_live_get(run))]


def test_every_status_change_is_a_run_update(live, run):
    services.run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
    assert live.events() == [("run.updated", as_json(run_live_get(run)))]
    assert run_live_get(run)["status"] == "running"


def test_start_pause_resume_and_stop_update_the_run(live, run):
    runs.run_start(run=run, actor="test")
    started = live.only("run.updated")
    assert started[-1] == as_json(run_live_get(run))
    assert started[-1]["status"] == "running"
    assert started[-1]["started_at"]
    runs.run_pause(run=run, actor="test")
    assert live.only("run.updated") == [as_json(run_live_get(run))]
    runs.run_resume(run=run, actor="test")
    assert live.only("run.updated")[-1]["status"] == "running"
    runs.run_stop_request(run=run, reason="enough", actor="main")
    assert live.only("run.updated") == [as_json(run_live_get(run))]
    assert run_live_get(run)["status"] == "stopping"


def test_an_aborted_run_is_announced_stopped(live, run):
    runs.run_start(run=run, actor="test")
    live.events()
    runs.run_stop(run=run, actor="test", final_eval=False)
    assert live.only("run.updated") == [as_json(run_live_get(run))]
    assert run_live_get(run)["status"] == "stopped"


def test_llm_usage_updates_the_run_budget(live, run):
    main = run.nodes.get(kind=NodeKind.MAIN)
    services.llm_usage_record(run=run, node=main, model="m", prompt_tokens=30, completion_tokens=12)
    (payload,) = live.only("run.updated")
    assert payload == as_json(run_live_get(run))
    assert payload["used_llm_tokens"] == 42


def test_a_spent_budget_stops_the_run_live(live, run):
    services.run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
    Run.objects.filter(pk=run.pk).update(used_accelerator_seconds=run.budget_accelerator_seconds)
    live.events()
    runs.run_budget_enforce(run=run)
    assert live.only("run.updated") == [as_json(run_live_get(run))]
    assert run_live_get(run)["status"] == "stopping"


def test_the_final_evaluation_and_the_result_update_the_run(live, run):
    services.run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
    services.run_set_status(run=run, status=RunStatus.STOPPING, actor="test")
    live.events()
    runs.run_final_eval_start(run=run)
    assert live.only("run.updated") == [as_json(run_live_get(run))]
    assert run_live_get(run)["status"] == "final_eval"
    runs.run_finish(run=run)
    (finished,) = live.only("run.updated")
    assert finished == as_json(run_live_get(run))
    assert finished["status"] == "finished"
    assert finished["finished_at"]


def test_a_new_worker_arrives_before_its_edges(live, run):
    first = worker(run)
    assert live.events() == [("node.created", as_json(node_live(first)))]
    second = worker(run, upstream=[first])
    edge = second.upstream_edges.get()
    assert live.events() == [("node.created", as_json(node_live(second))), ("edge.created", as_json(edge_live(edge)))]
    assert live.events() == []


def test_worker_add_reviewer_add_and_dag_edge_add_are_announced(live, run):
    first = services.worker_add(run=run, task="a", predecessors=[])
    second = services.worker_add(run=run, task="b", predecessors=[])
    live.events()
    edge = services.dag_edge_add(run=run, upstream=first, downstream=second, kind=EdgeKind.CONTEXT)
    assert live.events() == [("edge.created", as_json(edge_live(edge)))]
    reviewer = services.reviewer_add(run=run, question="compare", scope=[first, second])
    events = live.events()
    assert events[0] == ("node.created", as_json(node_live(reviewer)))
    assert [name for name, _ in events[1:]] == ["edge.created", "edge.created"]


def test_a_finalized_worker_is_a_node_update(live, run):
    node = worker(run)
    live.events()
    agent_reports.worker_finalize(node=node, summary="done", experiments=[], actor=node.handle)
    (payload,) = live.only("node.updated")
    assert payload == as_json(node_live(node))
    assert payload["status"] == "finalized"
    assert payload["finalized_at"]


def test_posted_guidance_is_pending_then_applied_when_read(live, run, person):
    guidance = services.guidance_post(run=run, author=person, text="try more data")
    (created,) = live.only("guidance.created")
    assert created["applied_at"] is None
    assert created == as_json(guidance_live_get(guidance))
    services.guidance_mark_read(run=run)
    (applied,) = live.only("guidance.updated")
    assert applied == as_json(guidance_live_get(guidance))
    assert applied["applied_at"] is not None


def test_a_decision_and_the_guidance_it_applied_are_announced(live, run, person):
    guidance = Guidance.objects.create(run=run, author=person, text="verify the best")
    subject = worker(run)
    live.events()
    decision = services.decision_record(run=run, kind="verify", trigger="guidance", rationale="because",
                                        subject=subject, guidance=[guidance])  # fmt: skip
    events = live.events()
    assert events == [
        ("decision.created", as_json(decision_live(decision))),
        ("guidance.updated", as_json(guidance_live_get(guidance))),
    ]
    assert events[1][1]["applied_decision"] == str(decision.uuid)


def test_predictions_are_announced_when_created_bound_and_reconciled(live, run):
    node = worker(run)
    live.events()
    created = services.prediction_bind(run=run, worker=node, text="beats θ0", expected_value=0.5)
    assert live.events() == [("prediction.created", as_json(prediction_live_get(created)))]
    open_one = Prediction.objects.create(run=run, text="an earlier guess")
    services.prediction_bind(run=run, worker=worker(run), prediction=open_one)
    bound = [p for name, p in live.events() if name == "prediction.updated"]
    assert bound == [as_json(prediction_live_get(open_one))]
    assert bound[0]["worker"] is not None
    services.prediction_reconcile(prediction=created, verdict=PredictionVerdict.REFUTED, observed_value=0.1,
                                  note="no gain")  # fmt: skip
    (reconciled,) = live.only("prediction.updated")
    assert reconciled == as_json(prediction_live_get(created))
    assert reconciled["verdict"] == "refuted"


def test_reviewer_reports_are_announced_when_submitted_and_finalized(live, run):
    scope = worker(run)
    reviewer = services.node_create(run=run, kind=NodeKind.REVIEWER, task="judge", upstream=[scope])
    live.events()
    report = review_submit(reviewer=reviewer, summary="looks sound", experiments=[], observations=[], findings={})
    assert live.events() == [("report.created", as_json(report_live_get(report)))]
    review_finalize(reviewer=reviewer, summary="", actor=reviewer.handle)
    events = live.events()
    assert ("node.updated", as_json(node_live(reviewer))) in events
    assert ("report.updated", as_json(report_live_get(report))) in events
    assert ReviewReport.objects.get(pk=report.pk).status == "finalized"


def _spawn_then_fail(run: Run) -> None:
    with transaction.atomic():
        worker(run)
        raise RuntimeError("the caller failed")


def test_a_rolled_back_change_is_never_announced(live, run):
    with pytest.raises(RuntimeError):
        _spawn_then_fail(run)
    assert live.events() == []
