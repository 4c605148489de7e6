"""Lineage by recursive SQL: branching, merging, and checkpoints that do not reach θ0."""

from __future__ import annotations

import pytest

from apps.experiments import selectors, services
from apps.jobs.choices import JobKind
from apps.jobs.services import job_claim, job_enqueue, job_succeed
from apps.research import services as research_services
from apps.research.choices import NodeKind
from tests.factories import CheckpointFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def graph(run):
    """a -> b, a -> c (branch), b + c -> d (merge), d -> e; f stands alone."""
    worker = research_services.node_create(run=run, kind=NodeKind.WORKER, task="w")

    def exp(*parents):
        return services.experiment_create(
            run=run,
            owner=worker,
            kind="train_eval",
            input_checkpoint=run.base_checkpoint,
            action={"recipe": "sft"},
            parents=list(parents),
        )

    a = exp()
    b = exp(a)
    c = exp(a)
    d = exp(b, c)
    e = exp(d)
    f = exp()
    return dict(a=a, b=b, c=c, d=d, e=e, f=f)


def ids(pairs):
    return {pk: depth for pk, depth in pairs}


def test_ancestors_through_a_merge(graph):
    g = graph
    assert ids(selectors.experiment_ancestors(g["e"].pk)) == {g["d"].pk: 1, g["b"].pk: 2, g["c"].pk: 2, g["a"].pk: 3}
    assert selectors.experiment_ancestors(g["a"].pk) == []


def test_descendants_through_a_branch(graph):
    g = graph
    assert ids(selectors.experiment_descendants(g["a"].pk)) == {g["b"].pk: 1, g["c"].pk: 1, g["d"].pk: 2, g["e"].pk: 3}
    assert selectors.experiment_descendants(g["f"].pk) == []


def job():
    """A training job that ran to success through the job engine (enqueued, claimed, succeeded).

    The checkpoints below are factory rows naming it: the lineage selectors read the graph of
    parents and producing jobs, and several shapes here (foreign weights, an unrecorded step) are
    what the checks must catch, not what the pipeline registers.
    """
    queued = job_enqueue(kind=JobKind.TRAIN, spec={"recipe": "sft"})
    return job_succeed(job=job_claim(job_id=queued.pk, worker="gpu@host-a"), result={})


def test_checkpoint_lineage_reaches_theta0(run):
    base = run.base_checkpoint
    first = CheckpointFactory(parent=base, producing_job=job())
    second = CheckpointFactory(parent=first, producing_job=job())
    lineage = selectors.checkpoint_lineage(second, base=base)
    assert lineage.reaches_base
    assert lineage.path == [second.pk, first.pk, base.pk]
    assert {pk for pk, _ in selectors.checkpoint_descendants(base.pk)} == {first.pk, second.pk}


def test_foreign_weights_break_the_lineage(run):
    base = run.base_checkpoint
    foreign = CheckpointFactory(parent=None)  # dropped in from outside: no parent, no job
    child = CheckpointFactory(parent=foreign, producing_job=job())
    lineage = selectors.checkpoint_lineage(child, base=base)
    assert not lineage.reaches_base
    assert lineage.broken_at == foreign.pk


def test_unrecorded_step_breaks_the_lineage(run):
    base = run.base_checkpoint
    swapped = CheckpointFactory(parent=base)  # claims θ0 as parent but no job produced it
    lineage = selectors.checkpoint_lineage(swapped, base=base)
    assert (lineage.reaches_base, lineage.broken_at) == (False, swapped.pk)
    assert "recorded job" in lineage.reason


def test_other_base_is_not_theta0(run):
    other_base = CheckpointFactory(is_base=True)
    child = CheckpointFactory(parent=other_base, producing_job=job())
    lineage = selectors.checkpoint_lineage(child, base=run.base_checkpoint)
    assert (lineage.reaches_base, lineage.broken_at) == (False, other_base.pk)


def test_a_checkpoint_takes_the_profile_its_lineage_was_registered_with():
    profile = {"family": "qwen", "eos_token_ids": [151643, 151645], "stop_tokens": ["<|im_end|>"]}
    base = CheckpointFactory(is_base=True, model_profile=profile)
    child = CheckpointFactory(parent=base, producing_job=job())
    grandchild = CheckpointFactory(parent=child, producing_job=job(), model_profile={})
    assert selectors.checkpoint_registered_profile(grandchild) == profile
    assert selectors.checkpoint_registered_profile(base) == profile
    # A chain that reaches no base has no registered profile to take (never a guess).
    foreign = CheckpointFactory(parent=None)
    assert selectors.checkpoint_registered_profile(CheckpointFactory(parent=foreign, producing_job=job())) == {}
    # A base registered without one (the minibench's θ0): the tokenizer's EOS alone applies.
    bare = CheckpointFactory(is_base=True)
    assert selectors.checkpoint_registered_profile(CheckpointFactory(parent=bare, producing_job=job())) == {}
