"""A small research world for the ExpOS API tests, and HTTP helpers against a live server.

The world (one run, all on the real PostgreSQL):

    main ─┐
    worker_0001 "own"   ──context──> worker_0003 "successor"   (the successor sees own's experiments)
    worker_0002 "other"
    reviewer_0001 "rin"  scope = {own}      reviewer_0002 "rout" scope = {other}

own has exp_0001 (train+eval, succeeded: 11/30 on feedback, a final-split evaluation too), exp_0002
(eval-only, succeeded: 17/30) and exp_0004 (running, a running train job); other has exp_0003.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
import uvicorn
from django.contrib.auth.models import Group, User
from django.test import Client

from apps.experiments.models import Evaluation, EvaluationSample
from apps.experiments.services import experiment_create
from apps.expos.auth import agent_token_issue
from apps.integrity.models import BlockedAttempt
from apps.jobs.models import Job, JobLogLine
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Candidate, Guidance, Prediction, ResearchNode, Run
from apps.research.services import node_create, run_set_status
from apps.reviews.models import ReviewReport
from tests.factories import BenchmarkFactory, CheckpointFactory, make_run
from tests.support.mcp_client import TRANSPORTS
from tests.workers.agents.stack import free_port

FEEDBACK_IDS = [f"s{i:04d}" for i in range(1, 31)]
FINAL_IDS = [f"x{i:04d}" for i in range(1, 11)]
PRINCIPALS = ("main", "own", "other", "rin", "rout", "viewer", "anon")


@dataclass
class World:
    run: Run
    nodes: dict[str, ResearchNode]
    tokens: dict[str, str]
    exp: dict[str, Any]
    evals: dict[str, Evaluation]
    jobs: dict[str, Job]
    prediction: Prediction
    guidance: Guidance
    report: ReviewReport
    viewer: User
    extra: dict[str, Any] = field(default_factory=dict)


def _evaluation(
    run: Run, experiment: Any, split: str, ids: list[str], correct: int, job: Job | None = None
) -> Evaluation:
    evaluation = Evaluation.objects.create(
        run=run,
        experiment=experiment,
        checkpoint=experiment.output_checkpoint or experiment.input_checkpoint,
        benchmark=run.benchmark,
        job=job,
        split=split,
        score=correct / len(ids),
        correct=correct,
        sample_count=len(ids),
        evaluator_sha256="e" * 64,
        settings_sha256="s" * 64,
        data_sha256="d" * 64,
    )
    EvaluationSample.objects.bulk_create(
        EvaluationSample(evaluation=evaluation, sample_id=sid, output=f"model output {sid}", correct=i < correct)
        for i, sid in enumerate(ids)
    )
    return evaluation


def build_world() -> World:
    benchmark = BenchmarkFactory(sample_ids={"feedback": FEEDBACK_IDS, "final": FINAL_IDS})
    run = make_run(benchmark=benchmark, max_parallel_workers=5)
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
    main = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
    own = node_create(run=run, kind=NodeKind.WORKER, task="own branch")
    other = node_create(run=run, kind=NodeKind.WORKER, task="other branch")
    successor = node_create(run=run, kind=NodeKind.WORKER, task="continues own", upstream=[own])
    rin = node_create(run=run, kind=NodeKind.REVIEWER, task="is own sound?", upstream=[own])
    rout = node_create(run=run, kind=NodeKind.REVIEWER, task="is other sound?", upstream=[other])
    nodes = {"main": main, "own": own, "other": other, "successor": successor, "rin": rin, "rout": rout}

    base = run.base_checkpoint
    exp1 = experiment_create(
        run=run,
        owner=own,
        kind="train_eval",
        input_checkpoint=base,
        action={"data": ["data_0001"], "hyperparameters": {"lr": 1e-4}},
    )
    train = Job.objects.create(
        run=run,
        experiment=exp1,
        kind="train",
        queue="gpu",
        status="succeeded",
        metrics={"points": [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.0}], "last": {"loss": 2.0}},
    )
    JobLogLine.objects.create(job=train, seq=1, text="step 1 loss 2.5")
    ckpt = CheckpointFactory(parent=base, producing_job=train, run=run)
    exp1.output_checkpoint = ckpt
    exp1.status = "succeeded"
    exp1.feedback_score = 11 / 30
    exp1.save(update_fields=["output_checkpoint", "status", "feedback_score"])
    evaluate = Job.objects.create(run=run, experiment=exp1, kind="evaluate", queue="gpu", status="succeeded")
    JobLogLine.objects.create(job=evaluate, seq=1, text="sample s0001 prompt: 2+2=? output: 4")
    e1 = _evaluation(run, exp1, "feedback", FEEDBACK_IDS, 11, job=evaluate)
    final = _evaluation(run, exp1, "final", FINAL_IDS, 4)

    exp2 = experiment_create(
        run=run, owner=own, kind="eval_only", input_checkpoint=ckpt, action={"evaluate": "feedback"}, parents=[exp1]
    )
    exp2.status = "succeeded"
    exp2.feedback_score = 17 / 30
    exp2.save(update_fields=["status", "feedback_score"])
    e2 = _evaluation(run, exp2, "feedback", FEEDBACK_IDS, 17)

    exp3 = experiment_create(
        run=run, owner=other, kind="eval_only", input_checkpoint=base, action={"evaluate": "feedback"}
    )
    exp3.status = "succeeded"
    exp3.feedback_score = 0.5
    exp3.save(update_fields=["status", "feedback_score"])
    e3 = _evaluation(run, exp3, "feedback", FEEDBACK_IDS, 15)
    other_job = Job.objects.create(run=run, experiment=exp3, kind="evaluate", queue="gpu", status="succeeded")

    exp4 = experiment_create(
        run=run, owner=own, kind="train_eval", input_checkpoint=ckpt, action={"data": ["data_0002"]}, status="running"
    )
    running = Job.objects.create(run=run, experiment=exp4, kind="train", queue="gpu", status="running")

    viewer = User.objects.create_user("vera", password="pw-vera-123")
    # The data migration creates the groups; a flushed (transactional) test database may have lost them.
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    guidance = Guidance.objects.create(run=run, author=viewer, text="try a smaller learning rate")
    prediction = Prediction.objects.create(run=run, text="own beats θ0 by 5 points", expected_value=0.05)
    Candidate.objects.create(run=run, proposer=own, title="curriculum by length")
    report = ReviewReport.objects.create(
        run=run,
        reviewer=rin,
        summary="exp_0001 fails on s0003 and s0007",
        supported_findings=["s0003 is wrong"],
        observations=[
            {
                "experiment": "exp_0001",
                "subcategory": "test_set_access",
                "observation": "NOT_FOUND_FULL",
                "note": "checked s0003",
                "evidence": {"sample_ids": ["s0003"], "spans": ["2+2"]},
            }
        ],
    )
    report.experiments.set([exp1])

    tokens = {}
    for name, node in nodes.items():
        tokens[name] = agent_token_issue(run=run, node=node, role=node.kind)[0]
    return World(
        run=run,
        nodes=nodes,
        tokens=tokens,
        exp={"own1": exp1, "own2": exp2, "other": exp3, "own_running": exp4},
        evals={"own1": e1, "own2": e2, "own_final": final, "other": e3},
        jobs={"own_train": train, "own_eval": evaluate, "own_running": running, "other_eval": other_job},
        prediction=prediction,
        guidance=guidance,
        report=report,
        viewer=viewer,
    )


class Api:
    """requests against the live server as one principal of the world."""

    def __init__(self, base_url: str, world: World) -> None:
        self.base = base_url.rstrip("/")
        self.world = world
        self._viewer_cookie: str | None = None

    def _headers(self, who: str, extra: dict[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
        headers = dict(extra or {})
        cookies: dict[str, str] = {}
        if who in self.world.tokens:
            headers["Authorization"] = f"Bearer {self.world.tokens[who]}"
        elif who == "viewer":
            if self._viewer_cookie is None:
                client = Client()
                client.force_login(self.world.viewer)
                self._viewer_cookie = client.cookies["sessionid"].value
            cookies["sessionid"] = self._viewer_cookie
        return headers, cookies

    def call(self, who: str, tool: str, body: Any = None, headers: dict[str, str] | None = None) -> requests.Response:
        all_headers, cookies = self._headers(who, headers)
        return requests.post(
            f"{self.base}/api/v1/tools/{tool}",
            json={} if body is None else body,
            headers=all_headers,
            cookies=cookies,
            timeout=60,
        )

    def get(self, who: str, path: str, **params: Any) -> requests.Response:
        headers, cookies = self._headers(who)
        return requests.get(f"{self.base}{path}", params=params, headers=headers, cookies=cookies, timeout=60)


@pytest.fixture
def world(transactional_db) -> World:
    return build_world()


@pytest.fixture
def api(live_server, world) -> Api:
    return Api(live_server.url, world)


def blocked_attempts(world: World) -> int:
    return BlockedAttempt.objects.filter(run=world.run).count()


@pytest.fixture
def asgi_url(world) -> Iterator[str]:
    """rsiweb.asgi.application (the MCP mount and Django) under uvicorn, in a thread of this process."""
    from rsiweb.asgi import application  # noqa: PLC0415 - builds the web app: only for the tests that serve it

    port = free_port()
    config = uvicorn.Config(application, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(params=TRANSPORTS)
def served(request, api) -> tuple[str, str]:
    """(transport, base URL): stdio against the live server, HTTP against the ASGI app."""
    if request.param == "stdio":
        return "stdio", api.base
    return "http", request.getfixturevalue("asgi_url")
