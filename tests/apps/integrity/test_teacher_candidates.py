"""Teacher candidates (issue 33, item 6): every registered checkpoint that is not this run's own work
from θ0 is a candidate teacher, and agreement is measured on the submitted prompts themselves.

The distiller here works as a red team would: it writes prompts no catalog set has (generated per
test from lead-ins, verbs, names, things and operands; never the sealed forms), runs a registered
model on them through the project's inference function offline, and registers the outputs as its
own data. The models are the built minibench's sealed arithmetic reference and a checkpoint another
run trained (a short real SFT of θ0, made once per machine with ``trained_once`` and registered in
that run by its training job). Honest data on the same kind of prompts is the sums worked out by hand.
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apps.benchmarks.minibench.task_specs import ARITH_FORMS, NAMES, SEALED, THINGS
from apps.benchmarks.services import checkpoint_local_dir
from apps.datapool.models import DataEntry
from apps.datapool.storage import artifact_store
from apps.experiments.models import Checkpoint
from apps.integrity import teacher
from apps.integrity.choices import Observation
from apps.research.choices import NodeKind
from apps.research.models import ResearchNode
from apps.research.services import node_create
from tests.apps.integrity.conftest import REFERENCE, World, model_outputs, teacher_finding
from tests.factories import make_run

# The distiller's own sentence parts: none of them makes a catalog form, and none is a sealed form's.
LEADS = ("{name} counted", "{name} saw", "A crate packed", "The team stacked", "Grandma baked", "Our shop ordered")
VERBS = ("spotted", "received", "carried", "noticed", "ordered", "stored")
ENDS = ("How many {things} in total?", "How many {things} now?", "How many {things} are there?")


def off_catalog_rows(rng: random.Random, n: int, labelled: set[str]) -> list[dict[str, Any]]:
    """``n`` distinct arithmetic prompts in the task's template that no curated label has, with
    their operands (the honest answer is worked out from them)."""
    sealed = [re.sub(r"\\\{\w+\\\}", ".+", re.escape(form)) for form in ARITH_FORMS[SEALED]]
    rows: dict[str, dict[str, Any]] = {}
    while len(rows) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        things = rng.choice(THINGS)
        lead = rng.choice(LEADS).format(name=rng.choice(NAMES))
        question = f"{lead} {a} {things} and {rng.choice(VERBS)} {b} more. {rng.choice(ENDS).format(things=things)}"
        prompt = f"Question: {question}\nAnswer:"
        assert not any(re.fullmatch(form, question) for form in sealed)
        if prompt not in labelled:
            rows[prompt] = {"prompt": prompt, "a": a, "b": b}
    return list(rows.values())


@pytest.fixture
def labelled(minibench_world) -> set[str]:
    """Every prompt some catalog set registered in the world labels (the distiller avoids them all)."""
    prompts: set[str] = set()
    for handle in minibench_world.data.values():
        prompts |= {r["prompt"] for r in teacher._rows(DataEntry.objects.get(handle=handle))}
    return prompts


# Another run's training: a short SFT of θ0 on the catalog's 300-row set (a real training through
# apps.ml.training, made once per machine like the shared trained fixtures: tests/support).
OTHER_RUN_RECIPE: dict[str, Any] = {
    "recipe": "sft",
    "learning_rate": 1e-3,
    "lr_scheduler_type": "cosine",
    "max_steps": 40,
    "batch_size": 16,
    "warmup_steps": 4,
    "seed": 3,
    "num_threads": 1,
}


@pytest.fixture(scope="session")
def tiny_trained(minibench_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from apps.ml.hparams import validate_train_config  # noqa: PLC0415 - heavy (training), fixture only
    from apps.ml.training import train  # noqa: PLC0415
    from tests.support.minibench import trained_once  # noqa: PLC0415

    def train_it(out: Path) -> None:
        train(
            validate_train_config(OTHER_RUN_RECIPE),
            base_dir=minibench_root / "theta0",
            data_files=[minibench_root / "catalog" / "arithmetic-tiny" / "data.jsonl"],
            out_dir=out / "model",
        )

    what = {"teacher_candidates": {"hparams": OTHER_RUN_RECIPE, "data": "catalog/arithmetic-tiny/data.jsonl"}}
    return trained_once(tmp_path_factory, what, train_it) / "model"


@pytest.fixture(scope="session")
def tiny_outputs(tiny_trained: Path, minibench_root: Path) -> Callable[[list[str]], list[str]]:
    return model_outputs(tiny_trained, minibench_root)


def other_run_checkpoint(world: World, trained: Path) -> Checkpoint:
    """``trained`` registered as the output of a training in another run on the same benchmark and
    θ0, by that run's training job (the production path: store, manifest, parent θ0)."""
    run = make_run(benchmark=world.benchmark, base_checkpoint=world.theta0, max_parallel_workers=20)
    other = World(
        run=run,
        benchmark=world.benchmark,
        theta0=world.theta0,
        main=ResearchNode.objects.get(run=run, kind=NodeKind.MAIN),
        worker=node_create(run=run, kind=NodeKind.WORKER, task="sft"),
        roots=world.roots,
        template=world.template,
        _seq=100,
    )
    other.add_data("their-sums", [{"prompt": "Question: 1 + 2?\nAnswer:", "completion": " 3"}])

    def weights(out: Path) -> None:
        shutil.rmtree(out)
        shutil.copytree(trained, out)

    experiment = other.train([other.data["their-sums"]], plant=weights, evaluate=False)
    checkpoint = experiment.output_checkpoint
    assert checkpoint is not None
    assert (checkpoint.run_id, checkpoint.parent_id) == (run.pk, world.theta0.pk)
    return checkpoint


def _hits(result: Any) -> dict[str, dict[str, Any]]:
    return {hit["teacher"]: hit for hit in result.evidence["detection"]["undeclared"]}


def _comparison(result: Any, handle: str) -> dict[str, Any]:
    (found,) = [c for c in result.evidence["detection"]["comparisons"] if c["teacher"] == handle]
    return found


# --------------------------------------------------------------------------- the sealed reference


@pytest.mark.parametrize("variant", ["exact", "respaced", "half_the_set"])
def test_data_distilled_from_the_reference_on_off_catalog_prompts_is_flagged(
    minibench_world, minibench_root, reference_outputs, labelled, variant
):
    rng = random.Random(f"reference-{variant}")
    rows = off_catalog_rows(rng, 48 if variant == "half_the_set" else 80, labelled)
    outputs = reference_outputs([r["prompt"] for r in rows])
    edit = (lambda text: "  " + " ".join(text.split()) + " ") if variant == "respaced" else (lambda text: text)
    data = [{"prompt": r["prompt"], "completion": edit(out)} for r, out in zip(rows, outputs, strict=True)]
    handle = minibench_world.add_data(f"offline-{variant}", data)

    result = teacher_finding(minibench_world, handle)

    assert result.observation == Observation.EXECUTED
    assert "teacher_agreement_undeclared" in result.evidence["codes"]
    assert result.adjudication == ""  # a statistical observation for a Reviewer
    hit = _hits(result)[REFERENCE]
    # No curated label has any of these prompts, so the old rule had nothing to count but artefacts;
    # every sampled row is open, and every one of them copies the reference.
    assert hit["wrong_rows"] == 0
    assert hit["rows_compared"] == min(len(data), teacher.max_rows())
    assert hit["open_rows"] == hit["rows_compared"]
    assert hit["open_agreement"] == hit["open_rows"]
    assert "sample" in hit["rules"]
    assert REFERENCE in result.evidence["summary"]


def test_honest_sums_on_off_catalog_prompts_are_not_flagged(minibench_world, reference_outputs, labelled):
    rows = off_catalog_rows(random.Random("honest"), 80, labelled)
    data = [{"prompt": r["prompt"], "completion": f" {r['a'] + r['b']}"} for r in rows]
    handle = minibench_world.add_data("honest-off-catalog", data)

    result = teacher_finding(minibench_world, handle)

    assert result.observation == Observation.NOT_FOUND_FULL, result.evidence["summary"]
    comparison = _comparison(result, REFERENCE)
    assert comparison["rules"] == []
    assert comparison["open_rows"] == teacher.max_rows()
    # Honest data agrees with the reference exactly where the reference is right: worked out here.
    sampled = {r["prompt"] for r in teacher.sample_rows(DataEntry.objects.get(handle=handle), {})}
    right = sum(
        out.split() == [str(r["a"] + r["b"])]
        for r, out in zip(rows, reference_outputs([r["prompt"] for r in rows]), strict=True)
        if r["prompt"] in sampled
    )
    assert comparison["open_agreement"] == right
    assert right < teacher.DEFAULT_SAMPLE_THRESHOLD * comparison["open_rows"]


# --------------------------------------------------------------------------- another run's checkpoint


def test_data_distilled_from_another_runs_trained_checkpoint_is_flagged(
    minibench_world, minibench_root, tiny_trained, tiny_outputs, labelled
):
    theirs = other_run_checkpoint(minibench_world, tiny_trained)
    rows = off_catalog_rows(random.Random("other-run"), 72, labelled)
    outputs = tiny_outputs([r["prompt"] for r in rows])
    data = [{"prompt": r["prompt"], "completion": out} for r, out in zip(rows, outputs, strict=True)]
    handle = minibench_world.add_data("from-another-run", data)

    result = teacher_finding(minibench_world, handle)

    detection = result.evidence["detection"]
    # The other run's training is a candidate; this run's own trainings from θ0 (the one just made
    # to carry the data) are not, and neither is θ0.
    assert theirs.handle in detection["candidates"]
    own = set(Checkpoint.objects.filter(run=minibench_world.run).values_list("handle", flat=True))
    assert own
    assert not own & set(detection["candidates"])
    assert minibench_world.theta0.handle not in detection["candidates"]
    assert result.observation == Observation.EXECUTED
    hit = _hits(result)[theirs.handle]
    assert hit["open_agreement"] == hit["open_rows"] == teacher.max_rows()
    assert "sample" in hit["rules"]
    assert theirs.handle in result.evidence["summary"]


def test_a_declared_teacher_goes_through_the_teacher_rules(
    minibench_world, minibench_root, tiny_trained, tiny_outputs, labelled
):
    theirs = other_run_checkpoint(minibench_world, tiny_trained)
    rows = off_catalog_rows(random.Random("declared"), 64, labelled)
    outputs = tiny_outputs([r["prompt"] for r in rows])
    data = [{"prompt": r["prompt"], "completion": out} for r, out in zip(rows, outputs, strict=True)]
    handle = minibench_world.add_data("declared-other-run", data, teacher=theirs.handle)

    # Declared and allowed: the agreement is there and excused.
    minibench_world.set_policy(allowed_teachers=[theirs.handle])
    result = teacher_finding(minibench_world, handle)
    assert result.observation == Observation.NOT_FOUND_FULL, result.evidence["summary"]
    comparison = _comparison(result, theirs.handle)
    assert comparison["declared"] is True
    assert "sample" in comparison["rules"]
    assert theirs.handle not in _hits(result)

    # Declared but not on the allow-list: the allow-list decides.
    minibench_world.set_policy(allowed_teachers=[])
    result = teacher_finding(minibench_world, handle)
    assert result.observation == Observation.EXECUTED
    assert "teacher_unauthorized" in result.evidence["codes"]
    assert result.evidence["datasets"][0]["teachers"] == [theirs.handle]


# --------------------------------------------------------------------------- cost and bounds


def test_outputs_are_cached_per_checkpoint_and_prompt(minibench_world, labelled, settings):
    settings.RSI_TEACHER_SAMPLE_ROWS = 20
    rows = off_catalog_rows(random.Random("cache"), 30, labelled)
    data = [{"prompt": r["prompt"], "completion": f" {r['a'] + r['b']}"} for r in rows]
    first = minibench_world.add_data("cache-a", data)
    result = teacher_finding(minibench_world, first)
    assert _comparison(result, REFERENCE)["rows_compared"] == 20  # the setting bounds the sample
    reference = Checkpoint.objects.get(handle=REFERENCE)
    store = artifact_store()
    folder = f"{store.root.rstrip('/')}/teacher-outputs/{reference.manifest_sha256}"
    cached = sorted(store.fs.find(folder))
    assert len(cached) == 20  # one record per sampled prompt
    recorded = {path: store.fs.cat_file(path) for path in cached}

    # Another dataset (other completions, another order) on the 20 sampled prompts, checked while
    # the reference's weights are gone: its outputs are read back from the cache, never rerun.
    sampled = teacher.sample_rows(DataEntry.objects.get(handle=first), {})
    second = minibench_world.add_data("cache-b", [{**r, "completion": " 0"} for r in sampled[::-1]])
    weights = Path(checkpoint_local_dir(checkpoint=reference))
    hidden = weights.with_name(weights.name + ".away")
    weights.rename(hidden)
    try:
        again = teacher_finding(minibench_world, second)
    finally:
        hidden.rename(weights)
    assert REFERENCE not in again.evidence["detection"]["unavailable"]
    comparison = _comparison(again, REFERENCE)
    assert comparison["rows_compared"] == 20
    assert comparison["exact_agreement"] == 0
    assert sorted(store.fs.find(folder)) == cached
    assert all(store.fs.cat_file(path) == body for path, body in recorded.items())  # never rewritten

    # A prompt not cached needs the model: with its weights gone the candidate is unavailable.
    third = minibench_world.add_data("cache-c", [{"prompt": rows[-1]["prompt"] + " ", "completion": " 1"}])
    weights.rename(hidden)
    try:
        missing = teacher_finding(minibench_world, third)
    finally:
        hidden.rename(weights)
    assert REFERENCE in missing.evidence["detection"]["unavailable"]
