"""Feedback-evaluation quotas (issue 13, point 5): per Worker lineage, per input checkpoint, per run.

Submissions go through the real submission service (``submission_create``: the review, the locks,
the experiment and its job); a refusal is recorded after the rollback as the REST layer does. The
quotas a Worker sees come from the real ``public_check_quota`` handler.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from apps.experiments.models import Checkpoint, Experiment
from apps.expos.registry import Role, ToolContext, load_all
from apps.flows.submissions import submission_create
from apps.integrity.choices import Subcategory
from apps.integrity.models import BlockedAttempt
from apps.integrity.submission_parts import SubmissionSubjects
from apps.integrity.submission_refusals import SubmissionRefused
from apps.integrity.submission_review import submission_parse
from apps.research.choices import NodeKind
from apps.research.models import ResearchNode, Run, default_policy
from apps.research.services import node_create
from tests.apps.integrity.conftest import World, build_world


def submit(world: World, worker: ResearchNode, *, checkpoint: Checkpoint | None = None, claim: str = "") -> Experiment:
    spec: dict[str, Any] = {"kind": "eval_only", "claim": claim}
    if checkpoint is not None:
        spec["input_checkpoint"] = checkpoint.handle
    subjects = SubmissionSubjects(
        input_checkpoint=checkpoint or world.theta0, checkpoint_visible=True, parents=[], datasets={}
    )
    return submission_create(worker=worker, request=submission_parse(spec), subjects=subjects).experiment


def refused(world: World, worker: ResearchNode, **kwargs: Any) -> SubmissionRefused:
    before = Experiment.objects.count()
    with pytest.raises(SubmissionRefused) as excinfo:
        submit(world, worker, **kwargs)
    assert Experiment.objects.count() == before  # nothing was created
    excinfo.value.record()
    return excinfo.value


def spent_keys(exc: SubmissionRefused) -> list[str]:
    (refusal,) = exc.refusals
    assert refusal.code == "feedback_allowance_spent"
    assert refusal.subcategory == Subcategory.TEST_SET_ACCESS
    assert exc.status_code == 403
    return refusal.evidence["spent"]


def quota_seen(world: World, worker: ResearchNode, **args: Any) -> dict[str, Any]:
    ctx = ToolContext(run=Run.objects.get(pk=world.run.pk), node=worker, role=Role.WORKER)
    return load_all()["public_check_quota"].handler(ctx, args)["feedback_evals"]


def successor(world: World, *predecessors: ResearchNode) -> ResearchNode:
    return node_create(run=world.run, kind=NodeKind.WORKER, task="continue", upstream=list(predecessors))


def test_the_defaults_are_documented_policy_keys():
    policy = default_policy()
    assert policy["feedback_evals_per_worker"] == 20
    assert policy["feedback_evals_per_checkpoint"] == 40
    assert policy["feedback_evals_per_run"] == 200
    # The tighter scopes never exceed the wider ones by default.
    assert policy["feedback_evals_per_worker"] <= policy["feedback_evals_per_checkpoint"]
    assert policy["feedback_evals_per_checkpoint"] <= policy["feedback_evals_per_run"]


@pytest.mark.parametrize(
    "shape",
    ["chain", "chain_of_three", "diamond", "successor_first"],
)
def test_a_successor_shares_its_lineages_spend(world, shape):
    """After a lineage spent its allowance, no successor gets a fresh one (the issue's attack)."""
    world.set_policy(feedback_evals_per_worker=3, feedback_evals_per_checkpoint=100, feedback_evals_per_run=100)
    first = world.worker
    if shape == "successor_first":
        # A successor spends while its predecessor is still active: the predecessor shares it too.
        submit(world, first)
        second = successor(world, first)
        submit(world, second)
        submit(world, second)
        last = first
    else:
        for _ in range(3):
            submit(world, first)
        if shape == "chain":
            last = successor(world, first)
        elif shape == "chain_of_three":
            last = successor(world, successor(world, first))
        else:  # two predecessors, one of them unrelated to the spend
            last = successor(world, first, world.new_worker("a parallel line"))
    exc = refused(world, last)

    assert spent_keys(exc) == ["feedback_evals_per_worker"]
    assert "feedback_evals_per_worker" in exc.message
    assert "worker quota" in exc.message
    assert last.handle in exc.message
    attempt = BlockedAttempt.objects.get(node=last)
    assert attempt.subcategory == Subcategory.TEST_SET_ACCESS
    assert attempt.reason.startswith("feedback_allowance_spent:")
    assert attempt.request["evidence"]["spent"] == ["feedback_evals_per_worker"]
    seen = quota_seen(world, last)
    assert (seen["left"], seen["used"], seen["binding"]) == (0, 3, "feedback_evals_per_worker")
    # A Worker outside the lineage still has its own allowance.
    fresh = world.new_worker("unrelated")
    assert quota_seen(world, fresh)["left"] == 3
    assert submit(world, fresh).owner == fresh


def test_siblings_share_their_common_predecessors_spend_not_each_others(world):
    world.set_policy(feedback_evals_per_worker=3, feedback_evals_per_checkpoint=100, feedback_evals_per_run=100)
    root = world.worker
    submit(world, root)
    left, right = successor(world, root), successor(world, root)
    submit(world, left)
    submit(world, left)
    assert quota_seen(world, left)["left"] == 0
    assert quota_seen(world, right)["left"] == 2  # root's one counts, left's two do not
    submit(world, right)
    submit(world, right)
    assert spent_keys(refused(world, right)) == ["feedback_evals_per_worker"]
    # root's lineage now holds both branches: it is spent as well.
    assert spent_keys(refused(world, root)) == ["feedback_evals_per_worker"]


def test_the_checkpoint_quota_counts_every_worker_on_that_checkpoint(world):
    world.set_policy(feedback_evals_per_worker=10, feedback_evals_per_checkpoint=3, feedback_evals_per_run=100)
    workers = [world.worker, world.new_worker("b"), world.new_worker("c")]
    for worker in workers:
        submit(world, worker)
    late = world.new_worker("late")
    assert quota_seen(world, late)["binding"] == "feedback_evals_per_checkpoint"
    exc = refused(world, late)

    assert spent_keys(exc) == ["feedback_evals_per_checkpoint"]
    assert "checkpoint quota" in exc.message
    assert world.theta0.handle in exc.message
    # Another checkpoint has its own quota: the late Worker may still evaluate there. (The training
    # that makes it is set up past the review, so θ0 has 4 submissions from here on.)
    trained = world.train([world.data["clean"]], worker=late)
    other = trained.output_checkpoint
    seen = quota_seen(world, late, checkpoint=other.handle)
    checkpoint_quota = next(q for q in seen["quotas"] if q["scope"] == "checkpoint")
    assert (checkpoint_quota["subject"], checkpoint_quota["used"], checkpoint_quota["left"]) == (other.handle, 0, 3)
    assert submit(world, late, checkpoint=other).input_checkpoint == other
    # θ0 stays spent for everyone.
    assert spent_keys(refused(world, world.new_worker("later"))) == ["feedback_evals_per_checkpoint"]


def test_the_run_quota_counts_every_submission_of_the_run(world):
    world.set_policy(feedback_evals_per_worker=10, feedback_evals_per_checkpoint=10, feedback_evals_per_run=4)
    a, b = world.worker, world.new_worker("b")
    trained = world.train([world.data["clean"]], worker=a)  # a submission too: it evaluates on feedback
    submit(world, a)
    submit(world, b)
    submit(world, b, checkpoint=trained.output_checkpoint)
    for worker, checkpoint in ((a, None), (b, trained.output_checkpoint), (world.new_worker("c"), None)):
        exc = refused(world, worker, checkpoint=checkpoint)
        assert spent_keys(exc) == ["feedback_evals_per_run"]
        assert "run quota" in exc.message
    assert BlockedAttempt.objects.filter(reason__startswith="feedback_allowance_spent").count() == 3


def test_several_spent_quotas_are_all_named(world):
    world.set_policy(feedback_evals_per_worker=2, feedback_evals_per_checkpoint=2, feedback_evals_per_run=2)
    submit(world, world.worker)
    submit(world, world.worker)
    exc = refused(world, world.worker)
    assert spent_keys(exc) == ["feedback_evals_per_worker", "feedback_evals_per_checkpoint", "feedback_evals_per_run"]
    for scope in ("worker", "checkpoint", "run"):
        assert f"{scope} quota" in exc.message


def test_the_allowance_shown_is_the_tightest_remaining_quota(world):
    world.set_policy(feedback_evals_per_worker=5, feedback_evals_per_checkpoint=6, feedback_evals_per_run=8)
    a, b = world.worker, world.new_worker("b")

    def seen(**args: Any) -> tuple[int, int, int, str]:
        shown = quota_seen(world, a, **args)
        # The figures shown are those of the quota with the fewest evaluations left.
        assert shown["left"] == min(q["left"] for q in shown["quotas"])
        return shown["allowance"], shown["used"], shown["left"], shown["binding"]

    assert seen() == (5, 0, 5, "feedback_evals_per_worker")
    for _ in range(3):
        submit(world, b)
    # a: worker 5 left, θ0 3 left, run 5 left -> θ0's checkpoint quota binds.
    assert seen() == (6, 3, 3, "feedback_evals_per_checkpoint")
    assert {q["scope"]: q["left"] for q in quota_seen(world, a)["quotas"]} == {"worker": 5, "checkpoint": 3, "run": 5}
    trained = world.train([world.data["clean"]], worker=a).output_checkpoint  # on θ0: 4 of 6, run 4 of 8
    assert seen() == (6, 4, 2, "feedback_evals_per_checkpoint")
    # On a's trained checkpoint (no submission there yet): worker 4 left, run 4 left (a tie: the
    # narrower scope is shown).
    assert seen(checkpoint=trained.handle) == (5, 1, 4, "feedback_evals_per_worker")
    submit(world, b, checkpoint=trained)
    submit(world, b, checkpoint=trained)
    assert seen(checkpoint=trained.handle) == (8, 6, 2, "feedback_evals_per_run")
    # Ties go to the narrower scope (θ0: 2 left, run: 2 left).
    assert seen() == (6, 4, 2, "feedback_evals_per_checkpoint")
    # A Main Agent has no feedback allowance of its own.
    ctx = ToolContext(run=Run.objects.get(pk=world.run.pk), node=world.main, role=Role.MAIN)
    assert load_all()["public_check_quota"].handler(ctx, {})["feedback_evals"] is None


def test_a_checkpoint_the_worker_cannot_see_is_unknown_to_the_quota_tool(world):
    other = world.new_worker("other")
    theirs = world.train([world.data["clean"]], worker=other).output_checkpoint
    ctx = ToolContext(run=Run.objects.get(pk=world.run.pk), node=world.worker, role=Role.WORKER)
    with pytest.raises(Exception) as excinfo:  # noqa: PT011 - the code is asserted below
        load_all()["public_check_quota"].handler(ctx, {"checkpoint": theirs.handle})
    assert getattr(excinfo.value, "code", None) == "unknown_checkpoint"


def test_a_policy_without_the_new_keys_gets_their_defaults(world):
    run = Run.objects.get(pk=world.run.pk)
    run.policy = {
        k: v for k, v in run.policy.items() if k not in ("feedback_evals_per_checkpoint", "feedback_evals_per_run")
    }
    run.save(update_fields=["policy", "updated_at"])
    seen = quota_seen(world, world.worker)
    assert {q["key"]: q["allowance"] for q in seen["quotas"]} == {
        "feedback_evals_per_worker": 20,
        "feedback_evals_per_checkpoint": 40,
        "feedback_evals_per_run": 200,
    }


@pytest.fixture
def live_world(transactional_db, roots, theta0_template) -> World:
    return build_world(roots, theta0_template)


@pytest.mark.parametrize("quota", ["feedback_evals_per_run", "feedback_evals_per_checkpoint"])
def test_two_concurrent_submissions_cannot_both_take_the_last_evaluation(live_world, quota):
    """Two Workers (two node locks) race for the last evaluation of a quota that spans them.

    The first submission holds its transaction open after creating its experiment; the second,
    started meanwhile, must wait for the run lock and then see the first one's spend."""
    world = live_world
    world.set_policy(
        **{"feedback_evals_per_worker": 10, "feedback_evals_per_checkpoint": 10, "feedback_evals_per_run": 10}
    )
    world.set_policy(**{quota: 2})
    submit(world, world.worker)
    a, b = world.new_worker("a"), world.new_worker("b")
    created, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                outcome["a"] = submit(world, a).handle
                created.set()
                release.wait(30)
        except Exception as exc:  # noqa: BLE001 - reported to the test below
            outcome["a"] = exc
            created.set()
        finally:
            connection.close()

    def second() -> None:
        try:
            outcome["b"] = submit(world, b).handle
        except Exception as exc:  # noqa: BLE001 - reported to the test below
            outcome["b"] = exc
        finally:
            connection.close()

    thread_a = threading.Thread(target=first)
    thread_a.start()
    assert created.wait(30)
    thread_b = threading.Thread(target=second)
    thread_b.start()
    time.sleep(1.0)
    waiting = thread_b.is_alive()  # blocked on the run lock while the first transaction is open
    release.set()
    thread_a.join(30)
    thread_b.join(30)

    assert isinstance(outcome["a"], str), outcome["a"]
    assert waiting
    assert isinstance(outcome["b"], SubmissionRefused), outcome["b"]
    assert spent_keys(outcome["b"]) == [quota]
    assert Experiment.objects.filter(run=world.run).count() == 2
    # Recorded by the service itself (no outer transaction to roll the record back).
    assert BlockedAttempt.objects.get(node=b).request["code"] == "feedback_allowance_spent"
