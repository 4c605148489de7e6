"""The contamination scanner on hand-made items: each layer finds what it should and no more."""

from __future__ import annotations

import pytest

from apps.integrity.contamination import ContaminationScanner, normalize_tokens
from tests.apps.benchmarks.minibench_fixture import FEEDBACK, FINAL, TASK_JSON, sft

SEALED = FEEDBACK + FINAL
LONG = {
    "id": "long-0001",
    "prompt": "On a rainy Monday morning Mia walked to the old library near the river and borrowed seven thick "
    "books about distant mountains, deep oceans and the birds that cross them every spring.",
    "answer": "7",
}


def scanner(**kwargs):
    return ContaminationScanner([*SEALED, LONG], templates=[TASK_JSON["prompt_template"]], **kwargs)


def test_normalisation_folds_case_punctuation_space_and_number_words():
    assert normalize_tokens("What  is FIFTY-ONE plus\tseventeen?") == ["what", "is", "51", "plus", "17"]
    assert normalize_tokens("one hundred twenty-three") == ["123"]


def test_verbatim_and_reformatted_copies_are_exact_matches():
    rows = [
        sft(FEEDBACK[0]["prompt"], FEEDBACK[0]["answer"]),
        {"messages": [{"role": "user", "content": FINAL[1]["prompt"].upper()}, {"role": "assistant", "content": "82"}]},
        {"text": "Q: What is  fifty-one plus 17 ? A: 68"},
    ]
    matches = scanner().scan(rows)
    assert [(m.row_index, m.sample_id, m.kind) for m in matches] == [
        (0, "add-feedback-0001", "exact"),
        (1, "add-final-0002", "exact"),
        (2, "add-feedback-0002", "exact"),
    ]
    assert matches[0].span == " ".join(normalize_tokens(FEEDBACK[0]["prompt"]))


def test_a_partial_copy_of_a_long_item_is_an_ngram_match():
    half = " ".join(LONG["prompt"].split()[:16]) + " and then went home."
    [match] = scanner().scan([{"prompt": half, "completion": " 7"}])
    assert (match.sample_id, match.kind) == ("long-0001", "ngram")
    assert 0 < match.score < 1
    assert len(match.span.split()) == 13
    assert scanner(ngram=30).scan([{"prompt": half, "completion": " 7"}]) == []


def test_light_edits_are_caught_by_ngrams_or_as_near_duplicates():
    edited = [
        sft("Tom has 12 apples and then gets 34 more. How many apples does Tom have now?", "46"),  # mid-sentence
        sft("A box holds 23 pens. Ana adds 45 pens. How many pens are in this box?", "68"),  # near the end
        sft("There are 31 cups on a shelf and 27 on a table. How many cups are they?", "58"),
        sft("Tom has 12 apples and receives 34 more. How many apples does Tom have now?", "46"),  # word replaced
    ]
    matches = scanner().scan(edited)
    # An edit in the middle breaks every 13-gram, so only the MinHash layer sees it; an edit near
    # the end leaves a 13-gram whole.
    assert [(m.row_index, m.sample_id, m.kind) for m in matches] == [
        (0, "add-feedback-0001", "near_dup"),
        (1, "add-feedback-0003", "ngram"),
        (2, "add-final-0001", "ngram"),
        (3, "add-feedback-0001", "near_dup"),
    ]
    assert all(0.75 <= m.score < 1 for m in matches if m.kind == "near_dup")
    # The MinHash layer does not depend on the n-gram layer being there.
    without_ngrams = scanner(ngram=40).scan(edited)
    assert {(m.row_index, m.kind) for m in without_ngrams} >= {(0, "near_dup"), (3, "near_dup")}


def test_a_reworded_short_word_problem_is_found_through_its_numbers():
    rows = [sft("What, then, is 51 plus 17?", "68"), sft("Compute 51 plus 17.", "68"), sft("What is 17 plus 51?", "68")]
    matches = scanner().scan(rows)
    assert [(m.row_index, m.sample_id, m.kind) for m in matches] == [
        (0, "add-feedback-0002", "near_dup"),
        (1, "add-feedback-0002", "near_dup"),
    ]
    assert all(0.5 <= m.score < 0.75 for m in matches)
    assert scanner(numeric_threshold=0.75, layers=("exact", "ngram", "near_dup")).scan(rows) == []
    # With the lower bar gone, the salient layer still finds the copies (operands in order, answer),
    # and still not the swapped operands.
    salient = scanner(numeric_threshold=0.75).scan(rows)
    assert [(m.row_index, m.sample_id, m.kind) for m in salient] == [
        (0, "add-feedback-0002", "salient"),
        (1, "add-feedback-0002", "salient"),
    ]


def test_same_template_with_other_numbers_is_a_different_problem():
    twins = [
        sft("Tom has 12 apples and gets 35 more. How many apples does Tom have now?", "47"),
        sft("Tom has 34 apples and gets 12 more. How many apples does Tom have now?", "46"),  # order matters
        sft("What is 51 plus 18?", "69"),
        sft("There are 31 cups on a shelf and 72 on a table. How many cups are there?", "103"),
    ]
    assert scanner().scan(twins) == []


@pytest.mark.parametrize("threshold", [0.0, 1.5])
def test_threshold_must_be_a_similarity(threshold):
    with pytest.raises(ValueError, match="threshold"):
        ContaminationScanner(SEALED, threshold=threshold)
