"""Metric points are stored exactly as given: every float to the bit, every key, every step.

On PostgreSQL a batch goes to the INSERT as four text parameters (the distinct keys, and each
point's key number, step and value as comma-separated text, apps.experiments.services); these are
the values that text must carry without loss, in both of its callers (the plain append and the
owned one that agents' calls take).
"""

from __future__ import annotations

import math
import struct

import pytest

from apps.experiments import services
from apps.experiments.models import MetricPoint
from apps.research import services as research_services
from apps.research.choices import NodeKind

pytestmark = pytest.mark.django_db

AWKWARD_VALUES = [0.1 + 0.2, 5e-324, 1.7976931348623157e308, -0.0, 1e16, 1 / 3, -2.5e-300, math.pi, 7.0]
AWKWARD_KEYS = ["loss", "eval/accuracy", "a,b", 'quote"and\\', "{brace}", "ünïcode ✓", "NULL", "  spaced  "]


def bits(value: float) -> bytes:
    return struct.pack("<d", value)


@pytest.fixture
def experiment(run):
    worker = research_services.node_create(run=run, kind=NodeKind.WORKER, task="w")
    return services.experiment_create(run=run, owner=worker, kind="eval_only", input_checkpoint=run.base_checkpoint,
                                      action={"evaluate": "feedback"})  # fmt: skip


def points() -> list[tuple[str, int, float]]:
    out = []
    for k, key in enumerate(AWKWARD_KEYS):
        for s, value in enumerate([*AWKWARD_VALUES, math.nan, math.inf, -math.inf]):
            out.append((key, (2**62 if s == 0 else s) + k, value))
    return out


def stored(experiment) -> dict[tuple[str, int], float]:
    rows = MetricPoint.objects.filter(experiment=experiment).values_list("key", "step", "value")
    return {(key, step): value for key, step, value in rows}


def assert_kept(experiment, sent: list[tuple[str, int, float]]) -> None:
    kept = stored(experiment)
    assert set(kept) == {(key, step) for key, step, _ in sent}
    for key, step, value in sent:
        if math.isnan(value):
            assert math.isnan(kept[(key, step)])
        else:
            assert bits(kept[(key, step)]) == bits(value), (key, step, value, kept[(key, step)])


def test_a_batch_keeps_every_key_step_and_float_exactly(experiment):
    sent = points()
    assert services.metric_points_log(experiment=experiment, points=sent) == (len(sent), 0)
    assert_kept(experiment, sent)
    # Sent again, each point is found identical (the comparison reads the stored floats back).
    assert services.metric_points_log(experiment=experiment, points=[p for p in sent if not math.isnan(p[2])]) == (
        0, len(sent) - len(AWKWARD_KEYS),
    )  # fmt: skip


def test_the_owned_append_keeps_them_exactly_too(experiment):
    sent = [p for p in points() if math.isfinite(p[2])]  # what an agent's call can carry
    logged = services.metric_points_log_owned(run=experiment.run, owner=experiment.owner, handle=experiment.handle,
                                              points=sent)  # fmt: skip
    assert logged is not None
    assert logged[1:] == (len(sent), 0)
    assert_kept(experiment, sent)
