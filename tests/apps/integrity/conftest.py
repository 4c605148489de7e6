"""A small, real world for the integrity checks: a sealed benchmark, θ0 with a real tokenizer,
datapool entries, and experiments driven through the real job and pipeline services.

Only the accelerator work is replaced: instead of a training runner, a test writes the output
checkpoint folder (θ0's files with other weight bytes, plus whatever the test plants) and hands it
to ``job_succeed_with_checkpoint``; instead of generation, it hands chosen outputs to
``job_succeed_with_evaluation``. Everything else — checkpoint registration, lineage, data usage,
evaluation records, experiment status — is the production code path.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import benchmark_load_sealed, benchmark_register, minibench_install
from apps.core.hashing import sha256_tree
from apps.datapool.services import data_register_from_catalog, data_register_from_workspace
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.choices import ExperimentKind
from apps.experiments.models import Checkpoint, Experiment
from apps.experiments.services import checkpoint_register, experiment_create, manifest_digest
from apps.flows.pipeline import experiment_start
from apps.integrity.choices import Subcategory
from apps.integrity.models import IntegrityFinding
from apps.integrity.services import integrity_run_checks
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_succeed_with_checkpoint, job_succeed_with_evaluation
from apps.research.choices import NodeKind
from apps.research.models import ResearchNode, Run
from apps.research.services import node_create
from tests.apps.integrity.contamination_variants import install_minibench_task
from tests.factories import make_run

TEMPLATE = "Question: {question}\nAnswer:"
FEEDBACK = [
    ("f1", "Lena keeps 37 marbles in a jar and buys 45 more at the corner shop. How many marbles now?", "82"),
    ("f2", "A farmer plants 58 trees along the river and another 26 trees by the barn. How many trees?", "84"),
    ("f3", "Omar reads 19 pages on Monday and 64 pages on Tuesday of his long novel. How many pages?", "83"),
    ("f4", "A baker fills 27 trays in the morning and 35 trays after lunch today. How many trays?", "62"),
]
FINAL = [
    ("x1", "The library lends 71 books in the morning and 18 books in the evening today. How many books?", "89"),
    ("x2", "Priya walks 33 blocks to school and 48 blocks to the park after class. How many blocks in all?", "81"),
]
ANSWERS = {i: a for i, _, a in FEEDBACK + FINAL}
CLEAN_ROWS = [
    {
        "prompt": f"Question: A shop sells {a} pens and then {b} more pens to a school. How many pens?\nAnswer:",
        "completion": f" {a + b}",
    }
    for a, b in [(11, 12), (13, 14), (15, 16), (21, 22), (23, 24), (25, 26), (31, 32), (41, 42)]
]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def theta0_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """θ0's files as a trainer would see them: a real (tiny) tokenizer saved by transformers, a
    generation config, a model config and weight bytes. Built once per session."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: PLC0415 - heavy, fixture only
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - heavy, fixture only

    out = tmp_path_factory.mktemp("theta0")
    words = ["<pad>", "<s>", "</s>", "<unk>", "Question", ":", "Answer", "How", "many", "?", "User", "Assistant"]
    words += [str(n) for n in range(200)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": 1,
                "eos_token_id": 2,
                "pad_token_id": 0,
                "do_sample": False,
                "transformers_version": "5.0.0",
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    (out / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(words)}), encoding="utf-8")
    (out / "model.safetensors").write_bytes(b"theta0-weights" * 64)
    return out


@pytest.fixture
def roots(settings, tmp_path: Path) -> dict[str, Path]:
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.ARTIFACT_CACHE_DIR = str(tmp_path / "artifact-cache")
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    settings.WORKSPACE_ROOT = str(tmp_path / "workspaces")
    task = tmp_path / "task"
    task.mkdir()
    (task / "task.json").write_text(
        json.dumps(
            {
                "name": "arithmetic",
                "evaluator": "exact_match",
                "description": "addition",
                "prompt_template": TEMPLATE,
                "decoding": {"max_new_tokens": 8, "do_sample": False},
                "stop": ["\n"],
                "use_chat_template": False,
            }
        ),
        encoding="utf-8",
    )
    write_jsonl(task / "feedback.jsonl", [{"id": i, "prompt": q, "answer": a} for i, q, a in FEEDBACK])
    write_jsonl(task / "final.jsonl", [{"id": i, "prompt": q, "answer": a} for i, q, a in FINAL])
    return {"task": task, "tmp": tmp_path, "workspace": tmp_path / "workspace"}


def store_checkpoint(directory: Path, **register: Any) -> Checkpoint:
    """Put a folder into the artifact store under its manifest digest and register it."""
    manifest = sha256_tree(directory)
    uri = artifact_store().put_dir(directory, key=checkpoint_key(manifest_digest(manifest)))
    return checkpoint_register(uri=uri, manifest=manifest, **register)


def checkpoint_path(checkpoint: Checkpoint) -> Path:
    """The local folder of a stored checkpoint (the tests' artifact store is a local folder)."""
    return artifact_store().local_path(checkpoint.uri)


@dataclass
class World:
    run: Run
    benchmark: Any
    theta0: Checkpoint
    main: ResearchNode
    worker: ResearchNode
    roots: dict[str, Path]
    template: Path
    data: dict[str, str] = field(default_factory=dict)
    _seq: int = 0

    # --- setup helpers ---------------------------------------------------------------------------

    def new_worker(self, task: str = "another direction") -> ResearchNode:
        return node_create(run=self.run, kind=NodeKind.WORKER, task=task)

    def add_data(self, name: str, rows: list[dict[str, Any]], *, teacher: str = "") -> str:
        workspace = self.roots["workspace"]
        write_jsonl(workspace / f"{name}.jsonl", rows)
        entry = data_register_from_workspace(
            workspace=workspace, path=f"{name}.jsonl", name=name, run=self.run, node=self.worker, teacher=teacher
        )
        self.data[name] = entry.handle
        return entry.handle

    def set_policy(self, **policy: Any) -> None:
        run = Run.objects.get(pk=self.run.pk)
        run.policy = {**run.policy, **policy}
        run.save(update_fields=["policy", "updated_at"])
        self.run = run

    # --- driving the pipeline --------------------------------------------------------------------

    def _claim(self, experiment: Experiment, kind: str) -> Job:
        job = Job.objects.filter(experiment=experiment, kind=kind, status=JobStatus.QUEUED).order_by("-pk").first()
        assert job is not None, f"no queued {kind} job for {experiment.handle}"
        claimed = job_claim(job_id=job.pk, worker="test-host:1")
        assert claimed is not None
        return claimed

    def train(
        self,
        datasets: list[str],
        *,
        worker: ResearchNode | None = None,
        input_checkpoint: Checkpoint | None = None,
        seed: int = 0,
        plant: Callable[[Path], None] | None = None,
        correct: int | None = None,
        evaluate: bool = True,
        outputs: dict[str, str] | None = None,
        hyperparameters: dict[str, Any] | None = None,
        action_extra: dict[str, Any] | None = None,
    ) -> Experiment:
        """One train_eval submission through the real pipeline: train job → θ_out registered →
        evaluation job → evaluation recorded. ``plant`` edits θ_out's folder before it is stored
        (what the trainer wrote); ``correct`` answers that many feedback samples right."""
        self._seq += 1
        parent = input_checkpoint or self.theta0
        hyper = {"recipe": "sft", "max_steps": 10, "batch_size": 4, "seed": seed, **(hyperparameters or {})}
        experiment = experiment_create(
            run=self.run,
            owner=worker or self.worker,
            kind=ExperimentKind.TRAIN_EVAL,
            input_checkpoint=parent,
            action={"data": datasets, "hyperparameters": hyper, "eval": {"split": "feedback"}, **(action_extra or {})},
        )
        experiment_start(experiment=experiment)
        job = self._claim(experiment, JobKind.TRAIN)
        out = self.roots["tmp"] / f"trained-{self._seq}"
        shutil.copytree(checkpoint_path(parent), out)
        (out / "model.safetensors").write_bytes(f"weights of {experiment.handle} seed {seed}".encode() * 64)
        if plant is not None:
            plant(out)
        job_succeed_with_checkpoint(job=job, checkpoint_dir=out, parent=parent, result={"steps": 10})
        experiment.refresh_from_db()
        if evaluate:
            self.evaluate(experiment, correct=correct, outputs=outputs)
        return Experiment.objects.get(pk=experiment.pk)

    def evaluate(
        self,
        experiment: Experiment,
        *,
        correct: int | None = None,
        outputs: dict[str, str] | None = None,
        drop: tuple[str, ...] = (),
        verdicts: dict[str, bool] | None = None,
        seal: dict[str, Any] | None = None,
    ) -> Experiment:
        """Record the feedback evaluation the pipeline queued: the first ``correct`` samples answered
        right (all by default), ``outputs`` overriding texts, ``verdicts`` overriding recorded verdicts."""
        job = self._claim(experiment, JobKind.EVALUATE)
        ids = [i for i, _, _ in FEEDBACK]
        n_right = len(ids) if correct is None else correct
        rows = []
        for index, sid in enumerate(ids):
            if sid in drop:
                continue
            text = (outputs or {}).get(sid, ANSWERS[sid] if index < n_right else "0")
            verdict = (verdicts or {}).get(sid, text.strip() == ANSWERS[sid])
            rows.append({"id": sid, "output": text, "correct": verdict})
        checkpoint = Checkpoint.objects.get(uuid=job.spec["checkpoint"])
        _, settings = benchmark_load_sealed(benchmark=self.benchmark, split="feedback")
        job_succeed_with_evaluation(
            job=job,
            checkpoint=checkpoint,
            benchmark=self.benchmark,
            split="feedback",
            rows=rows,
            backend="hf",
            seal={**settings["seal"], **(seal or {})},
        )
        return Experiment.objects.get(pk=experiment.pk)

    def eval_only(self, checkpoint: Checkpoint, *, worker: ResearchNode | None = None, **evaluate: Any) -> Experiment:
        experiment = experiment_create(
            run=self.run,
            owner=worker or self.worker,
            kind=ExperimentKind.EVAL_ONLY,
            input_checkpoint=checkpoint,
            action={"eval": {"split": "feedback"}},
        )
        experiment_start(experiment=experiment)
        return self.evaluate(experiment, **evaluate)


def build_world(roots: dict[str, Path], template: Path, **policy: Any) -> World:
    benchmark = benchmark_register(name="test/arith", task_dir=roots["task"])
    theta0 = store_checkpoint(template, handle=f"theta0-{roots['tmp'].name}"[:64], is_base=True)
    run = make_run(benchmark=benchmark, base_checkpoint=theta0, policy=policy, max_parallel_workers=20)
    main = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
    worker = node_create(run=run, kind=NodeKind.WORKER, task="sft on clean data")
    world = World(run=run, benchmark=benchmark, theta0=theta0, main=main, worker=worker, roots=roots, template=template)
    world.add_data("clean", CLEAN_ROWS)
    return world


@pytest.fixture
def world(db, roots, theta0_template) -> World:
    return build_world(roots, theta0_template)


def finding(experiment: Experiment, subcategory: str) -> Any:
    return IntegrityFinding.objects.get(experiment=experiment, subcategory=subcategory)


@pytest.fixture(scope="session")
def minibench(tmp_path_factory):
    """The shared ci minibench (tests/support/minibench.py)."""
    from tests.support.minibench import ci_minibench  # noqa: PLC0415 - heavy (torch), fixture only

    return ci_minibench(tmp_path_factory)


@pytest.fixture
def mb_world(db, roots, theta0_template, minibench):
    """The integrity world with the built minibench's arithmetic task (200 sealed items) as its benchmark."""
    install_minibench_task(roots, minibench)
    world = build_world(roots, theta0_template)
    world.minibench = minibench
    return world


# --------------------------------------------------------------------------- teacher detection
# The built minibench: its arithmetic reference is the teacher a distiller would use.

REFERENCE = "minibench/arithmetic/reference"


@pytest.fixture(scope="session")
def minibench_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.minibench import ci_minibench  # noqa: PLC0415 - heavy (torch), fixture only

    return ci_minibench(tmp_path_factory)


@pytest.fixture(scope="session")
def reference_outputs(minibench_root: Path) -> Callable[[list[str]], list[str]]:
    """The arithmetic reference's greedy outputs on prompts, under the task's decoding: what a
    distiller gets from it (the catalog prompts are already rendered in the task's template)."""
    manifest = json.loads((minibench_root / "manifest.json").read_text())
    return model_outputs(minibench_root / manifest["references"]["arithmetic"], minibench_root)


def model_outputs(model_dir: Path, minibench_root: Path) -> Callable[[list[str]], list[str]]:
    """A model's greedy outputs on prompts through the project's inference function, under the
    arithmetic task's decoding (what a distiller running it offline gets)."""
    from apps.ml.checkpoints import load_checkpoint  # noqa: PLC0415 - heavy, fixture only
    from apps.ml.inference import generate_texts, uses_special_tokens  # noqa: PLC0415

    task = json.loads((minibench_root / "tasks" / "arithmetic" / "task.json").read_text())
    model, tokenizer = load_checkpoint(model_dir)

    def outputs(prompts: list[str]) -> list[str]:
        return generate_texts(
            model,
            tokenizer,
            prompts,
            max_new_tokens=int(task["decoding"]["max_new_tokens"]),
            stop=task["stop"],
            add_special_tokens=uses_special_tokens(task),
        )

    return outputs


@pytest.fixture
def minibench_world(db, roots, minibench_root, settings) -> World:
    """The built minibench installed (θ0, the arithmetic benchmark and its sealed reference), a run
    on it, and the catalog sets a Worker registered: curated answers for their prompts."""
    settings.MINIBENCH_ROOT = str(minibench_root)
    installed = minibench_install(root=minibench_root)
    benchmark = Benchmark.objects.get(name="minibench/arithmetic")
    theta0 = Checkpoint.objects.get(handle=installed["theta0"])
    run = make_run(benchmark=benchmark, base_checkpoint=theta0, max_parallel_workers=20)
    main = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
    worker = node_create(run=run, kind=NodeKind.WORKER, task="sft")
    world = World(
        run=run, benchmark=benchmark, theta0=theta0, main=main, worker=worker, roots=roots, template=Path(".")
    )
    for name in ("arithmetic-irrelevant", "arithmetic-clean"):
        entry = data_register_from_catalog(catalog_root=minibench_root / "catalog", dataset=name, run=run, node=worker)
        world.data[name] = entry.handle
    return world


def teacher_finding(world: World, handle: str) -> Any:
    """Train on ``handle`` in ``world`` (the pipeline; no evaluation) and run the teacher check."""
    experiment = world.train([handle], evaluate=False)
    integrity_run_checks(experiment=experiment, subcategories=(Subcategory.TEACHER_AUTHORIZATION,))
    return finding(experiment, Subcategory.TEACHER_AUTHORIZATION)
