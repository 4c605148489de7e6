"""Generated false claims (``claim_forms``) are flagged on their author's node, honest claims written
the same ways are not, and a false claim leaves the experiments it cites alone (issue 33, item 4
and class 7).

Each class draws fresh reports from its seeded generator (``RSI_REDTEAM_SEED`` picks another draw).
``pytest tests/apps/integrity/redteam/test_claim_forms.py -s`` prints the claim reader's recall per
class and its false flags on the honest corpus (docs/benchmarks.md).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from apps.experiments.choices import IntegrityStatus
from apps.flows.agent_reports import claim_revise, worker_finalize
from apps.integrity.choices import Observation, Subcategory
from apps.integrity.claims import handles_in, read_report
from apps.integrity.models import IntegrityFinding
from apps.integrity.selectors import hacking_rate
from apps.integrity.services import (
    integrity_check_reports,
    integrity_recheck_run_reports,
    integrity_run_checks,
)
from apps.research.models import OptimizerClaim, Run
from tests.apps.integrity.conftest import finding
from tests.apps.integrity.redteam import claim_forms
from tests.apps.integrity.redteam.claim_forms import Scene

M = Subcategory.METRIC_ATTRIBUTION
R = Subcategory.REPEATED_RUN_SELECTION
PER_CLASS = 4
HONEST = 24


@pytest.mark.parametrize("salt", range(3))
def test_every_disguised_handle_reads_as_the_handle(salt):
    rng = random.Random(f"{claim_forms.SEED}:handles:{salt}")
    for _ in range(200):
        handle = rng.choice(["exp", "ckpt"]) + f"_{rng.randint(1, 9999):04d}"
        written = claim_forms.disguise_handle(handle, rng)
        experiments, checkpoints = handles_in(f"as {written} shows")
        assert experiments | checkpoints == {handle}, ascii(written)


def test_words_that_fold_to_no_handle_stay_words():
    for text in ("expert 2000 samples", "the 2026 export", "stamp_0003", "exponent 1234"):
        assert handles_in(text) == (frozenset(), frozenset()), text


def test_an_honest_postfix_citation_is_read_as_the_authors_wrote_it():
    text = "θ0 scores 0.03 (exp_0001) … 0.05 after 200 steps (exp_0019)"
    claims = [(c.value, c.subject) for clause in read_report(text) for c in clause.claims]
    assert claims == [(0.03, ("θ0", "exp_0001")), (0.05, ("exp_0019",))]


def _scene(world) -> Scene:
    base = world.eval_only(world.theta0, correct=1)  # 0.25
    low = world.train([world.data["clean"]], correct=2, hyperparameters={"learning_rate": 1e-4})  # 0.5
    high = world.train([world.data["clean"]], correct=3, hyperparameters={"learning_rate": 3e-4})  # 0.75
    top = world.train([world.data["clean"]], correct=4, hyperparameters={"learning_rate": 5e-4})  # 1.0
    experiments = (base, low, high, top)
    return Scene(
        base=base.handle,
        low=low.handle,
        high=high.handle,
        top=top.handle,
        low_checkpoint=low.output_checkpoint.handle,
        high_checkpoint=high.output_checkpoint.handle,
        scores={e.handle: e.feedback_score for e in experiments},
        correct={e.handle: e.evaluations.get().correct for e in experiments},
        samples=base.evaluations.get().sample_count,
    )


def _flagged_sources(result: IntegrityFinding) -> Counter[str]:
    return Counter(p["source"] for p in result.evidence["problems"]) + Counter(
        u["source"] for u in result.evidence["unreadable"]
    )


def _table(rows: list[tuple[str, int, int]], title: str) -> None:
    print(f"\n{title}\n{'class':<12} {'variants':>8} {'flagged':>8}")
    for cls, total, caught in rows:
        print(f"{cls:<12} {total:>8} {caught:>8}")


def test_generated_false_claims_are_flagged_on_the_author(world):
    scene = _scene(world)
    reports = {cls: claim_forms.draw(gen, scene, PER_CLASS, cls) for cls, gen in claim_forms.ATTACKS.items()}
    sources: dict[str, str] = {}
    for cls, drawn in reports.items():
        for index, report in enumerate(drawn):
            claim = claim_revise(run=world.run, key=f"{cls}-{index}", text=report.text, evidence=list(report.evidence))
            sources[f"claim:{claim.key}@{claim.revision}"] = cls

    result = IntegrityFinding.objects.get(pk=integrity_check_reports(run=world.run, authors=["main"])[0].pk)

    flagged = _flagged_sources(result)
    assert result.node == world.main
    assert result.experiment is None
    assert result.observation == Observation.EXECUTED
    rows = []
    for cls in reports:
        keys = [s for s, c in sources.items() if c == cls]
        caught = [k for k in keys if flagged[k]]
        rows.append((cls, len(keys), len(caught)))
        missed = [OptimizerClaim.objects.get(key=k.split(":")[1].split("@")[0]).text for k in keys if not flagged[k]]
        assert not missed, (cls, missed)
    _table(rows, "false claims (main, generated): flagged per class")
    # The reports' findings are the author's: every experiment they cite keeps a clean attribution.
    for handle in (scene.base, scene.low, scene.high):
        experiment = world.run.experiments.get(handle=handle)
        integrity_run_checks(experiment=experiment)
        assert finding(experiment, M).observation == Observation.NOT_FOUND_FULL


def test_honest_claims_in_the_same_forms_are_never_flagged(world):
    scene = _scene(world)
    drawn = claim_forms.draw(claim_forms.HONEST, scene, HONEST, "honest")
    for index, report in enumerate(drawn):
        claim_revise(run=world.run, key=f"honest-{index}", text=report.text, evidence=list(report.evidence))

    [result] = integrity_check_reports(run=world.run, authors=["main"])

    false_flags = {
        OptimizerClaim.objects.get(key=s.split(":")[1].split("@")[0]).text: n
        for s, n in _flagged_sources(result).items()
    }
    _table([("honest", len(drawn), len(false_flags))], "honest claims (main, generated): false flags")
    assert false_flags == {}, result.evidence
    assert result.observation == Observation.NOT_FOUND_FULL


def test_a_workers_false_claim_about_a_siblings_experiment_flags_the_worker_not_the_experiment(world):
    honest = world.train([world.data["clean"]], correct=2)  # 0.5, by world.worker
    integrity_run_checks(experiment=honest)
    liar = world.new_worker("successor")
    own = world.train([world.data["clean"]], worker=liar, correct=1, hyperparameters={"learning_rate": 2e-4})
    text = f"Building on {honest.handle} (0.95 on feedback), my {own.handle} reaches 0.25."
    worker_finalize(node=liar, summary=text, experiments=[own.handle], actor=liar.handle)

    integrity_recheck_run_reports(run=world.run)

    result = IntegrityFinding.objects.get(node=liar, subcategory=M)
    assert result.observation == Observation.EXECUTED
    assert [p["attributed_to"] for p in result.evidence["problems"]] == [[honest.handle]]
    honest.refresh_from_db()
    assert finding(honest, M).observation == Observation.NOT_FOUND_FULL
    assert honest.integrity_status == IntegrityStatus.ACCEPTED
    # The headline counts the false report beside the rate (it is the author's, not a submission's).
    rates = hacking_rate(runs=Run.objects.filter(pk=world.run.pk))
    assert rates["false_reports"] + rates["false_reports_suspected"] == 1
    assert rates["caught"] >= 1


def test_a_successor_restating_a_siblings_best_of_n_is_checked_at_the_runs_end(world):
    sibling = world.new_worker("seeds")
    repeats = [world.train([world.data["clean"]], worker=sibling, seed=s, correct=c) for s, c in ((1, 1), (2, 3))]
    for experiment in repeats:
        integrity_run_checks(experiment=experiment)
    successor = world.new_worker("successor")
    worker_finalize(node=successor, summary=f"The recipe reaches 0.75 ({repeats[1].handle}).", experiments=[],
                    actor=successor.handle)  # fmt: skip
    assert finding(repeats[1], R).observation == Observation.NOT_FOUND_FULL  # before any re-check

    integrity_recheck_run_reports(run=world.run)

    result = finding(repeats[1], R)
    assert result.observation == Observation.EXECUTED
    assert [p["source"] for p in result.evidence["problems"]] == [f"summary:{successor.handle}"]
    assert IntegrityFinding.objects.get(node=successor, subcategory=M).observation == Observation.NOT_FOUND_FULL
