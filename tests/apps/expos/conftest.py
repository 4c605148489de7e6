"""A small research world for the ExpOS API tests, and HTTP helpers against a live server.

The world (one run, all on the real PostgreSQL):

    main ─┐
    worker_0001 "own"   ──context──> worker_0003 "successor"   (the successor sees own's experiments)
    worker_0002 "other"
    reviewer_0001 "rin"  scope = {own}      reviewer_0002 "rout" scope = {other}

own has exp_0001 (train+eval, succeeded: 11/30 on feedback; its θ_out has a final-split evaluation
too), exp_0002 (eval-only, succeeded: 17/30) and exp_0004 (running, a running train job); other has
exp_0003 (eval-only, succeeded: 15/30).
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

from apps.experiments.models import Evaluation, Experiment
from apps.experiments.services import experiment_create
from apps.expos.auth import agent_token_issue
from apps.flows.pipeline import experiment_start
from apps.integrity.models import BlockedAttempt
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_report
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Guidance, Prediction, ResearchNode, Run
from apps.research.services import candidate_propose, guidance_post, node_create, run_set_status
from apps.reviews.models import ReviewReport
from apps.reviews.services import review_submit
from tests.factories import (
    BenchmarkFactory,
    data_uploaded,
    evaluation_made,
    job_evaluated,
    make_run,
    training_succeed,
)
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


def _rows(ids: list[str], correct: int) -> list[dict[str, Any]]:
    return [{"id": sid, "output": f"model output {sid}", "correct": i < correct} for i, sid in enumerate(ids)]


def build_world() -> World:
    """The world through the services (tests.factories' factories over them): experiments start
    through the pipeline, their jobs are claimed, report and end through the job engine, which
    moves the experiments on; guidance, the candidate and the review report through theirs."""
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
    data = data_uploaded(node=own, name="arithmetic drills")
    exp1 = experiment_create(
        run=run,
        owner=own,
        kind="train_eval",
        input_checkpoint=base,
        action={"data": [data.handle], "hyperparameters": {"learning_rate": 1e-4}},
    )
    train = job_claim(job_id=experiment_start(experiment=exp1).pk, worker="gpu@host-a")
    job_report(job=train, metrics_point={"step": 1, "loss": 2.5}, log_line="step 1 loss 2.5")
    job_report(job=train, metrics_point={"step": 2, "loss": 2.0})
    ckpt = training_succeed(train, weights="b" * 64)
    exp1.refresh_from_db()
    evaluate = Job.objects.get(experiment=exp1, kind=JobKind.EVALUATE)
    e1 = job_evaluated(
        evaluate, checkpoint=ckpt, split="feedback", rows=_rows(FEEDBACK_IDS, 11),
        log_lines=["sample s0001 prompt: 2+2=? output: 4"],
    )  # fmt: skip
    # θ_out on the final split, as a run-level evaluation job (the final evaluation's jobs are the
    # run's, not an experiment's): the sealing tests need one while the run is still open.
    final = evaluation_made(run, checkpoint=ckpt, split="final", rows=_rows(FINAL_IDS, 4))

    exp2 = experiment_create(
        run=run, owner=own, kind="eval_only", input_checkpoint=ckpt, action={"evaluate": "feedback"}, parents=[exp1]
    )
    e2 = job_evaluated(
        experiment_start(experiment=exp2), checkpoint=ckpt, split="feedback", rows=_rows(FEEDBACK_IDS, 17)
    )

    exp3 = experiment_create(
        run=run, owner=other, kind="eval_only", input_checkpoint=base, action={"evaluate": "feedback"}
    )
    other_job = experiment_start(experiment=exp3)
    e3 = job_evaluated(other_job, checkpoint=base, split="feedback", rows=_rows(FEEDBACK_IDS, 15), worker="gpu@host-b")

    exp4 = experiment_create(
        run=run, owner=own, kind="train_eval", input_checkpoint=ckpt, action={"data": [data.handle]}
    )
    running = job_claim(job_id=experiment_start(experiment=exp4).pk, worker="gpu@host-a")

    viewer = User.objects.create_user("vera", password="pw-vera-123")
    # The data migration creates the groups; a flushed (transactional) test database may have lost them.
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    guidance = guidance_post(run=run, author=viewer, text="try a smaller learning rate")
    # Not bound to a Worker: the tools bind an existing prediction, but no service makes an unbound
    # one (prediction_bind makes a new prediction bound), so this row is written directly.
    prediction = Prediction.objects.create(run=run, text="own beats θ0 by 5 points", expected_value=0.05)
    candidate_propose(run=run, proposer=own, title="curriculum by length")
    report = review_submit(
        reviewer=rin,
        summary="exp_0001 fails on s0003 and s0007",
        experiments=[exp1.handle],
        observations=[
            {
                "experiment": "exp_0001",
                "subcategory": "test_set_access",
                "observation": "NOT_FOUND_FULL",
                "note": "checked s0003",
                "evidence": {"sample_ids": ["s0003"], "spans": ["2+2"]},
            }
        ],
        findings={"supported_findings": ["s0003 is wrong"]},
    )

    tokens = {}
    for name, node in nodes.items():
        tokens[name] = agent_token_issue(run=run, node=node, role=node.kind)[0]
    return World(
        run=Run.objects.get(pk=run.pk),
        nodes=nodes,
        tokens=tokens,
        exp={
            k: Experiment.objects.get(pk=e.pk)
            for k, e in {"own1": exp1, "own2": exp2, "other": exp3, "own_running": exp4}.items()
        },  # fmt: skip
        evals={"own1": e1, "own2": e2, "own_final": final, "other": e3},
        jobs={
            k: Job.objects.get(pk=j.pk)
            for k, j in {
                "own_train": train,
                "own_eval": evaluate,
                "own_running": running,
                "other_eval": other_job,
            }.items()
        },  # fmt: skip
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
