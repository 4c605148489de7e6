"""Contamination scanner: throughput against 10,000 sealed items, recall and precision on a planted set.

    .venv/bin/python bench/contamination_scan.py [--sealed 10000] [--rows 20000] [--planted 300]
                                                 [--threshold 0.7] [--ngram 13] [--seed 0] [--json]

Sealed items and training rows come from the minibench task generators (arithmetic, multiple
choice, JSON calls), training rows from keys disjoint from the sealed ones (as the catalog's clean
sets are), so every flagged clean row is a false positive. Into the rows we plant copies of
sealed items in three families:

- verbatim:   the sealed prompt in the benchmark's own template with its answer
- edited:     one light edit: a word replaced, dropped, inserted or misspelt, two words swapped,
              or a number spelled out
- reformatted: the same item in another shape: another template, chat messages, upper case,
              prompt and answer in one text field

Recall is per family (a planted row counts when its own sample id is reported), precision over
all flagged rows. No Django needed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE, TASKS, completion_text, number_words  # noqa: E402
from apps.integrity.contamination import ContaminationScanner  # noqa: E402

FILLERS = ["please", "quickly", "now", "exactly", "today", "then"]


def sealed_items(n: int, seed: int) -> tuple[list[dict[str, Any]], set[str]]:
    rng = random.Random(f"bench:{seed}:sealed")
    names = sorted(TASKS)
    items: list[dict[str, Any]] = []
    keys: set[str] = set()
    prompts: set[str] = set()
    attempts = 0
    while len(items) < n:
        attempts += 1
        if attempts > n * 50:
            raise SystemExit(f"could only draw {len(items)} distinct sealed items")
        task = TASKS[names[len(items) % len(names)]]
        item = task.generate(rng)
        if item.key in keys or item.question in prompts:
            continue
        keys.add(item.key)
        prompts.add(item.question)
        items.append({"id": f"{task.name}-{len(items):05d}", "task": task.name, "prompt": item.question,
                      "answer": item.answer})  # fmt: skip
    return items, keys


def clean_rows(n: int, seed: int, sealed_keys: set[str]) -> list[dict[str, str]]:
    rng = random.Random(f"bench:{seed}:clean")
    names = sorted(TASKS)
    rows: list[dict[str, str]] = []
    while len(rows) < n:
        task = TASKS[rng.choice(names)]
        item = task.generate(rng)
        if item.key not in sealed_keys:
            rows.append({"prompt": task.render(item.question), "completion": completion_text(item.answer)})
    return rows


def light_edit(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    plain = [i for i, w in enumerate(words) if w.isalpha()]
    numeric = [i for i, w in enumerate(words) if w.rstrip(".?,").isdigit()]
    kind = rng.choice(["replace", "drop", "insert", "typo", "swap", "spell"])
    if kind == "spell" and numeric:
        i = rng.choice(numeric)
        digits = words[i].rstrip(".?,")
        words[i] = number_words(int(digits)) + words[i][len(digits) :] if int(digits) < 1000 else words[i]
    elif kind == "replace" and plain:
        words[rng.choice(plain)] = rng.choice(FILLERS)
    elif kind == "drop" and plain and len(words) > 3:
        del words[rng.choice(plain)]
    elif kind == "typo" and plain:
        i = rng.choice(plain)
        w = words[i]
        if len(w) > 3:
            j = rng.randrange(1, len(w) - 2)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
        else:
            words[i] = w + w[-1]
    elif kind == "swap" and len(plain) >= 2:
        i = rng.choice(plain[:-1])
        if i + 1 < len(words):
            words[i], words[i + 1] = words[i + 1], words[i]
    else:
        words.insert(rng.randrange(len(words) + 1), rng.choice(FILLERS))
    return " ".join(words)


def reformat(item: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    kind = rng.randrange(4)
    if kind == 0:
        return {"prompt": f"Q: {item['prompt']}\nA:", "completion": " " + item["answer"]}
    if kind == 1:
        return {"messages": [{"role": "user", "content": item["prompt"]},
                             {"role": "assistant", "content": item["answer"]}]}  # fmt: skip
    if kind == 2:
        return {"prompt": f"QUESTION: {item['prompt'].upper()}\nANSWER:", "completion": " " + item["answer"]}
    return {"text": f"Problem. {item['prompt']} Solution. {item['answer']}"}


def planted_rows(sealed: list[dict[str, Any]], n: int, seed: int) -> list[tuple[str, str, dict[str, Any]]]:
    rng = random.Random(f"bench:{seed}:planted")
    out: list[tuple[str, str, dict[str, Any]]] = []
    for item in rng.sample(sealed, n):
        rendered = PROMPT_TEMPLATE.replace("{question}", item["prompt"])
        out.append(("verbatim", item["id"], {"prompt": rendered, "completion": completion_text(item["answer"])}))
        edited = PROMPT_TEMPLATE.replace("{question}", light_edit(item["prompt"], rng))
        out.append(("edited", item["id"], {"prompt": edited, "completion": completion_text(item["answer"])}))
        out.append(("reformatted", item["id"], reformat(item, rng)))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sealed", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--planted", type=int, default=300, help="sealed items planted, 3 rows each")
    parser.add_argument("--threshold", type=float, default=0.75)
    parser.add_argument("--ngram", type=int, default=13)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="timed scans; the median is reported")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    sealed, keys = sealed_items(args.sealed, args.seed)
    clean = clean_rows(args.rows, args.seed, keys)
    planted = planted_rows(sealed, args.planted, args.seed)
    rows: list[dict[str, Any]] = clean + [row for _, _, row in planted]
    truth = {len(clean) + i: (family, sample_id) for i, (family, sample_id, _) in enumerate(planted)}

    started = time.perf_counter()
    scanner = ContaminationScanner(sealed, ngram=args.ngram, threshold=args.threshold, templates=[PROMPT_TEMPLATE])
    index_seconds = time.perf_counter() - started

    timings = []
    matches = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        matches = scanner.scan(rows)
        timings.append(time.perf_counter() - started)
    scan_seconds = statistics.median(timings)

    flagged = {m.row_index for m in matches}
    found = {(m.row_index, m.sample_id): m.kind for m in matches}
    recall: dict[str, Any] = {}
    for family in ("verbatim", "edited", "reformatted"):
        planted_here = [(i, sid) for i, (fam, sid) in truth.items() if fam == family]
        hits = [found[(i, sid)] for i, sid in planted_here if (i, sid) in found]
        kinds = {k: hits.count(k) for k in sorted(set(hits))}
        by_task: dict[str, list[int]] = {}
        for i, sid in planted_here:
            by_task.setdefault(sid.rsplit("-", 1)[0], []).append(int((i, sid) in found))
        recall[family] = {
            "recall": round(len(hits) / len(planted_here), 4),
            "by_kind": kinds,
            "by_task": {task: round(sum(v) / len(v), 3) for task, v in sorted(by_task.items())},
        }
    false_rows = sorted(flagged - set(truth))
    precision = (len(flagged) - len(false_rows)) / len(flagged) if flagged else 1.0
    result = {
        "sealed_items": len(scanner),
        "rows": len(rows),
        "planted_rows": len(planted),
        "ngram": args.ngram,
        "threshold": args.threshold,
        "index_seconds": round(index_seconds, 2),
        "scan_seconds": round(scan_seconds, 2),
        "rows_per_second": round(len(rows) / scan_seconds),
        "recall": recall,
        "precision": round(precision, 4),
        "false_positive_rows": len(false_rows),
        "false_positive_rate_on_clean": round(len(false_rows) / len(clean), 5),
        "false_positive_examples": [
            {"row": rows[i], "matches": [m.__dict__ for m in matches if m.row_index == i]} for i in false_rows[:3]
        ],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"sealed items {result['sealed_items']}, rows {result['rows']} ({result['planted_rows']} planted)")
        print(f"index build {result['index_seconds']} s; scan {result['scan_seconds']} s "
              f"= {result['rows_per_second']} rows/s")  # fmt: skip
        for family, stats in recall.items():
            print(f"recall {family:12s} {stats['recall']:.3f}  {stats['by_kind']}  by task {stats['by_task']}")
        print(f"precision {result['precision']:.4f} ({len(false_rows)} false-positive rows of {len(clean)} clean)")
        for example in result["false_positive_examples"]:
            print("  false positive:", json.dumps(example)[:300])
    return result


if __name__ == "__main__":
    main()
