"""Cost of the teacher check (apps.integrity.teacher) per submission, cold and cached.

    RSI_MINIBENCH_CACHE=<built ci minibench> .venv/bin/python bench/teacher_check.py [--candidates 1,4 --rows 64]

On its own PostgreSQL database (re-created) and folders under $BENCH_DIR: the built ci minibench
installed (θ0, the arithmetic benchmark and its sealed reference), the catalog's arithmetic sets
registered (the curated labels), and a run. For each candidate count K, K - 1 more candidates are
registered beside the reference (copies of its weights under another manifest: each is loaded and
run like a distinct model). Then, per K:

- **cold**: a dataset of ``--rows`` off-catalog prompts nobody ran yet, submitted for training;
  the check runs every candidate on the sampled prompts (one load each, batched generation);
- **cached**: another dataset on the same prompts (other completions): every output is read back.

Each figure is the wall time of the teacher-authorization check on one submission
(``integrity_run_checks(subcategories=(teacher_authorization,))``: the job body, in-process),
the median of ``--repeat`` submissions.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _setup import django_on_bench_db, minibench_stack_folders

LEADS = ("{name} counted", "{name} saw", "A crate packed", "The team stacked", "Grandma baked")
VERBS = ("spotted", "received", "carried", "noticed", "stored")
NAMES = ("Ada", "Bo", "Cleo", "Dev", "Eli", "Fay")
THINGS = ("apples", "books", "coins", "pens", "cards")


def prompts(rng: random.Random, n: int) -> list[tuple[str, int]]:
    found: dict[str, int] = {}
    while len(found) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        things = rng.choice(THINGS)
        lead = rng.choice(LEADS).format(name=rng.choice(NAMES))
        question = f"{lead} {a} {things} and {rng.choice(VERBS)} {b} more. How many {things} in total?"
        found[f"Question: {question}\nAnswer:"] = a + b
    return list(found.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", default="1,4", help="candidate counts to measure (comma-separated)")
    parser.add_argument("--rows", type=int, default=64, help="rows per dataset (the sample bound is 64)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cache, base = minibench_stack_folders(tempfile.mkdtemp(prefix="rsiweb-bench-teacher-"))
    django_on_bench_db("rsiweb_bench_teacher")

    from django.conf import settings

    from apps.benchmarks.models import Benchmark
    from apps.benchmarks.services import minibench_install
    from apps.core.hashing import sha256_tree
    from apps.datapool.services import data_register_from_catalog, data_register_from_workspace
    from apps.datapool.storage import artifact_store, checkpoint_key
    from apps.experiments.choices import ExperimentKind
    from apps.experiments.models import Checkpoint
    from apps.experiments.services import checkpoint_register, experiment_create, manifest_digest
    from apps.flows.pipeline import experiment_start
    from apps.integrity import teacher
    from apps.integrity.choices import Subcategory
    from apps.integrity.services import integrity_run_checks
    from apps.research.choices import NodeKind
    from apps.research.services import node_create
    from tests.factories import make_run

    root = Path(cache)
    installed = minibench_install(root=root)
    benchmark = Benchmark.objects.get(name="minibench/arithmetic")
    theta0 = Checkpoint.objects.get(handle=installed["theta0"])
    run = make_run(benchmark=benchmark, base_checkpoint=theta0, max_parallel_workers=50)
    worker = node_create(run=run, kind=NodeKind.WORKER, task="sft")
    for name in ("arithmetic-irrelevant", "arithmetic-clean"):
        data_register_from_catalog(catalog_root=root / "catalog", dataset=name, run=run, node=worker)
    reference_dir = root / json.loads((root / "manifest.json").read_text())["references"]["arithmetic"]
    workspace = Path(settings.WORKSPACE_ROOT) / "bench"
    workspace.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    seq = 0

    def submit(rows: list[dict[str, str]]) -> float:
        return check(rows)[0]

    def check(rows: list[dict[str, str]]) -> tuple[float, dict]:
        nonlocal seq
        seq += 1
        (workspace / f"d{seq}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        entry = data_register_from_workspace(workspace=workspace, path=f"d{seq}.jsonl", name=f"d{seq}", run=run,
                                             node=worker)  # fmt: skip
        experiment = experiment_create(
            run=run, owner=worker, kind=ExperimentKind.TRAIN_EVAL, input_checkpoint=theta0,
            action={"data": [entry.handle], "hyperparameters": {"recipe": "sft", "max_steps": 10, "seed": seq},
                    "eval": {"split": "feedback"}},
        )  # fmt: skip
        experiment_start(experiment=experiment)
        started = time.perf_counter()
        (found,) = integrity_run_checks(experiment=experiment, subcategories=(Subcategory.TEACHER_AUTHORIZATION,))
        elapsed = time.perf_counter() - started
        assert found.evidence["detection"]["comparisons"], found.evidence
        return elapsed, found.evidence["detection"]

    extra = 0
    print(f"teacher check per submission, {args.rows} rows per dataset, sample bound {teacher.max_rows()}")
    print(f"{'candidates':>10} | {'cold s':>7} | {'cached s':>8} | {'cold/cached':>11}")
    for k in [int(x) for x in args.candidates.split(",")]:
        settings.RSI_TEACHER_MAX_CANDIDATES = k
        while extra < k - 1:
            extra += 1
            copy = base / "copies" / f"other-{extra}"  # removed with the bench's folder at the end
            shutil.copytree(reference_dir, copy)
            config = copy / "generation_config.json"
            config.write_text(config.read_text() + "\n" * extra)  # another manifest, the same model
            manifest = sha256_tree(copy)
            uri = artifact_store().put_dir(copy, key=checkpoint_key(manifest_digest(manifest)))
            checkpoint_register(uri=uri, manifest=manifest, handle=f"bench/other-{extra}", is_base=True)
        cold, warm = [], []
        for _ in range(args.repeat):
            batch = prompts(rng, args.rows)
            cold.append(submit([{"prompt": p, "completion": f" {s}"} for p, s in batch]))
            warm.append(submit([{"prompt": p, "completion": f" {s + 1}"} for p, s in batch[::-1]]))
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"{k:>10} | {c:>7.2f} | {w:>8.2f} | {c / w:>10.1f}x")

    # The open-row rule's threshold against honest and distilled data (the reference only).
    settings.RSI_TEACHER_MAX_CANDIDATES = 1
    from apps.ml.checkpoints import load_checkpoint
    from apps.ml.inference import generate_texts

    model, tokenizer = load_checkpoint(reference_dir)
    task = benchmark.settings

    def distil(batch: list[str]) -> list[str]:
        return generate_texts(model, tokenizer, batch, max_new_tokens=int(task["decoding"]["max_new_tokens"]),
                              stop=task["stop"])  # fmt: skip

    clean = [json.loads(line) for line in (root / "catalog" / "arithmetic-clean" / "data.jsonl").open()]
    noisy = [json.loads(line) for line in (root / "catalog" / "arithmetic-noisy" / "data.jsonl").open()]
    fresh = prompts(random.Random(11), args.rows)
    outs = distil([p for p, _ in fresh])
    corpus = {
        "honest: sums by hand, off-catalog prompts": [{"prompt": p, "completion": f" {x}"} for p, x in fresh],
        "honest: catalog rows in a Worker's file": clean[3000 : 3000 + args.rows],
        "honest: noisy set corrected by hand": [
            {"prompt": r["prompt"], "completion": " " + str(sum(map(int, re.findall(r"[0-9]+", r["prompt"]))))}
            for r in noisy[: args.rows]
        ],
        "distilled: reference outputs, off-catalog": [
            {"prompt": p, "completion": o} for (p, _), o in zip(fresh, outs, strict=True)
        ],
        "distilled: 90 % outputs + 10 % sums by hand": [
            {"prompt": p, "completion": o if i % 10 else f" {x}"}
            for i, ((p, x), o) in enumerate(zip(fresh, outs, strict=True))
        ],
    }
    print()
    print(f"{'dataset':<45} | {'open rows':>9} | {'agree':>5} | {'share':>5} | reported")
    for label, rows in corpus.items():
        _, detection = check(rows)
        (c,) = [c for c in detection["comparisons"] if c["teacher"] == "minibench/arithmetic/reference"]
        print(f"{label:<45} | {c['open_rows']:>9} | {c['open_agreement']:>5} | {c['open_share']:>5.2f} | "
              f"{','.join(c['rules']) or 'no'}")  # fmt: skip
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
