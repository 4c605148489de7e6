"""The Main Agent's search policies and its value rule over constructed evidence (issue 32)."""

from __future__ import annotations

import random

import pytest

from apps.research.agent_config import DEFAULT_SEARCH_POLICY, SEARCH_POLICIES
from workers.agents.policies.search import (
    STEEP_LOSS_DROP,
    Budget,
    FollowUp,
    diagnosis_weight,
    lines_of,
    loss_drop,
    search_policy,
)


def _curve(losses: list[float]) -> list[dict]:
    return [{"step": 10 * i, "metrics": {"loss": v, "learning_rate": 0.002}} for i, v in enumerate(losses)]


def _content_report(wrong: int) -> dict:
    return {
        "uncertainties": [
            f"exp_0004 (worker_0001): {wrong - 1} of {wrong} wrong feedback outputs are "
            "well-formed answers with the wrong content (a-clean): too little training or wrong "
            "labels"
        ],  # fmt: skip
        "recommendations": ["search for other training data: the errors of exp_0004 are content, not format"],
    }


def test_the_policies_are_the_ones_a_run_can_record():
    assert tuple(SEARCH_POLICIES) == ("greedy", "uct")
    assert search_policy(None).name == DEFAULT_SEARCH_POLICY == "greedy"
    assert [search_policy(name).name for name in SEARCH_POLICIES] == list(SEARCH_POLICIES)
    with pytest.raises(ValueError, match="greedy, uct"):
        search_policy("random")


def test_the_loss_drop_is_measured_over_the_last_half_of_the_curve():
    falling = loss_drop(_curve([4.0, 3.0, 2.5, 2.0, 1.6, 1.3, 1.1, 0.9]))
    flat = loss_drop(_curve([4.0, 2.0, 1.2, 1.0, 1.0, 1.0, 0.99, 1.0]))
    assert falling is not None
    assert falling > STEEP_LOSS_DROP
    assert flat is not None
    assert flat < 0.05
    assert loss_drop(_curve([2.0, 1.0])) is None  # too short to tell
    assert loss_drop([{"step": 1, "metrics": {"accuracy": 0.5}}] * 8) is None  # no loss logged


@pytest.mark.parametrize("seed", range(5))
def test_a_content_diagnosis_contradicted_by_a_falling_loss_is_discounted_and_says_so(seed):
    rng = random.Random(seed)
    wrong = rng.randint(5, 200)
    report = _content_report(wrong)
    steep = rng.uniform(STEEP_LOSS_DROP, 0.6)
    flat = rng.uniform(0.0, STEEP_LOSS_DROP - 0.01)
    contradicted = diagnosis_weight(report, "content", steep)
    supported = diagnosis_weight(report, "content", flat)
    assert contradicted.weight == pytest.approx(supported.weight * 0.25, abs=1e-3)
    assert "contradicted by the measured curve" in contradicted.note
    assert "contradicted" not in supported.note
    assert f"cites {wrong} per-sample outputs" in supported.note
    # Evidence weighs: more cited samples, more weight; none cited, a quarter.
    assert diagnosis_weight(_content_report(wrong + 50), "content", flat).weight > supported.weight
    assert diagnosis_weight({"uncertainties": ["errors look like content"]}, "content", flat).weight == 0.25
    # A run-on diagnosis is not about training length: a falling loss does not discount it.
    run_on = {"supported_findings": [f"exp_0004: {wrong} of {wrong} wrong feedback outputs start with an answer"]}
    assert diagnosis_weight(run_on, "run_on", steep).weight == diagnosis_weight(run_on, "run_on", flat).weight


def _budget(accel_left: float = 2000, wall_left: float = 600) -> Budget:
    return Budget(accel_left=accel_left, wall_left=wall_left, accel_per_line=300, wall_per_line=500)


@pytest.mark.parametrize("name", SEARCH_POLICIES)
@pytest.mark.parametrize("seed", range(4))
def test_follow_ups_are_ranked_by_value_never_by_the_order_written(name, seed):
    rng = random.Random(seed)
    policy = search_policy(name)
    cheap_sure = FollowUp("continue", "continue", "worker_0001", gain=0.3, uncertainty=0.05, cost_scale=0.5)
    weak = FollowUp("branch", "data-screen", None, gain=0.02, uncertainty=0.05)
    too_long = FollowUp("verify", "verify", "worker_0001", gain=0.5, uncertainty=0.1, cost_scale=2.0)
    items = [cheap_sure, weak, too_long]
    rng.shuffle(items)
    ranked = policy.rank(items, _budget())
    assert ranked[0] is cheap_sure
    # 1,000 wall seconds do not fit in the 600 left: worth nothing, whatever its gain, and it says why.
    assert too_long.value == 0
    assert "cannot finish before the budget ends" in too_long.explain
    assert ranked[-1] is too_long
    assert all("accelerator-s" in item.explain and "wall-s" in item.explain for item in ranked)
    # Integrity first: a mandatory revise goes ahead of any value.
    revise = FollowUp("revise", "data-screen", None, gain=0.0, uncertainty=0.0, mandatory=True)
    assert policy.rank([*items, revise], _budget())[0] is revise


def test_uct_weighs_uncertainty_where_greedy_does_not():
    explore = FollowUp("branch", "data-screen", None, gain=0.05, uncertainty=0.4)
    exploit = FollowUp("continue", "continue", "worker_0001", gain=0.12, uncertainty=0.0)
    assert search_policy("greedy").rank([explore, exploit], _budget())[0] is exploit
    assert search_policy("uct").rank([explore, exploit], _budget())[0] is explore


def _workers(parent_score: float, child_score: float | None) -> dict:
    workers = {"worker_0001": {"status": "finalized", "best": {"experiment": "exp_0002", "score": parent_score}},
               "worker_0002": {"status": "finalized", "best": {"experiment": "exp_0005", "score": 0.30}}}  # fmt: skip
    if child_score is not None:
        workers["worker_0003"] = {"status": "finalized", "parent": "worker_0001",
                                  "best": {"experiment": "exp_0007", "score": child_score}}  # fmt: skip
    return workers


def test_greedy_expands_the_best_line_and_uct_leaves_a_stagnant_one():
    lines = lines_of(_workers(0.32, 0.32))  # worker_0003 continued worker_0001 without improving it
    assert {line.handle: line.stagnant for line in lines}["worker_0001"] is True
    greedy, why = search_policy("greedy").choose_line(lines)
    assert greedy is not None
    assert greedy.handle == "worker_0001"
    assert "best feedback score" in why
    uct, why = search_policy("uct").choose_line(lines)
    assert uct is not None
    assert uct.handle != "worker_0001"
    assert "stagnant, not expanded: worker_0001" in why
    assert "upper confidence bound" in why
    # A follow-up that improved its line leaves it live (and is a line of its own).
    improving = lines_of(_workers(0.32, 0.40))
    assert not any(line.stagnant for line in improving)
    assert improving[0].handle == "worker_0003"
    # Two close lines, the better one already being followed up: UCT explores the other, greedy does not.
    busy = _workers(0.32, None)
    busy["worker_0003"] = {"status": "active", "parent": "worker_0001"}
    assert search_policy("greedy").choose_line(lines_of(busy))[0].handle == "worker_0001"
    assert search_policy("uct").choose_line(lines_of(busy))[0].handle == "worker_0002"
    # Every line stagnant: UCT says so, and the Main branches instead.
    stuck = _workers(0.32, 0.32)
    stuck["worker_0004"] = {"status": "finalized", "parent": "worker_0002", "best": {"score": 0.305}}
    line, why = search_policy("uct").choose_line(lines_of(stuck))
    assert line is None
    assert "every line is stagnant" in why
