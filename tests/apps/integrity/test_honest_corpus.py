"""Precision on honest work (issue 33, item 3): honest formats built from the catalog match no sealed item.

Few-shot prompts, packed practice notes, long documents and number-dense text (``honest_corpus``)
put many catalog items' numbers, options and calls side by side; every lexical layer scans them
against the same task's sealed splits at the default tolerance (0 sealed items): not one row may
match. The attack side of the same rules is in test_training_order.py, test_contamination_layers.py
and redteam/test_number_forms.py.
"""

from __future__ import annotations

import pytest

from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE
from apps.integrity.contamination import LAYERS, ContaminationScanner
from tests.apps.integrity.honest_corpus import FORMATS, honest_corpus, sealed_items

EVALUATOR = {"arithmetic": "exact_match", "multiple_choice": "multiple_choice", "json_call": "json_call"}


@pytest.mark.parametrize("task", ["arithmetic", "json_call", "multiple_choice"])
def test_honest_formats_match_no_sealed_item_on_any_layer(task):
    sealed = [{**item, "evaluator": EVALUATOR[task]} for item in sealed_items(task)]
    scanner = ContaminationScanner(sealed, templates=[PROMPT_TEMPLATE], layers=LAYERS)
    seen: dict[str, int] = {}
    flagged = []
    for fmt, row in honest_corpus(task, per_format=60):
        seen[fmt] = seen.get(fmt, 0) + 1
        matches = scanner.scan_row(row)
        if matches:
            flagged.append((fmt, matches[0].kind, matches[0].sample_id))
    assert set(seen) == set(FORMATS), seen
    assert min(seen.values()) >= 60, seen
    assert flagged == [], flagged[:5]
