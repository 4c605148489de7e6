"""The red team: a scripted adversarial campaign against the live system, and what the records say.

One campaign runs per module (it trains and evaluates for real on the ci minibench, through a
web server (uvicorn) and a Celery worker on the test database); the tests then read its outcome table,
built from the stored ``IntegrityFinding`` and ``BlockedAttempt`` rows. The last test switches
each post-submission check off in turn and shows that its rows turn red, so the table can fail.

Run alone: ``pytest tests/apps/integrity/redteam -s`` prints the table.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import minibench_install
from apps.core.hashing import sha256_tree
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.choices import IntegrityStatus
from apps.experiments.models import Experiment
from apps.experiments.services import checkpoint_register, manifest_digest
from apps.expos.auth import agent_token_issue
from apps.integrity import checks
from apps.integrity.choices import Observation, Subcategory
from apps.integrity.models import BlockedAttempt, IntegrityFinding
from apps.integrity.report import integrity_report
from apps.integrity.selectors import best_accepted_experiment
from apps.integrity.services import integrity_check_reports, integrity_run_checks
from apps.research.choices import NodeKind
from apps.research.models import ResearchNode
from apps.research.services import node_create, run_create
from tests.apps.integrity.redteam.campaign import Campaign, run_campaign
from tests.apps.integrity.redteam.harness import (
    Agent,
    build_table,
    format_table,
    process_env,
    start_server,
    start_worker,
)

# django_db: each test reads the campaign's committed records inside its own rolled-back transaction
# (and makes pytest-django set the test database up for the campaign's module fixture).
pytestmark = [pytest.mark.slow, pytest.mark.django_db]

MIN_VARIANTS = 2


@pytest.fixture(scope="session")
def minibench_ci(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared `ci` minibench (tests/support/minibench.py)."""
    from tests.support.minibench import ci_minibench  # noqa: PLC0415 - heavy (torch), fixture only

    return ci_minibench(tmp_path_factory)


@pytest.fixture(scope="module")
def campaign(django_db_setup, django_db_blocker, minibench_ci, tmp_path_factory):
    base = tmp_path_factory.mktemp("redteam")
    roots = {name: base / name for name in ("artifacts", "sealed", "workspaces", "data", "cache", "logs")}
    for path in roots.values():
        path.mkdir()
    roots["minibench"] = minibench_ci
    overrides = override_settings(
        ARTIFACT_ROOT=str(roots["artifacts"]),
        ARTIFACT_CACHE_DIR=str(roots["cache"]),
        SEALED_ROOT=str(roots["sealed"]),
        WORKSPACE_ROOT=str(roots["workspaces"]),
        MINIBENCH_ROOT=str(minibench_ci),
    )
    overrides.enable()
    processes = []
    try:
        with django_db_blocker.unblock():
            # Messages of an earlier session would name job ids this database reuses.
            redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
            installed = minibench_install(root=minibench_ci)
            benchmark = Benchmark.objects.get(name="minibench/arithmetic")
            # θ0 of this run is the ci reference's weights (as a base of its own): it already scores
            # above zero, so short trainings with different seeds score differently — which the
            # repeated-run variants need — at a few seconds per training.
            theta0 = _register_base(minibench_ci / manifest_reference(minibench_ci), handle="redteam/theta0")
            assert installed["theta0"]
            run = run_create(
                name="red team",
                benchmark=benchmark,
                base_checkpoint=theta0,
                target_capability="two-digit addition",
                budget_wall_seconds=36000,
                budget_accelerator_seconds=36000,
                budget_llm_tokens=10**9,
                max_parallel_workers=100,
                policy={
                    "training_gate": True,
                    "allowed_teachers": ["qwen-approved"],
                    # A lineage's allowance is small enough to spend in a phase (feedback mining);
                    # θ0 is the input of most of the campaign's submissions.
                    "feedback_evals_per_worker": 6,
                    "feedback_evals_per_checkpoint": 500,
                    "feedback_evals_per_run": 1000,
                    "contamination_tolerance": 3,
                },
            )
            main_node = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
            anchor = node_create(run=run, kind=NodeKind.WORKER, task="scope anchor")
            reviewer_node = node_create(run=run, kind=NodeKind.REVIEWER, task="integrity review", upstream=[anchor])
            env = process_env(roots)
            server, url = start_server(env, roots["logs"])
            processes.append(server)
            worker = start_worker("honest", env, roots["logs"])
            main_token, _ = agent_token_issue(run=run, node=main_node, role="main")
            reviewer_token, _ = agent_token_issue(run=run, node=reviewer_node, role="reviewer")
            c = Campaign(
                run=run,
                url=url,
                roots=roots,
                minibench=minibench_ci,
                env=env,
                main=Agent(url, main_token, "main"),
                reviewer_node=reviewer_node,
                reviewer=Agent(url, reviewer_token, reviewer_node.handle),
                worker_process=worker,
            )
            try:
                run_campaign(c, roots["logs"], only=os.environ.get("REDTEAM_PHASES"))
            finally:
                processes.append(c.worker_process)
        yield c
    finally:
        for process in processes:
            if process is not None:
                process.stop()
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)
            redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
        overrides.disable()


def manifest_reference(root: Path) -> str:
    return json.loads((root / "manifest.json").read_text())["references"]["arithmetic"]


def _register_base(folder: Path, *, handle: str):
    manifest = sha256_tree(folder)
    uri = artifact_store().put_dir(folder, key=checkpoint_key(manifest_digest(manifest)))
    return checkpoint_register(handle=handle, uri=uri, manifest=manifest, is_base=True)


def _table(campaign):
    return build_table(campaign.variants, campaign.run)


def test_every_attempt_is_blocked_or_executed_and_flagged(campaign):
    rows = _table(campaign)
    print("\n" + format_table(rows))  # noqa: T201
    print(f"phase seconds: {campaign.timings}")  # noqa: T201

    per_subcategory = Counter(r.subcategory for r in rows)
    assert {s: per_subcategory.get(s, 0) for s in Subcategory.values if per_subcategory.get(s, 0) < MIN_VARIANTS} == {}
    missed = [f"{r.subcategory} / {r.variant}: {r.outcome}" for r in rows if not r.caught]
    assert missed == []
    # None accepted: an executed attempt never leaves its submission accepted (a submission whose only
    # finding is a blocked attempt is clean, and may be).
    accepted = [r for r in rows if r.integrity == IntegrityStatus.ACCEPTED and r.observation != "ATTEMPTED_BLOCKED"]
    assert accepted == []
    # Both layers are exercised: refusals before any compute and observations after.
    assert {r.layer for r in rows} == {"review", "post"}


def test_honest_submissions_are_accepted_with_nothing_flagged(campaign):
    assert len(campaign.clean) >= 3
    for handle in campaign.clean:
        experiment = Experiment.objects.get(run=campaign.run, handle=handle)
        findings = IntegrityFinding.objects.filter(experiment=experiment)
        assert {f.subcategory: f.observation for f in findings} == dict.fromkeys(
            Subcategory.values, Observation.NOT_FOUND_FULL
        ), handle
        assert experiment.integrity_status == IntegrityStatus.ACCEPTED, handle
    honest_workers = {Experiment.objects.get(run=campaign.run, handle=h).owner_id for h in campaign.clean}
    assert not BlockedAttempt.objects.filter(node_id__in=honest_workers).exists()


def test_rates_selection_and_report_come_from_the_records(campaign):
    run = type(campaign.run).objects.get(pk=campaign.run.pk)
    report = integrity_report(run)
    ran = [s for s in report["submissions"] if s["ran"]]
    hacked = [s for s in ran if s["hacked"]]
    assert report["rates"]["submissions_ran"] == len(ran)
    assert report["rates"]["hacked"] == len(hacked) > 0
    assert report["rates"]["hacking_rate"] == pytest.approx(len(hacked) / len(ran))
    assert report["rates"]["blocked_attempts"] == BlockedAttempt.objects.filter(run=campaign.run).count() > 0
    # Hacked scores stay in the denominator and never select the checkpoint.
    best = best_accepted_experiment(campaign.run)
    assert best is not None
    assert best.handle in campaign.clean
    assert best.handle not in {s["experiment"] for s in hacked}
    assert run.flagged  # shared data in violation (the overridden honeypot) flags the run


def test_the_integrity_hooks_are_wired(campaign):
    assert campaign.hooks_missing == [], (
        "the red team had to trigger the integrity checks itself; wire "
        "apps.integrity.services.integrity_on_experiment_finished into the pipeline (experiment end) and "
        "integrity_on_report into Worker finalization / Main Agent claims: missing " + ", ".join(campaign.hooks_missing)
    )


def _noop(subject):
    return checks.CheckResult(Observation.NOT_FOUND_FULL, [], "switched off")


# Committed, not rolled back: the Reviewer judges the restored findings through the live server, which
# sees only committed rows (and would wait on the row locks of an open test transaction). It is the
# last test; the flush after it costs nothing the campaign's teardown would not do anyway.
@pytest.mark.django_db(transaction=True)
def test_switching_each_check_off_turns_its_rows_red(campaign, monkeypatch):
    rows = _table(campaign)
    by_subcategory = defaultdict(list)
    for variant, row in zip(campaign.variants, rows, strict=True):
        by_subcategory[row.subcategory].append((variant, row))
    for subcategory in Subcategory.values:
        post = [(v, r) for v, r in by_subcategory[subcategory] if r.layer == "post"]
        assert post, f"{subcategory}: no variant is observed by a post-submission check"
        experiments = {v.experiment for v, _ in post}
        with monkeypatch.context() as patch:
            patch.setitem(checks.CHECKS, subcategory, _noop)
            if subcategory in checks.REPORT_CHECKS:  # a report's finding is its author's
                patch.setitem(checks.REPORT_CHECKS, subcategory, lambda *_a, **_k: _noop(None))
                integrity_check_reports(run=campaign.run)
            for handle in experiments:
                integrity_run_checks(
                    experiment=Experiment.objects.get(run=campaign.run, handle=handle), subcategories=(subcategory,)
                )
            switched = {(r.subcategory, r.variant): r for r in _table(campaign)}
        red = [r for v, r in post if not switched[(r.subcategory, r.variant)].caught]
        assert len(red) == len(post), f"{subcategory}: rows still caught with the check off: {post}"
        # The refusals of the submission review are the other layer: they do not depend on this check.
        for _v, r in by_subcategory[subcategory]:
            if r.layer == "review":
                assert switched[(r.subcategory, r.variant)].caught
        for handle in experiments:  # the check back on: the observations return
            integrity_run_checks(
                experiment=Experiment.objects.get(run=campaign.run, handle=handle), subcategories=(subcategory,)
            )
        if subcategory in checks.REPORT_CHECKS:
            integrity_check_reports(run=campaign.run)
    campaign.review()  # what the Reviewer had decided is judged again on the restored observations
    assert [r.outcome for r in _table(campaign) if not r.caught] == []
