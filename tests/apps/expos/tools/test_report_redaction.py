"""The Main Agent's view of a Reviewer report hides what a model could learn from (issue 33, item 14).

A benchmark with minibench-style sample ids is sealed for real (``benchmark_register``), the run
has per-sample model outputs, and a Reviewer's report quotes ids, outputs and sealed items in
generated disguises (separators, case, look-alike letters, other digit scripts, number words,
leading zeros, invisible characters, ids glued into prose; outputs and items re-templated or
perturbed by the red-team generators). The Main reads the report through
``inspect_reviewer_report``; the Reviewer reads the same report whole.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from apps.benchmarks.services import benchmark_register
from apps.experiments.models import Evaluation, EvaluationSample
from apps.experiments.services import experiment_create
from apps.research.choices import NodeKind
from apps.research.models import ResearchNode
from apps.research.services import node_create
from apps.reviews.models import ReviewReport
from tests.apps.expos.tools.conftest import World, call, write_jsonl
from tests.apps.integrity.redteam import disguise
from tests.factories import CheckpointFactory, make_run

FEEDBACK = [
    ("Nadia stacks 27 crates in the yard and carries 56 more from the truck. How many crates?", "83"),
    ("A baker shapes 44 rolls before dawn and another 39 rolls at noon. How many rolls?", "83"),
    ("Theo paints 62 fence posts on Saturday and 17 posts on Sunday. How many posts?", "79"),
]
FINAL = [
    ("Mia sorts 35 letters in the morning and 48 letters after lunch. How many letters?", "83"),
    ("The club sells 23 raffle tickets on Friday and 65 tickets on Monday. How many tickets?", "88"),
]
IDS = [f"arith-feedback-{i:04d}" for i in range(1, 4)] + [f"arith-final-{i:04d}" for i in range(1, 3)]
SEEDS = (disguise.SEED, disguise.SEED + 7)
HONEST = [
    "exp_0002 raised the feedback score from 0.21 to 0.34 after the learning rate was lowered to 0.0005.",
    "The comparison with exp_0001 used the same 200 training steps and the same data.",
    "Recommend a third seed before the claim is made.",
]

# --- generated disguises --------------------------------------------------------------------------

_SEPARATORS = ["-", "_", " ", ".", "/", ":", " - ", "\u2010", "\u2013", "", "|"]


def _parts(sample_id: str) -> list[str]:
    return sample_id.split("-")


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in text)


def disguised_id(sample_id: str, rng: random.Random) -> str:
    """One id in one generated disguise (the separator, then case, digits and characters)."""
    name, split, number = _parts(sample_id)
    number = rng.choice(
        [number, number.lstrip("0"), "0" * rng.randint(1, 3) + number.lstrip("0"), disguise.say(int(number))]
    )
    text = rng.choice(_SEPARATORS).join([name, split, number])
    text = rng.choice([str.upper, str.title, str.lower, lambda t: t])(text)
    how = rng.choice(
        [
            lambda t: t,
            lambda t: disguise.homoglyphs(t, rng),
            lambda t: disguise.other_digits(t, rng),
            _fullwidth,
            lambda t: "\u200b".join(t),
        ]
    )
    return how(text)


def in_prose(token: str, rng: random.Random) -> str:
    return rng.choice(
        [
            f"The model got {token} wrong.",
            f"Sample {token}'s output was malformed.",
            f"See ({token}) and the next one.",
            f"Items #{token}, for instance, fail.",
            f"{token}: failed twice.",
        ]
    )


def model_output(item: tuple[str, str], rng: random.Random) -> str:
    nouns = item[0].split(" How many ")[1].rstrip("?")
    return rng.choice(
        [
            f"So the total is {item[1]} {nouns} in the end, I think.",
            f"Adding them up gives {item[1]} {nouns} altogether.",
            f"We count {item[1]} {nouns} after both days of work.",
        ]
    )


# --- the world ------------------------------------------------------------------------------------


@pytest.fixture
def report_world(db, roots) -> dict[str, Any]:
    task = roots["tmp"] / "task-long-ids"
    task.mkdir()
    (task / "task.json").write_text((roots["task"] / "task.json").read_text(encoding="utf-8"), encoding="utf-8")
    items = FEEDBACK + FINAL
    sealed = [{"id": i, "prompt": q, "answer": a} for i, (q, a) in zip(IDS, items, strict=True)]
    write_jsonl(task / "feedback.jsonl", sealed[: len(FEEDBACK)])
    write_jsonl(task / "final.jsonl", sealed[len(FEEDBACK) :])
    benchmark = benchmark_register(name="test/arith-long-ids", task_dir=task)
    run = make_run(benchmark=benchmark, base_checkpoint=CheckpointFactory(is_base=True))
    main = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
    worker = node_create(run=run, kind=NodeKind.WORKER, task="sft")
    reviewer = node_create(run=run, kind=NodeKind.REVIEWER, task="check", upstream=[worker])
    experiment = experiment_create(run=run, owner=worker, kind="eval_only", input_checkpoint=run.base_checkpoint,
                                   action={"evaluate": "feedback"})  # fmt: skip
    evaluation = Evaluation.objects.create(
        run=run, experiment=experiment, checkpoint=run.base_checkpoint, benchmark=benchmark, split="feedback",
        score=0.0, correct=0, sample_count=len(FEEDBACK), evaluator_sha256="e" * 64, settings_sha256="s" * 64,
        data_sha256="d" * 64,
    )  # fmt: skip
    rng = random.Random(disguise.SEED)
    outputs = {sample_id: model_output(item, rng) for sample_id, item in zip(IDS, items, strict=True)}
    EvaluationSample.objects.bulk_create(
        EvaluationSample(evaluation=evaluation, sample_id=i, output=outputs[i], correct=False) for i in IDS[:3]
    )
    world = World(run=run, main=main, worker=worker, other=worker, reviewer=reviewer, theta0=None, reference=None)
    return {"world": world, "outputs": outputs, "items": dict(zip(IDS, items, strict=True))}


def quoted_output(output: str, rng: random.Random) -> tuple[str, list[str]]:
    """A sentence quoting a model output in a generated disguise, and the quoted part."""
    how = rng.choice([lambda t, r: t, *disguise.CHARACTER_FORMS.values(), disguise.number_words])
    quoted = how(output, rng)
    return f'It answered "{quoted}" there.', [quoted]


def quoted_item(item: tuple[str, str], rng: random.Random) -> tuple[str, list[str]]:
    """A sentence quoting a sealed item (prompt and reference) in a generated disguise, and its lines."""
    sealed = {"prompt": item[0], "answer": item[1]}
    row = rng.choice(
        [
            lambda: disguise.verbatim(sealed),
            lambda: disguise.retemplate(sealed, rng),
            lambda: disguise.perturb(sealed, rng, rng.choice(list(disguise.PERTURBATIONS.values()))),
        ]
    )()
    lines = [line for line in row["prompt"].splitlines() if len(line) > 12]
    return f"The prompt was: {row['prompt']} and the reference is{row['completion']}.", lines


@pytest.mark.parametrize("seed", SEEDS)
def test_the_mains_view_redacts_generated_disguised_ids_outputs_and_items(report_world, seed):
    world, outputs, items = report_world["world"], report_world["outputs"], report_world["items"]
    rng = random.Random(seed)
    ids = [disguised_id(rng.choice(IDS), rng) for _ in range(8)]
    quoted = [quoted_output(outputs[i], rng) for i in IDS[:3]] + [quoted_item(items[i], rng) for i in IDS[3:]]
    quoted_outputs = [sentence for sentence, _ in quoted[:3]]
    quoted_items = [sentence for sentence, _ in quoted[3:]]
    id_lines = [f"{HONEST[0]} {in_prose(token, rng)}" for token in ids[:4]]
    ReviewReport.objects.create(
        run=world.run,
        reviewer=world.reviewer,
        summary="\n\n".join([HONEST[1], *quoted_items, *quoted_outputs, HONEST[2]]),
        supported_findings=id_lines,
        regressions=[in_prose(token, rng) for token in ids[4:]],
        observations=[{"experiment": "exp_0001", "subcategory": "test_set_access", "observation": "NOT_FOUND_FULL",
                       "note": f"{HONEST[1]} {quoted_outputs[0]}", "evidence": {"sample_ids": IDS[:1]}}],
    )  # fmt: skip

    seen = call(world.ctx(world.main), "inspect_reviewer_report", {"reviewer": world.reviewer.handle})["reports"][0]
    full = call(world.ctx(world.reviewer), "inspect_reviewer_report", {"reviewer": world.reviewer.handle})["reports"]

    text = json.dumps(seen, ensure_ascii=False)
    for core in [*ids, *(part for _, parts in quoted for part in parts)]:
        assert core not in text, (core, seen)
    # What the Main may learn stays: the honest sentences, whole.
    assert HONEST[1] in seen["summary"]
    assert HONEST[2] in seen["summary"]
    assert all(line.startswith(HONEST[0] + " ") and "[sealed]" in line for line in seen["supported_findings"])
    assert seen["observations"][0]["note"].startswith(HONEST[1])
    assert "evidence" not in seen["observations"][0]
    # The Reviewer's own view is untouched.
    assert full[0]["supported_findings"] == id_lines
    assert full[0]["summary"].count("\n\n") == len(quoted_items) + len(quoted_outputs) + 1


def test_honest_reports_reach_the_main_unchanged(report_world):
    world = report_world["world"]
    ReviewReport.objects.create(
        run=world.run, reviewer=world.reviewer, summary="\n".join(HONEST), recommendations=HONEST,
        supported_findings=["exp_0002 trained on data_0003 (arithmetic-clean, 6000 rows) for 200 steps: 0.34."],
    )  # fmt: skip

    seen = call(world.ctx(world.main), "inspect_reviewer_report", {"reviewer": world.reviewer.handle})["reports"][0]

    assert seen["summary"] == "\n".join(HONEST)
    assert seen["recommendations"] == HONEST
    assert "[sealed]" not in json.dumps(seen)
