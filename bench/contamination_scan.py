"""Contamination scanner: recall and precision per layer on a planted set, throughput, honest-catalog false flags.

    .venv/bin/python bench/contamination_scan.py [--sealed 10000] [--rows 100000] [--per-class 300]
                                                 [--negatives 600] [--seed 11] [--workers 1] [--json]

Sealed items (10,000, the three minibench tasks in turn) and honest training rows come from the
minibench item generators with a seed the tests do not use (11); honest rows share no sealed
item's content. The planted set (``bench/contamination_planted.py``, written apart from the
canonicaliser) copies sealed items in seven disguises: verbatim, re-templated (another sentence
form, names, nouns, answer style and row shape), homoglyphs, invisible characters, number forms,
partial (only the content), and split 3 per dataset over 16 datasets. The hard negatives share
part of an item's content, or use a sealed item's sentence with new content: none may match.

Reported: recall per planted class and precision, for the full scanner and for each layer alone
(on the labelled rows plus an honest sample); scan throughput of the full scanner over all rows;
and the false flags over a whole honest catalog (``build_task_data`` for the same seed: every
dataset but the honeypot, against that task's sealed splits), with the honeypot's recall.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.benchmarks.minibench.catalog import build_task_data  # noqa: E402
from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE, TASKS  # noqa: E402
from apps.integrity.contamination import LAYERS, ContaminationScanner, Match  # noqa: E402
from bench import contamination_planted as planted  # noqa: E402

_WORKER_SCANNER: ContaminationScanner | None = None


def _scan_chunk(bounds: tuple[int, int, list[Any]]) -> list[Match]:
    start, _, rows = bounds
    assert _WORKER_SCANNER is not None
    return [Match(m.row_index + start, m.sample_id, m.kind, m.span, m.score) for m in _WORKER_SCANNER.scan(rows)]


def scan_parallel(scanner: ContaminationScanner, rows: list[Any], workers: int) -> list[Match]:
    """``scanner.scan(rows)``, over ``workers`` forked processes (the index is shared copy-on-write)."""
    global _WORKER_SCANNER
    if workers <= 1:
        return scanner.scan(rows)
    _WORKER_SCANNER = scanner
    size = -(-len(rows) // (workers * 4))
    chunks = [(i, i + size, rows[i : i + size]) for i in range(0, len(rows), size)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        parts = pool.map(_scan_chunk, chunks)
    return [m for part in parts for m in part]


def score(matches: list[Match], truth: dict[int, tuple[str, str | None]], rows: int) -> dict[str, Any]:
    """Recall per planted class (the row's own item found), precision over flagged rows, false flags."""
    found = {(m.row_index, m.sample_id) for m in matches}
    flagged = {m.row_index for m in matches}
    recall: dict[str, Any] = {}
    for cls in planted.PLANTED_CLASSES:
        labelled = [(i, sid) for i, (c, sid) in truth.items() if c == cls]
        if labelled:
            hits = sum((i, sid) in found for i, sid in labelled)
            recall[cls] = {"recall": round(hits / len(labelled), 4), "found": hits, "of": len(labelled)}
    true_rows = {i for i in flagged if i in truth and truth[i][1] is not None and (i, truth[i][1]) in found}
    false_rows = flagged - true_rows
    negatives = {cls: sum(1 for i in false_rows if truth.get(i, ("",))[0] == cls) for cls in planted.NEGATIVE_CLASSES}
    wrong_item = sum(1 for m in matches if m.row_index in truth and truth[m.row_index][1] not in (None, m.sample_id))
    return {
        "recall": recall,
        "precision": round(len(true_rows) / len(flagged), 4) if flagged else 1.0,
        "false_flag_rows": len(false_rows),
        "false_flags_on_negatives": negatives,
        "false_flags_on_honest": sum(1 for i in false_rows if i not in truth),
        "extra_items_on_planted_rows": wrong_item,
        "rows": rows,
    }


def catalog_false_flags(seed: int) -> dict[str, Any]:
    """Every non-honeypot dataset of the seed's catalog against its task's sealed splits.

    A flag on a row whose *question* is a sealed item's content (the v1 generators key multiple
    choice and calls by question text, so an honest row can ask a sealed question in its other
    form, or list its options in another order) is a content collision: a true match that the
    minibench v2 catalog rules out. Every other flag is false.
    """
    out: dict[str, Any] = {}
    for name, task in sorted(TASKS.items()):
        data = build_task_data(task, seed=seed, profile="full")
        sealed = [{**row, "evaluator": task.evaluator} for row in data.feedback + data.final]
        scanner = ContaminationScanner(sealed, templates=[task.prompt_template], evaluator=task.evaluator)
        sealed_content = {planted.content_of(name, r["prompt"], r["answer"]) for r in sealed}
        flagged: dict[str, tuple[Any, list[int], list[Match]]] = {}
        for ds in data.datasets:
            matches = scanner.scan(ds.rows)
            flagged[ds.name] = (ds, sorted({m.row_index for m in matches}), matches)
        questions = {
            _question(ds.rows[i]) for ds, rows, _ in flagged.values() if ds.quality != "honeypot" for i in rows
        }
        answers = _true_answers(task, questions) if name == "json_call" else {q: _gold(name, q) for q in questions}
        for ds_name, (ds, rows_flagged, matches) in flagged.items():
            entry: dict[str, Any] = {"rows": len(ds.rows), "flagged_rows": len(rows_flagged)}
            if ds.quality == "honeypot":
                entry["sealed_items_found"] = f"{len({m.sample_id for m in matches})}/{len(sealed)}"
            else:
                collisions = 0
                for i in rows_flagged:
                    question = _question(ds.rows[i])
                    try:
                        content = planted.content_of(name, question, answers[question])
                    except (KeyError, ValueError, IndexError, TypeError):
                        content = None
                    collisions += content in sealed_content
                entry["content_collisions"] = collisions
                entry["false_flags"] = len(rows_flagged) - collisions
                kinds = [m.kind for m in matches]
                entry["by_kind"] = {k: kinds.count(k) for k in LAYERS if k in kinds}
            out[ds_name] = entry
    return out


def _question(row: dict[str, str]) -> str:
    return re.sub(r"^Question: |\nAnswer:$", "", row.get("prompt", ""))


def _gold(task: str, question: str) -> str:
    """The gold answer read from the question itself: the sum, or the letter of the option the stem names."""
    if task == "arithmetic":
        return str(sum(int(x) for x in re.findall(r"\d+", question)[:2]))
    options = planted.parse_options(question)
    stem = question.split(" A) ", 1)[0]
    named = [letter for letter, word in options if re.search(rf"\b{re.escape(word)}\b", stem)]
    return named[0] if len(named) == 1 else ""


def _true_answers(task: Any, questions: set[str], budget: int = 500_000) -> dict[str, str]:
    """The gold answer of each question, found by drawing from the task's generator (an item's
    answer is a function of its question)."""
    rng = random.Random("bench:answers")  # noqa: S311 - seeded benchmark data
    found: dict[str, str] = {}
    for _ in range(budget if questions else 0):
        item = task.generate(rng)
        if item.question in questions and item.question not in found:
            found[item.question] = item.answer
            if len(found) == len(questions):
                break
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sealed", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100_000, help="training rows in all, planted ones included")
    parser.add_argument("--per-class", type=int, default=300, help="planted copies per class")
    parser.add_argument("--negatives", type=int, default=600, help="hard negatives per class")
    parser.add_argument("--layer-sample", type=int, default=20_000, help="honest rows in the per-layer runs")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--workers", type=int, default=1, help="processes for the throughput scan")
    parser.add_argument("--no-catalog", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    sealed = planted.draw_sealed(args.sealed, args.seed)
    sealed_content = {planted.content_of(s.task, s.prompt, s.answer) for s in sealed}
    copies = planted.planted_rows(sealed, args.per_class, args.seed)
    negatives = planted.hard_negatives(sealed, args.negatives, args.seed, sealed_content)
    labelled = copies.rows + negatives.rows
    truth = dict(copies.truth)
    truth.update({i + len(copies.rows): t for i, t in negatives.truth.items()})
    honest = planted.honest_rows(max(0, args.rows - len(labelled)), args.seed, sealed_content)
    rows = labelled + honest
    items = [s.as_item() for s in sealed]

    started = time.perf_counter()
    scanner = ContaminationScanner(items, templates=[PROMPT_TEMPLATE])
    index_seconds = time.perf_counter() - started
    started = time.perf_counter()
    matches = scan_parallel(scanner, rows, args.workers)
    scan_seconds = time.perf_counter() - started
    full = score(matches, truth, len(rows))
    full["by_kind"] = {kind: sum(1 for m in matches if m.kind == kind) for kind in LAYERS}

    split_found = 0
    split_items: set[str] = set()
    for dataset in copies.split_datasets:
        found = {(m.row_index, m.sample_id) for m in scanner.scan([row for row, _ in dataset])}
        split_found += sum((i, sid) in found for i, (_, sid) in enumerate(dataset))
        split_items |= {sid for _, sid in found}
    split_rows = sum(len(d) for d in copies.split_datasets)
    full["recall"]["split"] = {
        "recall": round(split_found / split_rows, 4),
        "found": split_found,
        "of": split_rows,
        "datasets": len(copies.split_datasets),
        "distinct_items_across_datasets": len(split_items),
    }

    per_layer: dict[str, Any] = {}
    sample = labelled + honest[: args.layer_sample]
    for layer in LAYERS:
        alone = ContaminationScanner(items, templates=[PROMPT_TEMPLATE], layers=(layer,))
        started = time.perf_counter()
        layer_matches = alone.scan(sample)
        result = score(layer_matches, truth, len(sample))
        result["scan_seconds"] = round(time.perf_counter() - started, 2)
        per_layer[layer] = result

    result = {
        "seed": args.seed,
        "sealed_items": len(scanner),
        "sealed_by_task": {t: sum(1 for s in sealed if s.task == t) for t in sorted(TASKS)},
        "rows": len(rows),
        "planted_rows": len(copies.rows),
        "negative_rows": len(negatives.rows),
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "index_seconds": round(index_seconds, 2),
        "scan_seconds": round(scan_seconds, 2),
        "rows_per_second": round(len(rows) / scan_seconds),
        "full": full,
        "per_layer": per_layer,
    }
    if not args.no_catalog:
        result["catalog"] = catalog_false_flags(args.seed)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        _print(result)
    return result


def _print(result: dict[str, Any]) -> None:
    print(f"seed {result['seed']}: {result['sealed_items']} sealed items {result['sealed_by_task']}")
    print(f"{result['rows']} rows ({result['planted_rows']} planted, {result['negative_rows']} hard negatives)")
    print(f"index {result['index_seconds']} s; scan {result['scan_seconds']} s = {result['rows_per_second']} rows/s "
          f"({result['workers']} worker(s), load average {[round(x, 1) for x in result['load_average']]})")  # fmt: skip
    for name, res in [("all layers", result["full"])] + [(k, v) for k, v in result["per_layer"].items()]:
        recall = "  ".join(f"{cls} {r['recall']:.3f}" for cls, r in res["recall"].items())
        print(f"{name:10s} recall: {recall}")
        print(f"{'':10s} precision {res['precision']:.4f}; false flags {res['false_flag_rows']} "
              f"(negatives {res['false_flags_on_negatives']}, honest {res['false_flags_on_honest']}); "
              f"other items on planted rows {res['extra_items_on_planted_rows']}")  # fmt: skip
    print("by kind (all layers):", result["full"]["by_kind"])
    split = result["full"]["recall"]["split"]
    print(f"split: {split['found']}/{split['of']} rows over {split['datasets']} datasets, "
          f"{split['distinct_items_across_datasets']} distinct items")  # fmt: skip
    for name, entry in result.get("catalog", {}).items():
        print(f"catalog {name}: {entry}")


if __name__ == "__main__":
    main()
