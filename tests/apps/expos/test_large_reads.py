"""Reads as an LLM meets them (issue 31 item 6): key filters, a step range and down-sampling with a
stated default size, on training curves, metric histories and the event tail; sibling tools that
take the same kind of identifier, and errors that say which kinds they take."""

from __future__ import annotations

from typing import Any

import pytest

from apps.expos.registry import load_all
from apps.expos.tools.ours import CURVE_DEFAULT_POINTS, downsample
from apps.jobs.models import Job
from tests.apps.expos.conftest import World, build_world
from tests.apps.expos.test_tool_behaviour import call


@pytest.fixture
def w(db) -> World:
    return build_world()


def _long_curve(w: World, steps: int) -> None:
    points = [{"step": s, "loss": 3.0 - s / steps, "learning_rate": 1e-4} for s in range(1, steps + 1)]
    Job.objects.filter(pk=w.jobs["own_train"].pk).update(metrics={"points": points, "last": points[-1]})


def test_a_long_training_curve_is_down_sampled_to_the_stated_default(w):
    _long_curve(w, 1000)
    schema = load_all()["training_curve_read"].input_schema["properties"]
    assert schema["max_points"]["default"] == CURVE_DEFAULT_POINTS
    assert f"default {CURVE_DEFAULT_POINTS}" in load_all()["training_curve_read"].description

    curve = call(w, "own", "training_curve_read", {"experiment": "exp_0001"}).json()
    assert (curve["total_points"], curve["downsampled"], len(curve["points"])) == (1000, True, CURVE_DEFAULT_POINTS)
    steps = [p["step"] for p in curve["points"]]
    assert steps[0] == 1
    assert steps[-1] == 1000
    assert steps == sorted(set(steps))
    gaps = {b - a for a, b in zip(steps, steps[1:], strict=False)}
    assert gaps <= {5, 6}  # evenly spaced

    # A key filter and a step range: only those metrics, only those steps, all of them when few.
    part = call(w, "own", "training_curve_read",
                {"experiment": "exp_0001", "keys": ["loss"], "from_step": 101, "to_step": 150}).json()  # fmt: skip
    assert (part["total_points"], part["downsampled"]) == (50, False)
    assert [p["step"] for p in part["points"]] == list(range(101, 151))
    assert all(set(p["metrics"]) == {"loss"} for p in part["points"])
    assert set(part["last"]) == {"loss"}
    few = call(w, "own", "training_curve_read", {"experiment": "exp_0001", "max_points": 3}).json()
    assert [p["step"] for p in few["points"]] == [1, 501, 1000]
    refused = call(w, "own", "training_curve_read", {"experiment": "exp_0001", "max_points": 1})
    assert refused.status_code == 400
    assert refused.json()["error"]["detail"]["path"] == "/max_points"


@pytest.mark.parametrize(("n", "m"), [(10, 2), (10, 3), (1000, 200), (7, 7), (5, 9), (101, 100)])
def test_downsample_keeps_first_and_last_and_at_most_the_limit(n, m):
    picked = downsample(list(range(n)), m)
    assert len(picked) == min(n, m)
    assert picked[0] == 0
    assert picked[-1] == n - 1


def _log(w: World, steps: range) -> None:
    points = [{"key": "loss", "step": s, "value": 1.0 / (s + 1)} for s in steps]
    for start in range(0, len(points), 500):
        sent = call(
            w, "own", "experiment_log_metrics", {"experiment": "exp_0001", "points": points[start : start + 500]}
        )
        assert sent.status_code == 200, sent.json()


def test_a_metric_history_takes_a_step_range_and_down_samples_in_the_database(w):
    _log(w, range(0, 2000))

    def read(**args: Any) -> dict[str, Any]:
        answer = call(w, "own", "experiment_metrics_read", {"experiment": "exp_0001", "key": "loss", **args})
        assert answer.status_code == 200, answer.json()
        return answer.json()

    ranged = read(after_step=99, to_step=199)
    assert [p["step"] for p in ranged["points"]] == list(range(100, 200))
    assert ranged["next_after_step"] is None
    paged = read(to_step=999, limit=300)
    assert (len(paged["points"]), paged["next_after_step"]) == (300, 299)
    sampled = read(max_points=50)
    steps = [p["step"] for p in sampled["points"]]
    assert (len(steps), steps[0], steps[-1], sampled["next_after_step"]) == (50, 0, 1999, None)
    assert {b - a for a, b in zip(steps, steps[1:], strict=False)} <= {40, 41}
    assert [p["step"] for p in read(after_step=9, to_step=12, max_points=10)["points"]] == [10, 11, 12]
    both = call(w, "own", "experiment_metrics_read", {"experiment": "exp_0001", "key": "loss", "limit": 5,
                                                      "max_points": 5})  # fmt: skip
    assert both.status_code == 400
    assert "not both" in both.json()["error"]["message"]


def test_the_event_tail_filters_by_tool_and_ends_before_a_seq(w):
    for _ in range(3):
        assert call(w, "own", "public_check_quota").status_code == 200
    tail = call(w, "own", "events_tail", {"tools": ["public_check_quota"], "limit": 200}).json()["events"]
    assert len(tail) == 3
    assert {e["tool"] for e in tail} == {"public_check_quota"}
    before = call(w, "own", "events_tail", {"tools": ["public_check_quota"], "before_seq": tail[-1]["seq"]}).json()
    assert [e["seq"] for e in before["events"]] == [e["seq"] for e in tail[:2]]


def test_compare_eval_samples_takes_the_experiment_handles_its_sibling_takes(w):
    by_uuid = call(w, "rin", "compare_eval_samples", {"a": str(w.evals["own1"].uuid), "b": str(w.evals["own2"].uuid)})
    by_handle = call(w, "rin", "compare_eval_samples", {"a": w.exp["own1"].handle, "b": w.exp["own2"].handle})
    assert by_handle.status_code == 200, by_handle.json()
    assert by_handle.json() == by_uuid.json()
    # An identifier of neither kind, or one that names nothing: the error says which kinds it takes.
    wrong = call(w, "rin", "compare_eval_samples", {"a": "data_0001", "b": w.exp["own2"].handle}).json()["error"]
    assert wrong["code"] == "invalid_identifier"
    assert "experiment handle" in wrong["message"]
    assert "evaluation uuid" in wrong["message"]
    unknown = call(w, "rin", "compare_eval_samples", {"a": "12345678-1234-1234-1234-123456789012", "b": "exp_0001"})
    assert unknown.json()["error"]["code"] == "unknown_evaluation"
    assert "experiment handle" in unknown.json()["error"]["message"]
