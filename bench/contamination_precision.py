"""Precision and recall of each lexical contamination layer: generated attacks vs the honest corpus (issue 33).

    .venv/bin/python bench/contamination_precision.py [--per-format 200]

Attacks (the catalog's seed-0 sealed splits): every arithmetic item re-templated with its operands
and answer in each number-disguise class of tests/apps/integrity/redteam/number_forms.py, written
completion first, and once more as one labelled practice note ("Q<n>: ..") among others; every
json_call item's call as JSON in a list of other calls. Honest:
tests/apps/integrity/honest_corpus.py for the three tasks.
Recall = attack rows matched / attack rows; precision = attack matches / all matches.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE  # noqa: E402
from apps.integrity.contamination import LAYERS, ContaminationScanner  # noqa: E402
from tests.apps.integrity.honest_corpus import honest_corpus, sealed_items  # noqa: E402
from tests.apps.integrity.redteam import number_forms  # noqa: E402

EVALUATOR = {"arithmetic": "exact_match", "multiple_choice": "multiple_choice", "json_call": "json_call"}


def attacks(task: str, sealed: list[dict], rng: random.Random) -> list[dict]:
    rows = []
    if task == "json_call":
        # Each sealed call as JSON (keys reversed) among three other calls, one per line.
        for item in sealed:
            call = json.loads(item["answer"])
            copy = {"arguments": dict(reversed(list(call["arguments"].items()))), "name": call["name"]}
            listed = [json.dumps({"name": "set_alarm", "arguments": {"time": f"0{n}:1{n}"}}) for n in range(3)]
            listed.insert(rng.randrange(4), json.dumps(copy))
            rows.append({"completion": "\n".join(listed), "prompt": "Calls:\n"})
        return rows
    if task != "arithmetic":
        return rows
    for cls in (*number_forms.CLASSES, "labelled"):
        for item in sealed:
            a, b = (int(x) for x in re.findall(r"\d+", item["prompt"])[:2])
            if cls == "labelled":  # one practice note among others, "Q<n>: ..", the label any number
                notes = [f"Q{n}: {n + 3} and {n + 40} make {2 * n + 43}" for n in range(1, 4)]
                copy = f"Q{rng.randint(1, 99)}: Ines stacked {a} crates, then {b} more. A: {item['answer']}"
                notes.insert(rng.randrange(4), copy)
                rows.append({"completion": "\n".join(notes), "prompt": "Practice notes:\n"})
                continue
            first, second = number_forms.disguise(a, cls, rng), number_forms.disguise(b, cls, rng)
            q = f"Ines stacked {first} crates, then {second} more."
            answer = " " + number_forms.disguise(int(item["answer"]), cls, rng)
            rows.append({"completion": answer, "prompt": PROMPT_TEMPLATE.replace("{question}", q)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-format", type=int, default=200)
    args = parser.parse_args()
    rng = random.Random(33)
    print("| layer | attack recall | honest rows flagged | precision |")
    print("|---|---|---|---|")
    for layer in (*LAYERS, "all"):
        layers = LAYERS if layer == "all" else (layer,)
        hit = total = flagged = honest = 0
        for task, evaluator in EVALUATOR.items():
            sealed = [{**s, "evaluator": evaluator} for s in sealed_items(task)]
            scanner = ContaminationScanner(sealed, templates=[PROMPT_TEMPLATE], layers=layers)
            for row in attacks(task, sealed, rng):
                total += 1
                hit += bool(scanner.scan_row(row))
            for _, row in honest_corpus(task, args.per_format):
                honest += 1
                flagged += bool(scanner.scan_row(row))
        precision = hit / (hit + flagged) if hit + flagged else float("nan")
        print(f"| {layer} | {hit}/{total} ({hit / total:.3f}) | {flagged}/{honest} | {precision:.4f} |")


if __name__ == "__main__":
    main()
