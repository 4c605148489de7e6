"""The heuristic policy's rules, on their own: guidance forms, task directives, data ranking, reports."""

from __future__ import annotations

from typing import Any

from workers.agents.client import ToolResult
from workers.agents.policies.heuristic import (
    MainHeuristic,
    ReviewerHeuristic,
    WorkerHeuristic,
    diagnose_outputs,
    format_recipe,
    parse_best_line,
    parse_directives,
    parse_guidance,
    parse_recipe,
    rank_dataset,
)


def test_the_documented_guidance_forms_are_understood():
    assert parse_guidance("Please avoid arithmetic-noisy.") == [{"kind": "avoid", "dataset": "arithmetic-noisy"}]
    assert parse_guidance("do not use the dataset arithmetic-tiny; its labels are odd") == [
        {"kind": "avoid", "dataset": "arithmetic-tiny"}
    ]
    assert parse_guidance("Prefer recipe sft lr=0.0005 steps=300.") == [
        {"kind": "prefer", "recipe": {"recipe": "sft", "learning_rate": 0.0005, "max_steps": 300}}
    ]
    assert parse_guidance("branch from exp_0007 please") == [{"kind": "branch", "experiment": "exp_0007"}]
    assert parse_guidance("Stop worker_0003, it is going nowhere.") == [{"kind": "stop", "worker": "worker_0003"}]
    several = parse_guidance("Avoid arithmetic-noisy. Prefer the recipe dpo. Stop the branch worker_0002.")
    assert {a["kind"] for a in several} == {"avoid", "prefer", "stop"}
    # Free text the heuristic cannot act on yields nothing (the Main records it as not understood).
    assert parse_guidance("I think the results look promising") == []
    # "stop worker_N" is a stop, not a dataset to avoid.
    assert [a["kind"] for a in parse_guidance("stop using worker_0004")] == []


def test_task_directives_and_recipes_round_trip():
    task = "Direction: Continue\nCapability: arithmetic\nGoal: prose here.\navoid: a-noisy, a-tiny\nfrom: exp_0004"
    directives = parse_directives(task)
    assert directives["direction"] == "Continue"
    assert directives["avoid"] == "a-noisy, a-tiny"
    assert directives["from"] == "exp_0004"
    recipe = parse_recipe("sft lr=0.002 steps=200 batch_size=32 seed=1 nonsense=3 lr=oops")
    assert recipe == {"recipe": "sft", "learning_rate": 0.002, "max_steps": 200, "batch_size": 32, "seed": 1}
    assert parse_recipe(format_recipe(recipe)) == recipe


def _rows(completion: str, n: int = 5) -> list[dict[str, str]]:
    return [{"prompt": "Question: 2 + 3?\nAnswer:", "completion": completion}] * n


def test_datasets_are_ranked_from_what_any_agent_can_see():
    clean = rank_dataset(
        name="a-clean",
        info={"description": "Synthetic arithmetic problems with verified answers.", "tags": ["verified"]},
        sample=_rows(" 5"),
        rows=6000,
        capability="arithmetic",
    )
    verbose = rank_dataset(
        name="a-verbose",
        info={"description": "arithmetic problems with full-sentence answers.", "tags": []},
        sample=_rows(" The answer is 5."),
        rows=2000,
        capability="arithmetic",
    )
    offtask = rank_dataset(
        name="a-puzzles",
        info={"description": "Spelling and word puzzles.", "tags": ["puzzles"]},
        sample=_rows(" olleh"),
        rows=2000,
        capability="arithmetic",
    )
    crowd = rank_dataset(
        name="a-crowd",
        info={"description": "Crowd-labelled arithmetic problems; labels not audited.", "tags": ["crowd"]},
        sample=_rows(" 5"),
        rows=3000,
        capability="arithmetic",
    )
    prefs = rank_dataset(
        name="a-prefs",
        info={"description": "arithmetic preference pairs", "tags": []},
        sample=[{"prompt": "p", "chosen": " 5", "rejected": " 6"}],
        rows=1000,
        capability="arithmetic",
    )
    assert clean["score"] > crowd["score"] > verbose["score"]
    assert clean["score"] > offtask["score"]
    assert offtask["score"] <= -2
    assert verbose["score"] <= -2
    assert (clean["format"], prefs["format"]) == ("sft", "dpo")


def test_a_worker_summary_cites_its_experiments_and_keeps_refusal_numbers_out():
    state = {
        "direction": "data-screen",
        "predecessors": [{"worker": "worker_0001", "best": None, "experiments": ["exp_0001"]}],
        "results": {
            "exp_0003": {
                "label": "screen a-clean",
                "datasets": ["a-clean"],
                "status": "succeeded",
                "score": 0.12,
                "recipe": {"recipe": "sft", "learning_rate": 0.002, "max_steps": 60, "seed": 0},
            },
            "exp_0005": {"label": "baseline θ0", "datasets": [], "status": "succeeded", "score": 0.0, "recipe": None},
            "exp_0004": {
                "label": "screen a-tiny",
                "datasets": ["a-tiny"],
                "status": "failed",
                "score": None,
                "recipe": {"recipe": "sft", "learning_rate": 0.002, "max_steps": 60},
            },
        },
        "blocked": [
            {
                "label": "screen a-honeypot",
                "code": "submission_refused",
                "reason": "[test_set_access] 107 rows (4.5%) match sealed items",
                "datasets": ["a-honeypot"],
            }
        ],
        "notes": [],
        "comparison": {"difference": 0.1, "ci_low": -0.01, "ci_high": 0.2, "p_value": 0.2},
    }
    summary = WorkerHeuristic().summary(state)
    for handle in ("exp_0003", "exp_0004", "exp_0005", "exp_0001"):
        assert handle in summary  # failures disclosed, the predecessor's work cited as context
    assert "4.5" not in summary
    assert "107" not in summary
    assert "(test_set_access)" in summary
    assert "not significant" in summary
    best = parse_best_line(summary)
    assert best == {
        "experiment": "exp_0003",
        "data": "a-clean",
        "recipe": "sft",
        "lr": "0.002",
        "steps": "60",
        "seed": "0",
        "score": 0.12,
    }


def test_a_review_report_separates_findings_uncertainties_and_violations():
    state = {
        "experiments": {
            "exp_0002": {
                "owner": "worker_0001",
                "kind": "train_eval",
                "status": "succeeded",
                "score": 0.3,
                "data": ["data_0001"],
                "hyperparameters": {"learning_rate": 0.002},
            },
            "exp_0004": {
                "owner": "worker_0002",
                "kind": "train_eval",
                "status": "succeeded",
                "score": 0.1,
                "data": ["data_0003"],
                "hyperparameters": {"learning_rate": 0.004},
            },
            "exp_0005": {
                "owner": "worker_0001",
                "kind": "eval_only",
                "status": "succeeded",
                "score": 0.15,
                "data": [],
                "hyperparameters": {},
            },
        },
        "overlaps": {"data_0003": {"rows_matched": 3, "over": True, "samples": ["s1"], "name": "a-honeypot"}},
        "ranked": ["exp_0002", "exp_0004"],
        "comparisons": [
            {"a": "exp_0004", "b": "exp_0002", "difference": 0.2, "ci_low": 0.1, "ci_high": 0.3, "p_value": 0.001,
             "n_common": 100},
            {"a": "exp_0005", "b": "exp_0002", "difference": 0.15, "ci_low": -0.02, "ci_high": 0.3, "p_value": 0.1,
             "n_common": 100},
        ],
    }  # fmt: skip
    report = ReviewerHeuristic().report(state)
    assert report["supported_findings"][0].startswith("exp_0002 (worker_0001")
    assert any("exp_0002 vs exp_0004" in f for f in report["supported_findings"])
    assert any("not significant" in u for u in report["uncertainties"])
    assert report["regressions"] == ["exp_0004 (worker_0002) scores 0.1 below the θ0 baseline 0.15"]
    assert report["protocol_violations"]
    assert report["observations"][0]["subcategory"] == "test_set_access"
    assert "no replicate of exp_0002 with another seed" in report["missing_comparisons"]
    assert report["recommendations"][0].startswith("continue from exp_0002")
    assert report["experiments"] == ["exp_0002", "exp_0004", "exp_0005"]


def test_the_run_seed_is_the_first_training_seed():
    class View:
        briefing = {"policy": {"seed": 7, "heuristic": {"train_steps": 90}}}

    state = {"recipe": {}}
    recipe = WorkerHeuristic()._recipe(View(), state)
    assert (recipe["seed"], recipe["max_steps"]) == (7, 90)
    View.briefing = {"policy": {}}  # a run started before the seed was recorded
    assert WorkerHeuristic()._recipe(View(), state)["seed"] == 0


def _plan(policy: dict, direction: str, chosen: list[str]) -> list[dict]:
    class View:
        briefing = {"policy": policy}

    state = {"direction": direction, "chosen": chosen, "source": None, "recipe": {"learning_rate": 0.0005},
             "predecessors": [], "notes": []}  # fmt: skip
    WorkerHeuristic()._plan(View(), state)
    return state["plan"]


def test_the_fixed_recipe_switch_trains_every_direction_with_one_sft_recipe():
    heuristic = {"train_steps": 90, "screen_steps": 15, "learning_rate": 0.002}
    normal = {d: _plan({"heuristic": heuristic}, d, ["a-clean", "a-more"]) for d in ("data-screen", "recipe-sweep")}
    assert {p["recipe"]["max_steps"] for p in normal["data-screen"] if p["recipe"]} == {15}
    assert [p["recipe"]["learning_rate"] for p in normal["recipe-sweep"]] == [0.0005, 0.001]  # from the task lr
    fixed = {"heuristic": {**heuristic, "fixed_recipe": True}}
    plans = [p for d in ("data-screen", "recipe-sweep", "dpo") for p in _plan(fixed, d, ["a-clean", "a-more"])]
    recipes = {(p["recipe"]["recipe"], p["recipe"]["learning_rate"], p["recipe"]["max_steps"]) for p in plans
               if p["recipe"]}  # fmt: skip
    assert recipes == {("sft", 0.002, 90)}  # neither the screening steps nor the task's recipe apply
    assert len(_plan(fixed, "recipe-sweep", ["a-clean"])) == 1  # no sweep


def test_every_training_follows_the_runs_learning_rate_schedule():
    heuristic = {"train_steps": 90, "screen_steps": 15, "learning_rate": 0.002, "lr_scheduler_type": "constant"}
    plans = [p for d in ("data-screen", "recipe-sweep", "dpo", "verify")
             for p in _plan({"heuristic": heuristic}, d, ["a-clean", "a-more"])]  # fmt: skip
    trainings = [p["recipe"] for p in plans if p["recipe"]]
    assert len(trainings) >= 5
    assert {r["lr_scheduler_type"] for r in trainings} == {"constant"}
    # The training default (cosine) is not written into the recipe; the run's setting is.
    default = _plan({"heuristic": {**heuristic, "lr_scheduler_type": "cosine"}}, "recipe-sweep", ["a-clean"])
    assert all("lr_scheduler_type" not in p["recipe"] for p in default)
    # A schedule the task names wins, as every other recipe setting of the task does.
    state = {"recipe": {"lr_scheduler_type": "linear"}}

    class View:
        briefing = {"policy": {"heuristic": heuristic}}

    assert WorkerHeuristic()._recipe(View(), state)["lr_scheduler_type"] == "linear"


def test_the_rank_data_switch_keeps_search_order_and_sets_nothing_aside():
    class View:
        briefing = {"policy": {"heuristic": {"rank_data": False}}, "benchmark": {"task": "arithmetic"}}

        def call(self, name, args=None, *, if_match=None):
            if name == "hf_search_datasets":
                data = {"datasets": [{"id": n, "description": d, "tags": []} for n, d in
                                     (("a-puzzles", "word puzzles"), ("a-clean", "arithmetic problems"))]}  # fmt: skip
            elif name == "hf_dataset_sample":
                data = {"rows": [{"prompt": "Q", "completion": " 4"}]}
            else:
                data = {"splits": [{"num_rows": 2000}]}
            return ToolResult(name=name, status=200, data=data)

    state = {"capability": "arithmetic", "datasets": [], "avoid": [], "notes": [], "direction": "data-screen"}
    WorkerHeuristic()._discover(View(), state)
    assert [c["name"] for c in state["candidates"]] == ["a-puzzles", "a-clean"]  # search order, the off-task set kept
    assert WorkerHeuristic()._choose(View(), state) == ["a-puzzles", "a-clean"]
    View.briefing = {"policy": {}, "benchmark": {"task": "arithmetic"}}
    ranked = {"capability": "arithmetic", "datasets": [], "avoid": [], "notes": [], "direction": "data-screen"}
    WorkerHeuristic()._discover(View(), ranked)
    assert WorkerHeuristic()._choose(View(), ranked) == ["a-clean"]  # ranked: the off-task set is set aside


def test_the_reviewer_reads_what_wrong_outputs_look_like():
    counts = diagnose_outputs([("57", True), ("58", False), ("110<|endoftext|>", False), (" 63 and then", False),
                               ("", False)])  # fmt: skip
    assert counts == {"n": 5, "wrong": 4, "run_on": 2, "well_formed": 1}


def _diagnosed_state(diagnosis: dict[str, int]) -> dict[str, Any]:
    return {
        "experiments": {"exp_0002": {"owner": "worker_0001", "kind": "train_eval", "status": "succeeded", "score": 0.2,
                                     "data": ["data_0001"], "hyperparameters": {"learning_rate": 0.002}}},
        "overlaps": {"data_0001": {"rows_matched": 0, "over": False, "samples": [], "name": "some-export"}},
        "ranked": ["exp_0002"], "comparisons": [], "diagnoses": {"exp_0002": diagnosis},
    }  # fmt: skip


def test_run_on_outputs_become_a_revise_recommendation_naming_the_data():
    report = ReviewerHeuristic().report(_diagnosed_state({"n": 50, "wrong": 40, "run_on": 38, "well_formed": 2}))
    stop = [r for r in report["recommendations"] if "do not stop" in r]
    assert stop
    assert "drop some-export (its completions" in stop[0]
    assert any("38 of 40 wrong feedback outputs" in f for f in report["supported_findings"])


def test_well_formed_wrong_outputs_ask_for_other_data():
    report = ReviewerHeuristic().report(_diagnosed_state({"n": 50, "wrong": 30, "run_on": 1, "well_formed": 29}))
    assert any(r.startswith("search for other training data") for r in report["recommendations"])
    assert not any("do not stop" in r for r in report["recommendations"])


def test_extra_search_terms_count_as_on_task():
    info = {"description": "Two-digit addition drills.", "tags": ["addition", "verified"]}
    sample = [{"prompt": "Q", "completion": " 5"}] * 3
    plain = rank_dataset(name="addition-drills", info=info, sample=sample, rows=4000, capability="arithmetic")
    wider = rank_dataset(name="addition-drills", info=info, sample=sample, rows=4000, capability="arithmetic",
                         terms=["addition"])  # fmt: skip
    assert "on task" not in plain["reasons"]
    assert "on task" in wider["reasons"]
    assert wider["score"] > plain["score"]


def test_the_main_agent_counts_the_wall_clock_as_budget_too():
    def low(accel_left: float, wall_left: float) -> bool:
        policy = MainHeuristic()
        policy.quota = {
            "accelerator_seconds": {"budget": 1000, "reserved_final": 200, "left": accel_left},
            "wall_clock_seconds": {"budget": 1200, "elapsed": 1200 - wall_left, "left": wall_left},
        }
        return policy._budget_low()

    assert not low(accel_left=700, wall_left=1000)
    assert low(accel_left=100, wall_left=1000)  # under 15 % of the 800 s left after the reserve
    assert low(accel_left=700, wall_left=150)  # under 15 % of the 1,200 s wall clock
    assert not low(accel_left=700, wall_left=200)
