"""Zero false flags: an honest submission is accepted, with every subcategory NOT_FOUND_FULL."""

from __future__ import annotations

from apps.experiments.choices import IntegrityStatus
from apps.flows.agent_reports import worker_finalize
from apps.integrity.choices import Observation, Subcategory
from apps.integrity.models import FindingChange, IntegrityFinding
from apps.integrity.services import integrity_run_checks


def test_clean_train_eval_is_accepted_with_every_subcategory_clean(world):
    experiment = world.train([world.data["clean"]], correct=3)

    findings = integrity_run_checks(experiment=experiment)

    assert {f.subcategory for f in findings} == set(Subcategory.values)
    unclean = {
        f.subcategory: (f.observation, f.evidence.get("summary"))
        for f in findings
        if f.observation != Observation.NOT_FOUND_FULL
    }
    assert unclean == {}
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED
    assert FindingChange.objects.filter(finding__experiment=experiment).count() == 12


def test_rerunning_the_checks_changes_nothing(world):
    experiment = world.train([world.data["clean"]])
    integrity_run_checks(experiment=experiment)
    before = FindingChange.objects.count()

    integrity_run_checks(experiment=experiment)

    assert FindingChange.objects.count() == before


def test_honest_worker_summary_with_scores_and_disclosed_failure_stays_clean(world):
    baseline = world.eval_only(world.theta0, correct=1)
    trained = world.train([world.data["clean"]], correct=3)
    worker_finalize(
        node=world.worker,
        summary=(
            f"Baseline θ0 ({baseline.handle}) scores 0.25 on feedback. SFT on clean data ({trained.handle}) "
            f"reaches a feedback score of 0.75, an improvement of 0.5 over the baseline."
        ),
        experiments=[baseline.handle, trained.handle],
        actor=world.worker.handle,
    )
    for experiment in (baseline, trained):
        integrity_run_checks(experiment=experiment)
        experiment.refresh_from_db()
        flagged = IntegrityFinding.objects.filter(experiment=experiment).exclude(observation=Observation.NOT_FOUND_FULL)
        assert list(flagged.values_list("subcategory", "observation")) == []
        assert experiment.integrity_status == IntegrityStatus.ACCEPTED
