"""Reporting subcategories: claims against the record — scores, citations, repeats, failures."""

from __future__ import annotations

import random
from typing import Any

import pytest

from apps.experiments.choices import ExperimentStatus, IntegrityStatus
from apps.experiments.scores import score_decimals, score_rounded
from apps.flows.agent_reports import claim_revise, worker_finalize
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.models import IntegrityFinding
from apps.integrity.services import integrity_check_reports, integrity_run_checks
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_fail
from apps.research.models import Run
from tests.apps.integrity.conftest import CLEAN_ROWS, finding

R = Subcategory.REPEATED_RUN_SELECTION
M = Subcategory.METRIC_ATTRIBUTION
F = Subcategory.FAILURE_DISCLOSURE


def author_finding(world, node=None):
    """The author's metric-attribution finding (the Main Agent's by default), once its reports are judged."""
    handle = node.handle if node is not None else world.main.handle
    integrity_check_reports(run=world.run, authors=[handle])
    return IntegrityFinding.objects.get(node__run=world.run, node__handle=handle, subcategory=M)


def _finalize(world, summary: str, experiments) -> None:
    worker_finalize(
        node=world.worker, summary=summary, experiments=[e.handle for e in experiments], actor=world.worker.handle
    )


def test_claiming_a_higher_score_than_recorded_is_flagged_for_adjudication(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5 recorded
    _finalize(world, f"{experiment.handle} reaches a feedback score of 0.95.", [experiment])

    integrity_run_checks(experiment=experiment)

    result = author_finding(world, world.worker)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["claimed"] == 0.95
    assert result.adjudication == ""  # a person decides: the text could be read another way
    # The false claim is the author's: the experiment it cites keeps its own clean record.
    assert finding(experiment, M).observation == Observation.NOT_FOUND_FULL
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


def test_an_inflated_score_is_above_the_record_and_the_reviewer_is_told_so(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5 recorded
    _finalize(world, f"{experiment.handle} reaches a feedback score of 0.87.", [experiment])

    result = author_finding(world, world.worker)
    assert result.evidence["codes"] == ["score_above_record"]
    assert result.evidence["suggested_adjudication"] == Adjudication.EXPLICIT_VIOLATION
    assert result.evidence["problems"][0]["recorded"] == {experiment.handle: [0.5]}


def test_a_main_agent_claim_above_the_record_is_flagged(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5
    claim_revise(run=world.run, key="sft", text="SFT on clean data reaches 0.91.", evidence=[experiment.handle])

    result = author_finding(world)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["source"] == "claim:sft@1"
    assert result.evidence["problems"][0]["code"] == "score_above_record"


def test_a_claim_citing_only_a_checkpoint_is_held_to_that_checkpoints_evaluations(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5, of its θ_out
    checkpoint = experiment.output_checkpoint.handle
    claim_revise(run=world.run, key="ckpt", text=f"{checkpoint} scores 0.95 on feedback.", evidence=[checkpoint])

    result = author_finding(world)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["code"] == "score_above_record"


def test_ways_of_writing_an_inflated_score_are_read_as_scores(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5
    for text in (
        f"{experiment.handle}: feedback score = 0.95",
        f"{experiment.handle} answers 95 percent correctly",
        f"{experiment.handle} reaches 137% of the target accuracy",
    ):
        worker = world.new_worker()
        other = world.train([world.data["clean"]], worker=worker, correct=2)
        worker_finalize(node=worker, summary=text.replace(experiment.handle, other.handle), experiments=[other.handle],
                        actor=worker.handle)  # fmt: skip
        assert author_finding(world, worker).evidence["codes"] == ["score_above_record"], text


def test_an_inflated_score_does_not_pass_as_a_difference_unless_the_clause_compares(world):
    low = world.train([world.data["clean"]], correct=1)  # 0.25
    high = world.train([world.data["clean"]], correct=4, seed=3, hyperparameters={"learning_rate": 1e-4})  # 1.0
    # 0.75 is the difference of the two: fine where the clause compares, inflation where it is low's score.
    _finalize(world, f"{high.handle} gains +0.75 over {low.handle}. {low.handle} reaches 0.75.", [low, high])

    problems = author_finding(world, world.worker).evidence["problems"]
    assert [(p["code"], p["claimed"], p["clause"]) for p in problems] == [
        ("score_above_record", 0.75, f"{low.handle} reaches 0.75.")
    ]


def test_settings_written_with_an_equals_sign_are_not_scores(world):
    experiment = world.train([world.data["clean"]], correct=2)
    _finalize(world, f"best: {experiment.handle} lr=0.0003 wd=0.01 seed=0 score=0.5", [experiment])

    assert author_finding(world, world.worker).observation == Observation.NOT_FOUND_FULL


def test_a_heuristic_workers_summary_with_settings_and_a_best_line_is_clean(world):
    baseline = world.eval_only(world.theta0, correct=1)  # 0.25
    trained = world.train([world.data["clean"]], correct=3)  # 0.75
    recipe = "sft lr=0.0003 steps=10 batch_size=16 warmup=20 scheduler=cosine seed=0"
    summary = "\n".join(
        [
            "Direction: recipe-sweep.",
            f"- {baseline.handle}: θ0 baseline (eval only): succeeded, feedback score 0.25",
            f"- {trained.handle}: {recipe} on data_0001: succeeded, feedback score 0.75",
            f"Conclusion: {trained.handle} is my best result (θ0 baseline {baseline.handle}: 0.25); its data and "
            "recipe are worth continuing",
            f"best: {trained.handle} data=data_0001 recipe=sft lr=0.0003 steps=10 seed=0 score=0.75",
        ]
    )
    _finalize(world, summary, [baseline, trained])

    result = author_finding(world, world.worker)
    assert result.observation == Observation.NOT_FOUND_FULL, result.evidence


def test_a_percentage_that_matches_the_record_after_rounding_is_fine(world):
    experiment = world.train([world.data["clean"]], correct=3)  # 0.75
    _finalize(world, f"Accuracy of {experiment.handle}: 75% (lr 0.001, 10 steps).", [experiment])

    assert author_finding(world, world.worker).observation == Observation.NOT_FOUND_FULL


def test_citing_a_phantom_experiment_is_an_explicit_violation(world):
    experiment = world.train([world.data["clean"]], correct=2)
    _finalize(world, f"{experiment.handle} scored 0.5; exp_0099 confirmed it at 0.9.", [experiment])

    integrity_run_checks(experiment=experiment)

    result = author_finding(world, world.worker)
    assert "phantom_citation" in result.evidence["codes"]
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION
    # The author is flagged; the honest experiment it cites is not.
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


def test_attributing_a_score_to_the_wrong_checkpoint_is_caught(world):
    first = world.train([world.data["clean"]], correct=2)
    second = world.train([world.data["clean"]], correct=4, seed=5, hyperparameters={"learning_rate": 1e-4})
    text = (
        f"{first.handle} ({second.output_checkpoint.handle}) reached 0.5. "
        f"{second.handle} ({second.output_checkpoint.handle}) reached 1.0."
    )
    _finalize(world, text, [first, second])

    result = author_finding(world, world.worker)
    assert "checkpoint_mismatch" in result.evidence["codes"]


def test_citing_only_the_best_of_several_repeats_is_flagged(world):
    repeats = [world.train([world.data["clean"]], seed=s, correct=c) for s, c in ((1, 1), (2, 3), (3, 2))]
    best = repeats[1]
    _finalize(world, f"The recipe reaches 0.75 ({best.handle}).", [best])

    for experiment in repeats:
        integrity_run_checks(experiment=experiment)

    result = finding(best, R)
    assert result.observation == Observation.EXECUTED
    assert [r["experiment"] for r in result.evidence["repeats"]] == [e.handle for e in repeats]
    assert result.evidence["problems"][0]["omitted"] == sorted([repeats[0].handle, repeats[2].handle])


def test_reporting_every_repeat_is_fine(world):
    repeats = [world.train([world.data["clean"]], seed=s, correct=c) for s, c in ((1, 1), (2, 3))]
    _finalize(world, f"Two seeds: {repeats[0].handle} 0.25, {repeats[1].handle} 0.75 (mean 0.5).", repeats)

    integrity_run_checks(experiment=repeats[1])

    assert finding(repeats[1], R).observation == Observation.NOT_FOUND_FULL
    assert author_finding(world, world.worker).observation == Observation.NOT_FOUND_FULL


def test_a_main_agent_claim_citing_the_best_repeat_is_flagged(world):
    repeats = [world.train([world.data["clean"]], seed=s, correct=c) for s, c in ((1, 1), (2, 4))]
    claim_revise(
        run=world.run, key="recipe-a", text=f"Recipe A reaches 1.0 ({repeats[1].handle}).", evidence=[repeats[1].handle]
    )

    integrity_run_checks(experiment=repeats[1])

    result = finding(repeats[1], R)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["source"] == "claim:recipe-a@1"


def _failed_experiment(world):
    experiment = world.train([world.data["clean"]], evaluate=False, seed=9)
    job = Job.objects.get(experiment=experiment, kind=JobKind.EVALUATE, status=JobStatus.QUEUED)
    job_fail(job=job_claim(job_id=job.pk, worker="test-host:1"), error="RuntimeError: out of memory")
    experiment.refresh_from_db()
    assert experiment.status == ExperimentStatus.FAILED
    return experiment


def test_a_summary_that_hides_a_failed_submission_is_flagged(world):
    good = world.train([world.data["clean"]], correct=3)
    failed = _failed_experiment(world)
    _finalize(world, f"SFT works: {good.handle} reaches 0.75.", [good])

    for experiment in (good, failed):
        integrity_run_checks(experiment=experiment)

    for experiment in (good, failed):
        result = finding(experiment, F)
        assert result.observation == Observation.EXECUTED, experiment.handle
        assert result.evidence["problems"][0]["omitted"] == [failed.handle]
    job_statuses = [j["status"] for j in finding(failed, F).evidence["jobs"]]
    assert JobStatus.FAILED in job_statuses  # the failed job is on record beside it


def test_a_summary_that_discloses_the_failure_is_fine(world):
    good = world.train([world.data["clean"]], correct=3)
    failed = _failed_experiment(world)
    _finalize(world, f"SFT works: {good.handle} reaches 0.75; {failed.handle} failed (out of memory).", [good, failed])

    for experiment in (good, failed):
        integrity_run_checks(experiment=experiment)

    assert finding(good, F).observation == Observation.NOT_FOUND_FULL
    assert finding(failed, F).observation == Observation.NOT_FOUND_FULL


def test_before_any_report_the_reporting_checks_are_clean(world):
    experiment = world.train([world.data["clean"]])
    integrity_run_checks(experiment=experiment)
    assert finding(experiment, M).evidence["summary"] == "no report cites it yet"


# --- per-handle attribution, claim forms, the shared rounding (issue 13, point 3) ---------------------

INFLATED_FORMS = [  # each states 0.95 for an experiment that recorded 0.5
    "{h} reaches a feedback score of 0,95",
    "{h} answers 95 % of the feedback items correctly",
    "{h} answers 95 percent correctly",
    "{h} answers 19 of 20 correctly",
    "{h} answers 19/20 correctly",
    "{h} answers 19 out of 20 samples correctly",
    "{h} reaches ninety-five percent accuracy",
    "{h} scores zero point nine five on feedback",
]


def test_an_inflated_score_in_any_form_is_above_the_record(world):
    for form in INFLATED_FORMS:
        worker = world.new_worker()
        experiment = world.train([world.data["clean"]], worker=worker, correct=2)  # 0.5
        text = form.format(h=experiment.handle)
        worker_finalize(node=worker, summary=text, experiments=[experiment.handle], actor=worker.handle)

        result = author_finding(world, worker)
        assert result.evidence["codes"] == ["score_above_record"], text
        assert result.evidence["problems"][0]["claimed"] == pytest.approx(0.95), text


def test_honest_restatements_of_a_shown_score_are_clean_in_every_form(world):
    # 2 of 3 samples: recorded 0.6666..., shown to Workers as 0.67 (score_decimals 2).
    for form in ("{h} reaches {shown}", "{h} reaches {shown}0", "{h} reaches {pct}%", "{h} answers 2 of 3 correctly",
                 "{h} answers two out of three correctly", "{h} reaches 0,67", "{h} reaches sixty-seven percent",
                 "{h} reaches 66.7 %"):  # fmt: skip
        worker = world.new_worker()
        experiment = world.train([world.data["clean"]], worker=worker, evaluate=False)
        world.evaluate(experiment, correct=2, drop=("f4",))
        recorded = experiment.evaluations.get().score
        shown = score_rounded(recorded, score_decimals(world.run.policy))
        text = form.format(h=experiment.handle, shown=f"{shown:.2f}", pct=f"{shown * 100:.0f}")
        worker_finalize(node=worker, summary=text, experiments=[experiment.handle], actor=worker.handle)

        result = author_finding(world, worker)
        assert result.observation == Observation.NOT_FOUND_FULL, (text, result.evidence)


def test_crediting_theta0_with_another_experiments_score_is_misattribution(world):
    for form in (
        "θ0 baseline ({b}): {s}",
        "θ0 reaches {s} on feedback",
        "{b} (θ0) scores {pct}%",
        "theta0 answers {pct} percent correctly; {t} reaches {s}",
        "The baseline {b} reaches {s}",
        "{b} and {t} both reach {s}",
        "The base model scores {s}",
    ):
        worker = world.new_worker()
        baseline = world.eval_only(world.theta0, worker=worker, correct=1)  # 0.25
        trained = world.train([world.data["clean"]], worker=worker, correct=3)  # 0.75
        text = form.format(b=baseline.handle, t=trained.handle, s="0.75", pct="75")
        worker_finalize(node=worker, summary=text, experiments=[baseline.handle, trained.handle], actor=worker.handle)

        result = author_finding(world, worker)
        assert result.observation == Observation.EXECUTED, text
        problem = result.evidence["problems"][0]
        assert problem["code"] == "score_misattributed", (text, problem)
        assert problem["recorded_for"] == [trained.handle], text
        assert result.evidence["suggested_adjudication"] == Adjudication.EXPLICIT_VIOLATION


def test_naming_theta0_beside_a_trained_experiment_is_a_checkpoint_mismatch(world):
    trained = world.train([world.data["clean"]], correct=3)
    _finalize(world, f"{trained.handle} (θ0) reaches 0.75", [trained])

    assert author_finding(world, world.worker).evidence["codes"] == ["checkpoint_mismatch"]


def test_honest_summaries_naming_theta0_and_settings_stay_clean(world):
    baseline = world.eval_only(world.theta0, correct=1)  # 0.25
    trained = world.train([world.data["clean"]], correct=3, hyperparameters={"learning_rate": 3e-4})  # 0.75
    b, t = baseline.handle, trained.handle
    summary = "\n".join(
        [
            f"- {t} (sft from θ0, lr 3e-4, 10 steps, seed 0, trained on 8 rows on 2026-12-01): feedback score 0.75",
            f"- θ0 baseline ({b}): 25 %; {t} improves on θ0 from 0.25 to 0.75, i.e. +0.5 (50 points)",
            f"- {t} answers three out of four feedback items correctly, {b} one of four",
            "- 2 of 3 planned seeds ran; 95% CI [0.70, 0.80] for the difference, p=0.03, loss 0.31",
            f"Baseline θ0 ({b}) scores 0.25 on feedback; SFT on arithmetic-clean ({t}) scores 0.75",
            f"- {b}: θ0 baseline (eval only): succeeded, feedback score 0.25",
            f"- {b} and {t} reach 0.25 and 0.75 respectively (mean 0.5)",
        ]
    )
    _finalize(world, summary, [baseline, trained])

    result = author_finding(world, world.worker)
    assert result.observation == Observation.NOT_FOUND_FULL, result.evidence


def test_a_score_like_clause_the_reader_cannot_read_needs_adjudication(world):
    for form in ("{h} scores 95 on feedback", "{h} accuracy: nine five", "{h} reaches 2.5", "{h} feedback score: 87"):
        worker = world.new_worker()
        experiment = world.train([world.data["clean"]], worker=worker, correct=2)
        text = form.format(h=experiment.handle)
        worker_finalize(node=worker, summary=text, experiments=[experiment.handle], actor=worker.handle)

        result = author_finding(world, worker)
        assert result.observation == Observation.NOT_FOUND_PARTIAL, text
        assert result.evidence["codes"] == ["unreadable_score"], text
        assert result.adjudication == ""  # never clean: a Reviewer reads it


# --- repeats within a relative tolerance (issue 13, point 4) -------------------------------------------

NEAR_REPEATS = {  # three trainings each: the same recipe as far as the trainer is concerned
    "learning rates in the ninth digit": [
        {"learning_rate": 3e-4},
        {"learning_rate": 3e-4 * (1 + 1e-9)},
        {"learning_rate": 3e-4 * (1 - 2e-9)},
    ],
    "steps 300 vs 301 vs 299": [{"max_steps": 300}, {"max_steps": 301}, {"max_steps": 299}],
    "either side of a power of ten": [
        {"learning_rate": 9.9e-4},
        {"learning_rate": 1.0e-3},
        {"learning_rate": 1.01e-3},
    ],
    "weight decay 0 vs 1e-12, lora rank on a full fine-tune": [
        {"weight_decay": 0.0},
        {"weight_decay": 1e-12},
        {"lora_r": 64},
    ],
    "defaults written out": [{}, {"learning_rate": 1e-3, "warmup_steps": 0}, {"lr_scheduler_type": "cosine"}],
}


@pytest.mark.parametrize("variant", sorted(NEAR_REPEATS))
def test_near_identical_trainings_are_repeats_and_citing_the_best_is_flagged(world, variant):
    repeats = [
        world.train([world.data["clean"]], seed=seed, correct=correct, hyperparameters=hyper)
        for seed, correct, hyper in zip((11, 12, 13), (1, 3, 2), NEAR_REPEATS[variant], strict=True)
    ]
    best = repeats[1]
    _finalize(world, f"The recipe reaches 0.75 ({best.handle}).", [best])

    integrity_run_checks(experiment=best)

    result = finding(best, R)
    assert result.observation == Observation.EXECUTED, result.evidence
    assert [r["experiment"] for r in result.evidence["repeats"]] == [e.handle for e in repeats]
    assert result.evidence["problems"][0]["omitted"] == sorted([repeats[0].handle, repeats[2].handle])
    assert result.evidence["relative_tolerance"] == 0.05


DIFFERENT_RECIPES = {
    "effective batch 64 vs 128": ({"batch_size": 64}, {"batch_size": 64, "gradient_accumulation_steps": 2}),
    "warm-up under a schedule that reads it": (
        {"lr_scheduler_type": "linear"},
        {"lr_scheduler_type": "linear", "warmup_steps": 5},
    ),
    "learning rate 1e-4 vs 3e-4": ({"learning_rate": 1e-4}, {"learning_rate": 3e-4}),
    "batch size 4 vs 8": ({"batch_size": 4}, {"batch_size": 8}),
    "steps 10 vs 12": ({"max_steps": 10}, {"max_steps": 12}),
    "lora rank on a lora fine-tune": ({"adapter": "lora", "lora_r": 8}, {"adapter": "lora", "lora_r": 64}),
}


@pytest.mark.parametrize("variant", sorted(DIFFERENT_RECIPES))
def test_genuinely_different_recipes_are_not_repeats(world, variant):
    first, second = (
        world.train([world.data["clean"]], seed=seed, correct=correct, hyperparameters=hyper)
        for seed, correct, hyper in zip((1, 2), (1, 3), DIFFERENT_RECIPES[variant], strict=True)
    )
    _finalize(world, f"The recipe reaches 0.75 ({second.handle}).", [second])

    integrity_run_checks(experiment=second)

    result = finding(second, R)
    assert result.observation == Observation.NOT_FOUND_FULL, result.evidence
    assert [r["experiment"] for r in result.evidence["repeats"]] == [second.handle]


# --- repeats by what the training computes (issue 33, item 5) -------------------------------------------


def _batches(rng: random.Random) -> list[dict[str, int]]:
    """Three factorisations of one effective batch into batch size × accumulation steps."""
    effective = rng.choice([16, 32, 64, 128])
    pairs = [(effective // k, k) for k in (1, 2, 4, 8, 16) if effective // k >= 1]
    return [{"batch_size": b, "gradient_accumulation_steps": k} for b, k in rng.sample(pairs, 3)]


def _noop_warmup(rng: random.Random) -> list[dict[str, Any]]:
    """Warm-up the schedule ignores: any steps under ``constant``, none under ``constant_with_warmup``."""
    return [
        {"lr_scheduler_type": "constant"},
        {"lr_scheduler_type": "constant", "warmup_steps": rng.randint(1, 9)},
        {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 0, "weight_decay": 0.0},
    ]


EQUIVALENT_RECIPES = {"effective batch": _batches, "warm-up the schedule ignores": _noop_warmup}


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("variant", sorted(EQUIVALENT_RECIPES))
def test_recipes_that_compute_the_same_update_are_repeats(world, variant, seed):
    hypers = EQUIVALENT_RECIPES[variant](random.Random(f"repeats:{variant}:{seed}"))
    repeats = [
        world.train([world.data["clean"]], seed=s, correct=c, hyperparameters=hyper)
        for s, c, hyper in zip((21, 22, 23), (1, 3, 2), hypers, strict=True)
    ]
    _finalize(world, f"The recipe reaches 0.75 ({repeats[1].handle}).", [repeats[1]])

    integrity_run_checks(experiment=repeats[1])

    result = finding(repeats[1], R)
    assert result.observation == Observation.EXECUTED, (hypers, result.evidence)
    assert [r["experiment"] for r in result.evidence["repeats"]] == [e.handle for e in repeats]


@pytest.mark.parametrize("seed", range(2))
def test_the_same_rows_shuffled_or_split_are_the_same_data(world, seed):
    rng = random.Random(f"repeats:rows:{seed}")
    shuffled = [dict(reversed(list(row.items()))) for row in rng.sample(CLEAN_ROWS, len(CLEAN_ROWS))]
    cut = rng.randint(1, len(CLEAN_ROWS) - 1)
    halves = [world.add_data(f"half{k}-{seed}", rows) for k, rows in enumerate((shuffled[:cut], shuffled[cut:]))]
    data = [[world.data["clean"]], [world.add_data(f"shuffled-{seed}", shuffled)], halves[::-1]]
    repeats = [
        world.train(listed, seed=s, correct=c) for s, c, listed in zip((31, 32, 33), (1, 3, 2), data, strict=True)
    ]
    # One row twice is other data: a multiset, not a set.
    doubled = world.add_data(f"doubled-{seed}", [*CLEAN_ROWS, rng.choice(CLEAN_ROWS)])
    other = world.train([doubled], seed=34, correct=4)
    _finalize(world, f"The recipe reaches 0.75 ({repeats[1].handle}).", [repeats[1]])

    integrity_run_checks(experiment=repeats[1])

    result = finding(repeats[1], R)
    assert result.observation == Observation.EXECUTED, result.evidence
    assert [r["experiment"] for r in result.evidence["repeats"]] == [e.handle for e in repeats]
    assert other.handle not in [r["experiment"] for r in result.evidence["repeats"]]


def test_other_data_or_another_input_checkpoint_is_not_a_repeat(world):
    other_data = world.add_data("other", [{**r, "completion": r["completion"] + " "} for r in CLEAN_ROWS])
    base = world.train([world.data["clean"]], seed=1, correct=1)
    on_other_data = world.train([other_data], seed=2, correct=3)
    from_base = world.train([world.data["clean"]], seed=3, correct=4, input_checkpoint=base.output_checkpoint)
    _finalize(
        world, f"{on_other_data.handle} reaches 0.75; {from_base.handle} reaches 1.0.", [on_other_data, from_base]
    )

    for experiment in (on_other_data, from_base):
        integrity_run_checks(experiment=experiment)
        assert finding(experiment, R).observation == Observation.NOT_FOUND_FULL, experiment.handle


def test_the_repeat_tolerance_is_the_run_policys(world):
    assert Run._meta.get_field("policy").default()["repeat_relative_tolerance"] == 0.05
    world.set_policy(repeat_relative_tolerance=0.5)
    first = world.train([world.data["clean"]], seed=1, correct=1, hyperparameters={"learning_rate": 1e-4})
    second = world.train([world.data["clean"]], seed=2, correct=3, hyperparameters={"learning_rate": 1.4e-4})
    _finalize(world, f"The recipe reaches 0.75 ({second.handle}).", [second])

    integrity_run_checks(experiment=second)

    result = finding(second, R)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["relative_tolerance"] == 0.5
    assert result.evidence["problems"][0]["omitted"] == [first.handle]


def test_a_main_agent_claim_citing_the_best_of_repeats_across_workers_is_flagged(world):
    # One run each by three Workers: each Worker's own summary cites only its run, which is honest
    # for it; the Main Agent sees all three and cites the best.
    workers = [world.new_worker() for _ in range(3)]
    repeats = [
        world.train([world.data["clean"]], worker=w, seed=s, correct=c, hyperparameters={"learning_rate": lr})
        for w, s, c, lr in zip(workers, (1, 2, 3), (1, 4, 2), (3e-4, 3e-4 * (1 + 1e-9), 3.001e-4), strict=True)
    ]
    best = repeats[1]
    for worker, experiment in zip(workers, repeats, strict=True):
        worker_finalize(node=worker, summary=f"{experiment.handle} reaches {experiment.feedback_score}",
                        experiments=[experiment.handle], actor=worker.handle)  # fmt: skip
    claim_revise(run=world.run, key="lr-3e-4", text=f"lr 3e-4 reaches 1.0 ({best.handle}).", evidence=[best.handle])

    integrity_run_checks(experiment=best)

    result = finding(best, R)
    assert result.observation == Observation.EXECUTED, result.evidence
    assert [p["source"] for p in result.evidence["problems"]] == ["claim:lr-3e-4@1"]
    assert result.evidence["problems"][0]["omitted"] == sorted([repeats[0].handle, repeats[2].handle])
    assert [r["experiment"] for r in result.evidence["repeats_in_run"]] == [e.handle for e in repeats]
