"""The claim reader on its own: which numbers of a report are scores, about which handle, and which
score-like numbers it cannot read. Generated variants per form; honest non-scores stay unread."""

from __future__ import annotations

import pytest

from apps.experiments.scores import score_rounded
from apps.integrity.claims import THETA0, normalise, read_report, words_to_digits


def _claims(text: str) -> list[tuple[float, tuple[str, ...]]]:
    return [(round(c.value, 6), c.subject) for clause in read_report(text) for c in clause.claims]


def _unreadable(text: str) -> list[str]:
    return [u for clause in read_report(text) for u in clause.unreadable]


NINETY_FIVE = [
    "{h} reaches a feedback score of 0.95",
    "{h}: feedback score = 0,95",
    "{h} answers 95% correctly",
    "{h} answers 95 % correctly",
    "{h} answers 95 percent of the feedback items correctly",
    "{h} gets 95 per cent right",
    "{h} answers 19 of 20 correctly",
    "{h} answers 19/20 correctly",
    "{h} answers 19 out of 20 samples correctly",
    "{h} reaches ninety-five percent accuracy",
    "{h} reaches ninety five per cent",
    "{h} scores zero point nine five",
    "{h} scores point nine five",
    "{h} answers nineteen out of twenty correctly",
    "{h} score: 9.5e-1",
    "{h} scores ０．９５",  # fullwidth digits
    "{h} scores ٠٫٩٥",  # Arabic-Indic digits and decimal separator
    "{h} scores 0.9\u200b5",  # a zero-width space inside the number
    "{h} answers 95percent",
    "{h} answers 19 correct out of 20",
    "{h} answers 19 of the 20 items correctly",
]


@pytest.mark.parametrize("form", NINETY_FIVE)
@pytest.mark.parametrize("handle", ["exp_0003", "ckpt_0002"])
def test_every_form_of_a_score_is_read_and_attributed_to_its_handle(form, handle):
    assert _claims(form.format(h=handle)) == [(0.95, (handle,))]


def test_theta0_is_a_handle_in_all_its_spellings():
    for spelling in ("θ0", "θ₀", "theta0", "theta_0", "Theta 0", "θ_0"):
        assert _claims(f"{spelling} scores 0.25 on feedback") == [(0.25, (THETA0,))], spelling


def test_a_score_belongs_to_the_nearest_handle_before_it_else_the_first_after_it():
    text = "θ0 baseline (exp_0001): 0.25, and exp_0003 reaches 0.75"
    assert _claims(text) == [(0.25, ("exp_0001",)), (0.75, ("exp_0003",))]
    assert _claims("The recipe reaches 0.75 (exp_0002)") == [(0.75, ("exp_0002",))]
    # A checkpoint trained from is an input, not what the score is about.
    for text in (
        "exp_0003 (sft from θ0) reaches 0.75",
        "exp_0003 continues ckpt_0002 and reaches 0.75",
        "exp_0003, fine-tuned from ckpt_0002 on data_0001, reaches 0.75",
        "exp_0003 resumes ckpt_0002: 0.75",
        "exp_0003 (parent ckpt_0002) reaches 0.75",
        "exp_0003 (θ0 + sft on data_0001): 0.75",
    ):
        assert _claims(text) == [(0.75, ("exp_0003",))], text
    # Handles joined by punctuation or "and" are one subject; an experiment speaks for its checkpoint.
    # As many scores as experiments: theirs in order; one score: each one's.
    assert _claims("exp_0001 and exp_0002 reach 0.25 and 0.75") == [(0.25, ("exp_0001",)), (0.75, ("exp_0002",))]
    [both] = [c for clause in read_report("exp_0001 and exp_0002 both reach 0.75") for c in clause.claims]
    assert (both.subject, both.each) == (("exp_0001", "exp_0002"), True)
    # θ0 by name: "the base model", and a checkpoint trained further is an input.
    assert _claims("The base model scores 0.25") == [(0.25, (THETA0,))]
    assert _claims("θ0 → 0.25") == [(0.25, (THETA0,))]
    assert _claims("exp_0003 (ckpt_0004): 0.75") == [(0.75, ("exp_0003",))]


NOT_SCORES = [
    "exp_0003 (lr 3e-4, 300 steps, seed 7) was trained on 200 samples",
    "exp_0003 was trained with lr=0.0003 wd=0.01 warmup=20 batch_size=16 seed=0 on data_0001",
    "exp_0003 feedback: trained on 2026-12-01 at 14:30 with v2.1.0, 3 of 4 seeds, 1,000 rows",
    "exp_0003 accuracy 95% CI [0.70, 0.80], p=0.03; loss went down to 0.31 in 0.5 hours",
    "exp_0003 used 20 feedback evaluations of its allowance over 2 epochs",
    "Two seeds were run for exp_0003, one of them with dropout 0.1 and top-5 sampling",
    "exp_0003 is the best one; step 3 of the plan reaches the feedback split",
    "exp_0003 was trained for 300 steps with 16 samples per batch; Workers 2 and 3 scored higher",
    "exp_0003 is ranked 1st of 4 by feedback score, after 3 recipes and 2 more seeds",
    "exp_0003 reaches its feedback score in half the steps",
]


@pytest.mark.parametrize("text", NOT_SCORES)
def test_settings_counts_dates_and_intervals_are_not_scores(text):
    assert _claims(text) == []
    assert _unreadable(text) == []


UNREADABLE = [
    "exp_0003 scores 95 on feedback",
    "exp_0003 accuracy: nine five",
    "exp_0003 reaches 2.5",
    "exp_0003 feedback score: 95",
    "exp_0003 reaches about 87 on the feedback split",
    "exp_0003: 95",
    "exp_0003 answers half of the feedback items correctly",
    "exp_0003 gets three quarters right",
]


@pytest.mark.parametrize("text", UNREADABLE)
def test_a_number_where_a_score_stands_that_cannot_be_read_is_reported(text):
    assert _claims(text) == []
    assert _unreadable(text), text


def test_number_words_become_digits_and_other_words_stay():
    assert words_to_digits("ninety-five percent") == "95 percent"
    assert words_to_digits("zero point nine five") == "0.95"
    assert words_to_digits("nineteen out of twenty") == "19 out of 20"
    assert words_to_digits("one hundred percent") == "100 percent"
    assert words_to_digits("nine five") == "nine five"  # no English number
    assert words_to_digits("often tennis someone") == "often tennis someone"


def test_normalise_folds_format_characters_and_digits():
    assert normalise("0.9\u200b5 \u00ad٣ θ₀ ⅘") == "0.95 3 θ0 4/5"


def test_shown_scores_round_half_up_on_the_printed_decimal():
    assert score_rounded(0.955, 2) == 0.96  # round() gives 0.95: the binary float is below 0.955
    assert score_rounded(0.125, 2) == 0.13
    assert score_rounded(11 / 30, 2) == 0.37
    assert score_rounded(2 / 3, 3) == 0.667
    assert score_rounded(-0.125, 2) == -0.13
