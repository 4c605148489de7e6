"""The research DAG refuses bad graphs: cycles, self-loops, duplicate edges, foreign nodes."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from apps.core.errors import ApplicationError, Conflict
from apps.research import services
from apps.research.choices import EdgeKind, NodeKind
from apps.research.models import ResearchEdge, ResearchNode
from tests.factories import make_run

pytestmark = pytest.mark.django_db


def test_workers_get_handles_and_context_edges(run):
    first = services.node_create(run=run, kind=NodeKind.WORKER, task="baseline SFT")
    second = services.node_create(run=run, kind=NodeKind.WORKER, task="more data", upstream=[first])
    assert (first.handle, second.handle) == ("worker_0001", "worker_0002")
    edge = ResearchEdge.objects.get(downstream=second)
    assert (edge.upstream, edge.kind) == (first, EdgeKind.CONTEXT)


def test_cycle_is_refused(run):
    a = services.node_create(run=run, kind=NodeKind.WORKER, task="a")
    b = services.node_create(run=run, kind=NodeKind.WORKER, task="b", upstream=[a])
    c = services.node_create(run=run, kind=NodeKind.WORKER, task="c", upstream=[b])
    with pytest.raises(ApplicationError) as caught:
        services.dag_edge_add(run=run, upstream=c, downstream=a, kind=EdgeKind.CONTEXT)
    assert caught.value.code == "cycle"
    assert not ResearchEdge.objects.filter(upstream=c, downstream=a).exists()


def test_self_loop_is_refused_by_service_and_database(run):
    a = services.node_create(run=run, kind=NodeKind.WORKER, task="a")
    with pytest.raises(ApplicationError):
        services.dag_edge_add(run=run, upstream=a, downstream=a, kind=EdgeKind.CONTEXT)
    # Bypassing the service, the database's check constraint still refuses it.
    with pytest.raises(IntegrityError), transaction.atomic():
        ResearchEdge.objects.create(run=run, upstream=a, downstream=a, kind=EdgeKind.CONTEXT)


def test_duplicate_edge_is_refused_by_database(run):
    a = services.node_create(run=run, kind=NodeKind.WORKER, task="a")
    b = services.node_create(run=run, kind=NodeKind.WORKER, task="b", upstream=[a])
    with pytest.raises(IntegrityError), transaction.atomic():
        ResearchEdge.objects.create(run=run, upstream=a, downstream=b, kind=EdgeKind.CONTEXT)


def test_review_scope_edges_and_wrong_kinds(run):
    a = services.node_create(run=run, kind=NodeKind.WORKER, task="a")
    b = services.node_create(run=run, kind=NodeKind.WORKER, task="b")
    reviewer = services.node_create(run=run, kind=NodeKind.REVIEWER, task="compare a and b", upstream=[a, b])
    assert set(reviewer.upstream_edges.values_list("kind", flat=True)) == {EdgeKind.REVIEW_SCOPE}
    with pytest.raises(ApplicationError) as caught:
        services.dag_edge_add(run=run, upstream=reviewer, downstream=a, kind=EdgeKind.CONTEXT)
    assert caught.value.code == "invalid_edge"


def test_edges_never_cross_runs(run):
    other = make_run(name="other")
    a = services.node_create(run=run, kind=NodeKind.WORKER, task="a")
    b = services.node_create(run=other, kind=NodeKind.WORKER, task="b")
    with pytest.raises(ApplicationError) as caught:
        services.dag_edge_add(run=run, upstream=a, downstream=b, kind=EdgeKind.CONTEXT)
    assert caught.value.code == "foreign_node"


def test_one_main_agent_per_run(run):
    with pytest.raises(IntegrityError), transaction.atomic():
        ResearchNode.objects.create(run=run, kind=NodeKind.MAIN, handle="main2")


def test_a_run_without_reviewers_refuses_one_on_the_server(run):
    """The --no-reviewer ablation is enforced by the service, whatever the Main Agent's policy does."""
    worker = services.node_create(run=run, kind=NodeKind.WORKER, task="w")
    type(run).objects.filter(pk=run.pk).update(policy={**(run.policy or {}), "reviewers": False})
    with pytest.raises(Conflict, match="without Reviewers"):
        services.node_create(run=run, kind=NodeKind.REVIEWER, task="r", upstream=[worker])
    assert not run.nodes.filter(kind=NodeKind.REVIEWER).exists()
