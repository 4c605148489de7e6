"""Every service that changes what the run page shows announces it: its event reaches the run socket.

One case per state change (run status; node created and finalized; edge; decision; prediction;
guidance created and applied; reviewer report; experiment created, status, score and integrity
status; evaluation; job). Each case calls the real service on a small real run
(tests/apps/dashboard/world.py) while a viewer's socket is open on the real RunConsumer and the
real channels_redis layer, and checks that the event arrives with the payload the record's
selector builds now, and that the socket's snapshot plus the events equals a fresh snapshot.
Nothing here publishes (STYLE.md 31a): a service that forgets to announce a change fails here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from django.conf import settings

from apps.core.hashing import sha256_text
from apps.dashboard.selectors import run_snapshot
from apps.dashboard.services import finding_adjudicate_for_person
from apps.experiments.models import Evaluation, Experiment
from apps.experiments.selectors import evaluation_live, experiment_live
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.flows import agent_reports, pipeline, runs
from apps.jobs.models import Job
from apps.jobs.selectors import job_payload
from apps.jobs.services import job_claim, job_enqueue, job_report, job_succeed_with_evaluation
from apps.live.events import LiveEvent
from apps.research import services as research
from apps.research.choices import RunStatus
from apps.research.models import Prediction, ResearchEdge, ResearchNode, Run
from apps.research.selectors import (
    decision_live,
    edge_live,
    guidance_live_get,
    node_live,
    prediction_live,
    run_live_get,
)
from apps.reviews.models import ReviewReport
from apps.reviews.selectors import report_live
from apps.reviews.services import review_finalize, review_submit
from tests.apps.dashboard import live_helpers as lh
from tests.apps.dashboard.world import World, build_world

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]
# How long a case waits for its events; they are sent before the service returns, so this is slack.
ARRIVAL_SECONDS = 10.0
# After the expected events: how long the socket must stay quiet before the case's events are complete.
SETTLE_SECONDS = 0.3


@dataclass
class Expect:
    """An event the case's service must publish, and the record the payload must be (read after the call)."""

    event: LiveEvent
    record: Callable[[], dict[str, Any]]
    # A payload may be a subset of the record with its key (STYLE: run.* and the high-rate events).
    subset: bool = False


@pytest.fixture
def tworld(transactional_db):
    world = build_world()
    yield world
    # The services enqueue agent steps and jobs on the Celery queues; no worker reads them here.
    redis.Redis.from_url(settings.REDIS_URL).delete("gpu", "agents", "default")


# --- the cases: (prepare, act). ``prepare`` runs before the socket opens (its events are not
# watched); ``act`` calls the one service under test and returns what it must have published.


def _fresh_run(world: World) -> Run:
    return Run.objects.get(pk=world.run.pk)


def _run_updated(world: World) -> list[Expect]:
    return [Expect(LiveEvent.RUN_UPDATED, lambda: run_live_get(world.run), subset=True)]


def pause(world: World, _: Any) -> list[Expect]:
    runs.run_pause(run=_fresh_run(world), actor="user:operator-person", reason="lunch")
    return _run_updated(world)


def resume_prepare(world: World) -> Any:
    return runs.run_pause(run=_fresh_run(world), actor="user:operator-person")


def resume(world: World, _: Any) -> list[Expect]:
    runs.run_resume(run=_fresh_run(world), actor="user:operator-person")
    return _run_updated(world)


def stop(world: World, _: Any) -> list[Expect]:
    runs.run_stop(run=_fresh_run(world), actor="user:operator-person", reason="enough")
    return _run_updated(world)


def finish_prepare(world: World) -> Any:
    return research.run_set_status(run=_fresh_run(world), status=RunStatus.FINAL_EVAL, actor="test")


def finish(world: World, _: Any) -> list[Expect]:
    runs.run_finish(run=_fresh_run(world))
    assert _fresh_run(world).status == RunStatus.FINISHED
    return _run_updated(world)


def llm_tokens_charged(world: World, _: Any) -> list[Expect]:
    main = ResearchNode.objects.get(run=world.run, kind="main")
    research.llm_usage_record(run=world.run, node=main, model="heuristic", prompt_tokens=900, completion_tokens=100)
    return _run_updated(world)  # the page's LLM-token budget bar


def _node_and_its_edges(node: ResearchNode) -> list[Expect]:
    expected = [Expect(LiveEvent.NODE_CREATED, lambda: node_live(node))]
    for edge in ResearchEdge.objects.filter(downstream=node):
        expected.append(Expect(LiveEvent.EDGE_CREATED, lambda edge=edge: edge_live(edge)))
    return expected


def worker_created(world: World, _: Any) -> list[Expect]:
    worker = research.worker_add(run=world.run, task="DPO from exp_0001", predecessors=[world.nodes["w3"]])
    return _node_and_its_edges(worker)


def reviewer_created(world: World, _: Any) -> list[Expect]:
    reviewer = research.reviewer_add(
        run=world.run, question="Do worker_0002 and worker_0003 agree?", scope=[world.nodes["w2"], world.nodes["w3"]]
    )
    return _node_and_its_edges(reviewer)


def node_finalized(world: World, _: Any) -> list[Expect]:
    worker = agent_reports.worker_finalize(
        node=world.nodes["w2"], summary="exp_0003 measured θ0: 0.35.", experiments=["exp_0003"], actor="worker_0002"
    )
    return [Expect(LiveEvent.NODE_UPDATED, lambda: node_live(worker))]


def edge_added(world: World, _: Any) -> list[Expect]:
    edge = research.dag_edge_add(
        run=world.run, upstream=world.nodes["w2"], downstream=world.nodes["w3"], kind="context"
    )
    return [Expect(LiveEvent.EDGE_CREATED, lambda: edge_live(edge))]


def decision_recorded(world: World, _: Any) -> list[Expect]:
    decision = research.decision_record(
        run=world.run, kind="continue", trigger="worker_finalize", rationale="build on exp_0001",
        subject=world.nodes["w1"],
    )  # fmt: skip
    return [Expect(LiveEvent.DECISION_CREATED, lambda: decision_live(decision))]


def prediction_bound(world: World, _: Any) -> list[Expect]:
    prediction = research.prediction_bind(
        run=world.run, worker=world.nodes["w3"], text="audited data reaches 0.45", expected_value=0.45
    )
    return [Expect(LiveEvent.PREDICTION_CREATED, lambda: prediction_live(Prediction.objects.get(pk=prediction.pk)))]


def reconcile_prepare(world: World) -> Prediction:
    return research.prediction_bind(
        run=world.run, worker=world.nodes["w3"], text="audited data reaches 0.45", expected_value=0.45
    )


def prediction_reconciled(world: World, prediction: Prediction) -> list[Expect]:
    research.prediction_reconcile(prediction=prediction, verdict="refuted", observed_value=0.4, note="0.40 < 0.45")
    return [Expect(LiveEvent.PREDICTION_UPDATED, lambda: prediction_live(Prediction.objects.get(pk=prediction.pk)))]


def guidance_posted(world: World, _: Any) -> list[Expect]:
    guidance = research.guidance_post(run=world.run, author=world.people["operator"], text="Keep a DPO branch.")
    return [Expect(LiveEvent.GUIDANCE_CREATED, lambda: guidance_live_get(guidance))]


def guidance_read(world: World, _: Any) -> list[Expect]:
    read = research.guidance_mark_read(run=world.run)
    assert [g.pk for g in read] == [world.guidance["pending"].pk]
    return [Expect(LiveEvent.GUIDANCE_UPDATED, lambda: guidance_live_get(world.guidance["pending"]))]


def guidance_applied(world: World, _: Any) -> list[Expect]:
    pending = world.guidance["pending"]
    decision = research.decision_record(
        run=world.run, kind="branch", trigger="guidance", rationale="the operator wants DPO kept", guidance=[pending]
    )
    return [
        Expect(LiveEvent.DECISION_CREATED, lambda: decision_live(decision)),
        Expect(LiveEvent.GUIDANCE_UPDATED, lambda: guidance_live_get(pending)),
    ]


def review_prepare(world: World) -> ResearchNode:
    return research.reviewer_add(run=world.run, question="Is exp_0003's baseline sound?", scope=[world.nodes["w2"]])


def report_submitted(world: World, reviewer: ResearchNode) -> list[Expect]:
    report = review_submit(
        reviewer=reviewer, summary="exp_0003 is a sound θ0 baseline.", experiments=["exp_0003"], observations=[],
        findings={"supported_findings": ["θ0 scores 0.35"], "recommendations": ["continue"]},
    )  # fmt: skip
    return [Expect(LiveEvent.REPORT_CREATED, lambda: report_live(ReviewReport.objects.get(pk=report.pk)))]


def finalize_prepare(world: World) -> ResearchNode:
    reviewer = review_prepare(world)
    report_submitted(world, reviewer)
    return reviewer


def review_finalized(world: World, reviewer: ResearchNode) -> list[Expect]:
    review_finalize(reviewer=reviewer, summary="", actor=reviewer.handle)
    report = ReviewReport.objects.get(reviewer=reviewer)
    return [
        Expect(LiveEvent.NODE_UPDATED, lambda: node_live(reviewer)),
        Expect(LiveEvent.REPORT_UPDATED, lambda: report_live(ReviewReport.objects.get(pk=report.pk))),
    ]


def _eval_only(world: World) -> Experiment:
    return experiment_create(
        run=world.run, owner=world.nodes["w3"], kind="eval_only", input_checkpoint=world.run.base_checkpoint,
        action={"evaluate": "feedback"},
    )  # fmt: skip


def experiment_created(world: World, _: Any) -> list[Expect]:
    experiment = _eval_only(world)
    return [Expect(LiveEvent.EXPERIMENT_CREATED, lambda: experiment_live(experiment))]


def experiment_running_prepare(world: World) -> Job:
    return pipeline.experiment_start(experiment=_eval_only(world))


def experiment_running(world: World, job: Job) -> list[Expect]:
    claimed = job_claim(job_id=job.pk, worker="gpu@test")
    assert claimed is not None
    experiment = Experiment.objects.get(pk=job.experiment_id)
    assert experiment.status == "running"
    return [
        Expect(LiveEvent.EXPERIMENT_UPDATED, lambda: experiment_live(experiment)),
        Expect(LiveEvent.JOB_UPDATED, lambda: job_payload(Job.objects.select_related("experiment").get(pk=job.pk))),
    ]


def evaluated_prepare(world: World) -> Job:
    job = experiment_running_prepare(world)
    return job_claim(job_id=job.pk, worker="gpu@test")


def evaluated(world: World, job: Job) -> list[Expect]:
    experiment = Experiment.objects.get(pk=job.experiment_id)
    rows = [{"id": f"f{n}", "output": "82", "correct": n < 3} for n in range(5)]
    seal = {key: sha256_text(key) for key in ("evaluator_sha256", "settings_sha256", "data_sha256")}
    job_succeed_with_evaluation(
        job=job, checkpoint=experiment.input_checkpoint, benchmark=world.run.benchmark, split="feedback", rows=rows,
        backend="hf", seal=seal,
    )  # fmt: skip
    evaluation = Evaluation.objects.get(job=job)
    assert Experiment.objects.get(pk=experiment.pk).feedback_score == 0.6
    return [
        # The evaluation itself: the run page does not draw it, but any listener learns of it.
        Expect(LiveEvent.EVALUATION_CREATED, lambda: evaluation_live(evaluation)),
        Expect(LiveEvent.EXPERIMENT_UPDATED, lambda: experiment_live(experiment)),
        Expect(LiveEvent.JOB_UPDATED, lambda: job_payload(Job.objects.select_related("experiment").get(pk=job.pk))),
        # The job's accelerator seconds are charged to the run: the page's budget bar moves.
        Expect(LiveEvent.RUN_UPDATED, lambda: run_live_get(world.run), subset=True),
    ]


def integrity_changed(world: World, _: Any) -> list[Expect]:
    experiment = world.exp["e3"]
    experiment_set_integrity(experiment=experiment, status="flagged", actor="reviewer_0001", reason="check again")
    return [Expect(LiveEvent.EXPERIMENT_UPDATED, lambda: experiment_live(experiment))]


def finding_adjudicated(world: World, _: Any) -> list[Expect]:
    finding = world.findings[("exp_0003", "metric_attribution")]
    finding_adjudicate_for_person(
        finding=finding, adjudication="ALLOWED", user=world.people["admin"], rationale="the claim cites its evaluation"
    )
    experiment = world.exp["e3"]
    assert Experiment.objects.get(pk=experiment.pk).integrity_status == "accepted"
    return [Expect(LiveEvent.EXPERIMENT_UPDATED, lambda: experiment_live(experiment))]


def job_queued(world: World, _: Any) -> list[Expect]:
    job = job_enqueue(kind="train", spec={"recipe": "sft"}, experiment=world.exp["e4"])
    return [Expect(LiveEvent.JOB_UPDATED, lambda: job_payload(Job.objects.select_related("experiment").get(pk=job.pk)))]


def job_progressed(world: World, _: Any) -> list[Expect]:
    job = world.jobs["running"]
    job_report(job=job, progress=0.55, metrics_point={"step": 30, "loss": 1.3}, log_line="step 30: loss=1.3")
    payload = {"uuid": str(job.uuid), "progress": 0.55, "metrics_point": {"step": 30, "loss": 1.3},
               "log_line": "step 30: loss=1.3"}  # fmt: skip
    return [Expect(LiveEvent.JOB_PROGRESS, lambda: payload)]


CASES: dict[str, tuple[Callable[[World], Any] | None, Callable[[World, Any], list[Expect]]]] = {
    "run paused": (None, pause),
    "run resumed": (resume_prepare, resume),
    "run stopped": (None, stop),
    "run finished": (finish_prepare, finish),
    "LLM tokens charged to the run": (None, llm_tokens_charged),
    "worker created with its context edge": (None, worker_created),
    "reviewer created with its scope edges": (None, reviewer_created),
    "node finalized": (None, node_finalized),
    "edge added": (None, edge_added),
    "decision recorded": (None, decision_recorded),
    "prediction bound": (None, prediction_bound),
    "prediction reconciled": (reconcile_prepare, prediction_reconciled),
    "guidance posted": (None, guidance_posted),
    "guidance read by a planning step": (None, guidance_read),
    "guidance applied by a decision": (None, guidance_applied),
    "reviewer report submitted": (review_prepare, report_submitted),
    "reviewer finalized": (finalize_prepare, review_finalized),
    "experiment created": (None, experiment_created),
    "experiment running": (experiment_running_prepare, experiment_running),
    "experiment evaluated and scored": (evaluated_prepare, evaluated),
    "experiment integrity status": (None, integrity_changed),
    "finding adjudicated by a person": (None, finding_adjudicated),
    "job queued": (None, job_queued),
    "job progress": (None, job_progressed),
}


async def _events_for(communicator, wanted: set[str]) -> list[dict[str, Any]]:
    """Events until every wanted type has arrived (or ARRIVAL_SECONDS passed), then until quiet."""
    events: list[dict[str, Any]] = []
    waited = 0.0
    while not wanted <= {e["event"] for e in events} and waited < ARRIVAL_SECONDS:
        if await communicator.receive_nothing(timeout=0.1, interval=0.02):
            waited += 0.1
            continue
        message = await communicator.receive_json_from(timeout=5)
        assert message["type"] == "events", message
        events.extend(message["events"])
    return events + await lh.drain(communicator, quiet=SETTLE_SECONDS)


def _matches(event: dict[str, Any], expect: Expect, record: dict[str, Any]) -> bool:
    if event["event"] != expect.event:
        return False
    payload = event["payload"]
    if expect.subset:
        return all(key in record and record[key] == value for key, value in payload.items()) and all(
            payload.get(key) == value for key, value in record.items() if key in ("uuid", "source", "target")
        )
    return payload == record


@pytest.mark.parametrize("case", list(CASES))
async def test_the_service_publishes_its_event_with_the_selectors_payload(tworld, case):
    prepare, act = CASES[case]
    context = await database_sync_to_async(prepare)(tworld) if prepare else None
    communicator = await lh.open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    state = lh.run_state(await lh.receive_snapshot(communicator))

    def call() -> list[tuple[Expect, dict[str, Any]]]:
        # Each record is read right after the service returned: what the event must have carried.
        return [(expect, lh.as_json(expect.record())) for expect in act(tworld, context)]

    expected = await database_sync_to_async(call)()
    events = await _events_for(communicator, {expect.event for expect, _ in expected})

    arrived = [e["event"] for e in events]
    for expect, record in expected:
        assert any(_matches(event, expect, record) for event in events), (
            f"{case}: no {expect.event} event with the selector's payload {record}; arrived: {arrived} "
            f"{[e['payload'] for e in events if e['event'] == expect.event]}"
        )
    for event in events:
        assert event["event"] in set(LiveEvent), event
        lh.apply_run_event(state, event["event"], event["payload"])
    fresh = await database_sync_to_async(lambda: lh.as_json(run_snapshot(run=_fresh_run(tworld))))()
    assert state == lh.run_state(fresh), f"{case}: snapshot + events differs from a fresh snapshot"
    await communicator.disconnect()
