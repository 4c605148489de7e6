"""The experiment list builds its rows from .values(); they must be exactly ExperimentSerializer's."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from apps.experiments.models import Experiment
from apps.experiments.services import experiment_create
from apps.expos.api.serializers import ExperimentSerializer
from apps.expos.api.views import BoundedLimitOffsetPagination, ExperimentViewSet
from apps.expos.models import AgentToken
from apps.expos.registry import ToolContext
from apps.expos.visibility import HumanCaller
from tests.apps.expos.conftest import build_world

WHO = ("main", "own", "successor", "other", "rin", "rout", "viewer")


@pytest.fixture
def world(db):
    world = build_world()
    own = world.nodes["own"]
    # A merge (two parents, created out of handle order), a score that agents see rounded, a claim.
    merge = experiment_create(
        run=world.run,
        owner=own,
        kind="eval_only",
        input_checkpoint=world.run.base_checkpoint,
        action={"evaluate": "feedback", "note": "ü", "weights": [0.5, None]},
        parents=[world.exp["own2"], world.exp["own1"]],
        claim="merging helps",
    )
    merge.feedback_score = 2 / 3
    merge.save(update_fields=["feedback_score"])
    return world


def _client(world, who: str) -> tuple[Client, dict[str, str]]:
    client = Client()
    if who == "viewer":
        client.force_login(world.viewer)
        return client, {}
    return client, {"HTTP_AUTHORIZATION": f"Bearer {world.tokens[who]}"}


def _serialized(world, who: str) -> bytes:
    """What ExperimentSerializer makes of the same scoped experiments, rendered as the API renders."""
    if who == "viewer":
        caller = HumanCaller(user=world.viewer)
    else:
        token = AgentToken.objects.get(node=world.nodes[who])
        caller = ToolContext(run=token.run, node=token.node, role=token.role, token=token)
    experiments = ExperimentViewSet().scoped(caller)
    return JSONRenderer().render(ExperimentSerializer(experiments, many=True, context={"caller": caller}).data)


@pytest.mark.parametrize("who", WHO)
def test_list_rows_are_the_serializers(world, who):
    client, headers = _client(world, who)
    response = client.get("/api/v1/experiments/", {"limit": 1000}, **headers)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == len(body["results"]) > 0
    rendered = JSONRenderer().render(body["results"])
    assert rendered == _serialized(world, who)
    merge = next((r for r in body["results"] if r["claim"] == "merging helps"), None)
    if merge is not None:
        assert merge["parents"] == ["exp_0001", "exp_0002"]
        assert merge["feedback_score"] == (0.67 if who != "viewer" else 2 / 3)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])
def test_times_are_written_as_the_serializer_writes_them(world, zone):
    # PostgreSQL formats them in UTC (whole seconds without a fraction, a fraction with its leading
    # zeros); in another time zone the serializer's own field does, with its offset.
    times = [
        datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 0, 1, 12_345, tzinfo=UTC),
        datetime(2026, 7, 1, 23, 59, 59, 999_999, tzinfo=UTC),
    ]
    for experiment, when in zip(Experiment.objects.order_by("pk"), times, strict=False):
        Experiment.objects.filter(pk=experiment.pk).update(created_at=when)
    client, headers = _client(world, "viewer")
    with timezone.override(zone):
        body = client.get("/api/v1/experiments/", {"limit": 1000}, **headers).json()
        assert JSONRenderer().render(body["results"]) == _serialized(world, "viewer")
    written = {r["created_at"] for r in body["results"]}
    if zone == "UTC":
        assert {"2026-03-01T12:00:00Z", "2026-03-01T12:00:01.012345Z", "2026-07-01T23:59:59.999999Z"} <= written
    else:
        assert {"2026-03-01T13:00:00+01:00", "2026-07-02T01:59:59.999999+02:00"} <= written


def test_list_filters_and_pages_like_before(world):
    client, headers = _client(world, "viewer")
    everything = client.get("/api/v1/experiments/", {"limit": 1000}, **headers).json()["results"]
    page = client.get("/api/v1/experiments/", {"limit": 2, "offset": 1}, **headers).json()
    assert page["count"] == len(everything)
    assert page["results"] == everything[1:3]
    owned = client.get("/api/v1/experiments/", {"owner": "worker_0001"}, **headers).json()["results"]
    assert [r["handle"] for r in owned] == [r["handle"] for r in everything if r["owner"] == "worker_0001"]
    one = client.get(f"/api/v1/experiments/{everything[0]['uuid']}/", **headers).json()
    assert json.dumps(one) == json.dumps(everything[0])


def test_page_ceiling_is_1000():
    assert BoundedLimitOffsetPagination.max_limit == 1000
