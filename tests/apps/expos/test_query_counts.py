"""List endpoints run a fixed number of queries however many rows they return (no N+1)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.experiments.services import experiment_create
from apps.flows.pipeline import experiment_start
from apps.research.choices import NodeKind
from apps.research.services import node_create
from apps.reviews.services import review_submit
from tests.apps.expos.conftest import build_world
from tests.factories import job_evaluated, scored_rows

ENDPOINTS = ["runs", "nodes", "experiments", "checkpoints", "datapool", "evaluations", "reports", "events"]
# Upper bounds, so a regression that adds a query per page (not per row) is caught too.
MAX_QUERIES = {"agent": 9, "human": 9}


@pytest.fixture
def small_world(db):
    return build_world()


def _grow(world, n: int) -> None:
    """n more experiments (each continuing the last), evaluations, reviewer reports and nodes."""
    own, rin = world.nodes["own"], world.nodes["rin"]
    previous = world.exp["own2"]
    for i in range(n):
        experiment = experiment_create(
            run=world.run,
            owner=own,
            kind="eval_only",
            input_checkpoint=previous.input_checkpoint,
            action={"evaluate": i},
            parents=[previous],
        )
        job_evaluated(experiment_start(experiment=experiment), checkpoint=experiment.input_checkpoint,
                      split="feedback", rows=scored_rows(["s0001", "s0002"], 1))  # fmt: skip
        review_submit(reviewer=rin, summary=f"r{i}", experiments=[experiment.handle, previous.handle], observations=[],
                      findings={})  # fmt: skip
        node_create(run=world.run, kind=NodeKind.WORKER, task=f"w{i}", upstream=[own])
        previous = experiment


def _count(client: Client, path: str, **headers: str) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, {"limit": 500}, **headers)
    assert response.status_code == 200, response.content
    return len(captured), len(response.json()["results"])


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_list_queries_do_not_grow_with_rows(small_world, endpoint):
    agent = {"HTTP_AUTHORIZATION": f"Bearer {small_world.tokens['main']}"}
    person = Client()
    person.force_login(small_world.viewer)
    path = f"/api/v1/{endpoint}/"
    Client().get(path, **agent)  # warm-up: the token's last_used_at is written once a minute, not per call
    before = {"agent": _count(Client(), path, **agent), "human": _count(person, path)}
    _grow(small_world, 6)
    Client().get(path, **agent)  # again: growing through the services may take past the minute on a busy machine
    after = {"agent": _count(Client(), path, **agent), "human": _count(person, path)}
    for who in ("agent", "human"):
        (queries_before, rows_before), (queries_after, rows_after) = before[who], after[who]
        if endpoint in ("experiments", "evaluations", "reports", "nodes", "events"):
            assert rows_after > rows_before, (who, endpoint)
        assert queries_after == queries_before, (who, endpoint, queries_before, queries_after)
        assert queries_after <= MAX_QUERIES[who], (who, endpoint, queries_after)
