"""next_handle: the next number after the highest handle of its scope, however the handles look."""

from __future__ import annotations

import pytest

from apps.core.handles import next_handle
from apps.experiments.models import Checkpoint
from tests.factories import CheckpointFactory

pytestmark = pytest.mark.django_db


def _next(*handles: str) -> str:
    for handle in handles:
        CheckpointFactory(handle=handle)
    return next_handle(Checkpoint.objects.filter(handle__in=handles), "ckpt")


def test_first_and_following_handles():
    assert _next() == "ckpt_0001"
    assert _next("ckpt_0001", "ckpt_0003", "ckpt_0002", "other_0009") == "ckpt_0004"


def test_numbers_past_four_digits_count_by_value_not_text():
    assert _next("ckpt_9998", "ckpt_9999", "ckpt_10000", "ckpt_0999") == "ckpt_10001"


@pytest.mark.parametrize(
    "odd",
    [
        "ckpt_000007",  # more zeros than the padding: longer, yet worth less
        "ckpt_zzzz",  # not a number, as long as the highest
        "ckpt_12_extra_words",  # not a number, longer
        "ckpt_1",  # shorter, unpadded
    ],
)
def test_handles_made_elsewhere_do_not_mislead_it(odd):
    assert _next("ckpt_0011", "ckpt_0012", odd) == "ckpt_0013"


def test_a_longer_odd_handle_with_the_highest_number_wins():
    assert _next("ckpt_0011", "ckpt_00000042") == "ckpt_0043"
