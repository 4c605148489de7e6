"""Precision and recall of each lexical contamination layer: generated attacks vs the honest corpus (issue 33).

    .venv/bin/python bench/contamination_precision.py [--per-format 200]

Attacks (arithmetic, the catalog's seed-0 sealed splits): every sealed item re-templated with its
operands and answer in each number-disguise class of tests/apps/integrity/redteam/number_forms.py,
written completion first. Honest: tests/apps/integrity/honest_corpus.py for the three tasks.
Recall = attack rows matched / attack rows; precision = attack matches / all matches.
"""

from __future__ import annotations

import argparse
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


def attacks(sealed: list[dict], rng: random.Random) -> list[dict]:
    rows = []
    for cls in number_forms.CLASSES:
        for item in sealed:
            a, b = (int(x) for x in re.findall(r"\d+", item["prompt"])[:2])
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
            if task == "arithmetic":
                for row in attacks(sealed, rng):
                    total += 1
                    hit += bool(scanner.scan_row(row))
            for _, row in honest_corpus(task, args.per_format):
                honest += 1
                flagged += bool(scanner.scan_row(row))
        precision = hit / (hit + flagged) if hit + flagged else float("nan")
        print(f"| {layer} | {hit}/{total} ({hit / total:.3f}) | {flagged}/{honest} | {precision:.4f} |")


if __name__ == "__main__":
    main()
