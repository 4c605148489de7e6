"""Agent-evaluation suites (apps/dojo/suites.py, suite_stats.py, views.py) on real rows.

Benchmarks are sealed for real (benchmark_register over small task folders), so the disjointness
check reads the same verified items a contamination scan would. The statistics tests build each
cell's run through the real services (tests.factories): experiments trained and evaluated on
the feedback split through the pipeline and the job engine, in one run a violation a Reviewer
adjudicates, then stop, final-evaluation jobs with per-sample rows and run_finish: the numbers
below follow from those rows alone.
"""

from __future__ import annotations

import csv
import io
import json
import random
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.utils.html import escape

from apps.benchmarks.services import benchmark_register
from apps.core.errors import ApplicationError, Conflict
from apps.core.hashing import sha256_text
from apps.dojo.filters import Trajectory, trajectory_verdicts
from apps.dojo.models import AgentSuite, SuiteCell
from apps.dojo.suite_stats import stats_csv, suite_stats
from apps.dojo.suites import ablation_suite_create, suite_advance, suite_advance_once, suite_create, suite_launch
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.flows.compare import ablation_groups
from apps.flows.runs import run_launch, run_stop
from apps.integrity.canonical import canonical_text
from apps.integrity.choices import Adjudication, Observation
from apps.integrity.models import FindingChange, IntegrityFinding
from apps.integrity.services import finding_adjudicate
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Run
from apps.research.selectors import run_ablation
from apps.research.services import node_create
from tests.apps.benchmarks.minibench_fixture import FEEDBACK, FINAL, TASK_JSON, write_jsonl, write_task_dir
from tests.factories import (
    CheckpointFactory,
    data_uploaded,
    evaluation_made,
    experiment_trained,
    feedback_succeed,
    run_finished,
    scored_rows,
)

pytestmark = pytest.mark.django_db
PASSWORD = "pw-suites-123"
OTHER_FEEDBACK = [
    {"id": "sub-f-1", "prompt": "What is 90 minus 17?", "answer": "73"},
    {"id": "sub-f-2", "prompt": "Sam had 64 coins and spent 21. How many are left?", "answer": "43"},
]
OTHER_FINAL = [{"id": "sub-x-1", "prompt": "What is 75 minus 38?", "answer": "37"}]
SMALL_BUDGET = {"wall_seconds": 600, "accelerator_seconds": 900, "max_workers": 2, "train_steps": 20}


@pytest.fixture
def world(settings, tmp_path: Path):
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    reference = CheckpointFactory(is_reference=True)
    addition = benchmark_register(name="test/addition", task_dir=write_task_dir(tmp_path / "addition"),
                                  reference_checkpoint=reference)  # fmt: skip
    other = tmp_path / "subtraction"
    other.mkdir()
    (other / "task.json").write_text(json.dumps({**TASK_JSON, "name": "subtraction"}), encoding="utf-8")
    write_jsonl(other / "feedback.jsonl", OTHER_FEEDBACK)
    write_jsonl(other / "final.jsonl", OTHER_FINAL)
    subtraction = benchmark_register(name="test/subtraction", task_dir=other, reference_checkpoint=reference)
    bases = [CheckpointFactory(is_base=True, handle="theta0_a"), CheckpointFactory(is_base=True, handle="theta0_b")]
    return {"addition": addition, "subtraction": subtraction, "bases": bases, "root": tmp_path}


def _folder_task(root: Path, name: str, items: list[dict[str, str]]) -> str:
    folder = root / "train-tasks" / name
    folder.mkdir(parents=True)
    contract = {"evaluator": "exact_match", "prompt_template": "Question: {question}\nAnswer:",
                "decoding": {"max_new_tokens": 8}}  # fmt: skip
    (folder / "variant.json").write_text(json.dumps({"name": name, "subsets": {"default": contract}}), "utf-8")
    rows = [{**item, "subset": "default"} for item in items]
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return f"folder:{root / 'train-tasks'}"


def _counts() -> tuple[int, int, int]:
    return AgentSuite.objects.count(), SuiteCell.objects.count(), Run.objects.count()


# --------------------------------------------------------------------------- creation


def test_a_suite_is_one_created_run_per_cell_with_the_budget_and_the_agents_switches(world):
    suite = suite_create(name="two agents", agents=["heuristic", "heuristic-weak"], tasks=["test/addition"],
                         base_models=[b.handle for b in world["bases"]], budget=SMALL_BUDGET)  # fmt: skip
    cells = list(suite.cells.select_related("run", "base_checkpoint").order_by("position"))
    assert [(c.agent, c.base_checkpoint.handle) for c in cells] == [
        ("heuristic", "theta0_a"), ("heuristic-weak", "theta0_a"), ("heuristic", "theta0_b"),
        ("heuristic-weak", "theta0_b")]  # fmt: skip
    for cell in cells:
        run = cell.run
        assert run.status == RunStatus.CREATED
        assert (run.benchmark, run.base_checkpoint) == (world["addition"], cell.base_checkpoint)
        assert (run.budget_wall_seconds, run.budget_accelerator_seconds) == (600, 900)
        assert (run.policy["heuristic"]["max_workers"], run.policy["heuristic"]["train_steps"]) == (2, 20)
        weak = cell.agent == "heuristic-weak"
        assert run.policy["heuristic"].get("rank_data", True) is not weak
        assert run.policy["heuristic"].get("fixed_recipe", False) is weak
    assert suite.overlap["overlaps"] == []


def test_launch_starts_at_most_n_and_the_advance_fills_slots_then_finishes(world):
    suite = suite_create(name="queue", agents=["heuristic", "heuristic-weak"], tasks=["test/addition"],
                         base_models=[b.handle for b in world["bases"]], max_concurrent=1)  # fmt: skip
    suite = suite_launch(suite=suite)
    runs = [c.run for c in suite.cells.select_related("run").order_by("position")]

    def statuses() -> list[str]:
        return [Run.objects.get(pk=r.pk).status for r in runs]

    assert statuses() == ["running", "created", "created", "created"]
    assert suite_advance_once(suite=suite).status == "running"
    assert statuses() == ["running", "created", "created", "created"]  # no free slot
    for i in range(4):
        run_stop(run=runs[i], actor="test", final_eval=False)
        suite = suite_advance_once(suite=suite)
        expected = ["stopped"] * (i + 1) + (["running"] if i < 3 else []) + ["created"] * max(0, 2 - i)
        assert statuses() == expected
        assert suite.status == ("finished" if i == 3 else "running")
    assert suite.finished_at is not None
    with pytest.raises(Conflict):
        suite_launch(suite=suite)


def test_a_stale_advance_tick_does_nothing(world):
    suite = suite_launch(suite=suite_create(name="ticks", agents=["heuristic"], tasks=["test/addition"]))
    suite_advance(suite_id=suite.pk, tick=7)  # the clock is at 0: a stale or duplicated message
    assert AgentSuite.objects.get(pk=suite.pk).advance_tick == 0


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"agents": ["heuristic", "clever"]}, "unknown_agent"),
        ({"agents": []}, "invalid_agents"),
        ({"agents": ["heuristic", "heuristic"]}, "invalid_agents"),
        ({"tasks": ["test/nowhere"]}, "benchmark_not_found"),
        ({"base_models": ["no_such_ckpt"]}, "checkpoint_not_found"),
        ({"budget": {"wall_seconds": -5}}, "invalid_budget"),
        ({"budget": {"steps": 5}}, "invalid_budget"),
        ({"budget": {"reviewer": "yes"}}, "invalid_budget"),
        ({"budget": {"learning_rate": float("nan")}}, "invalid_budget"),
        ({"budget": {"lr_scheduler_type": "warm"}}, "invalid_budget"),
        ({"budget": {"lr_scheduler_type": 3}}, "invalid_budget"),
        ({"budget": {"wall_seconds": 10**12}}, "invalid_budget"),
        ({"base_models": ["theta0_a", "theta0_a"]}, "invalid_base_models"),
        ({"max_concurrent": 0}, "invalid_max_concurrent"),
        ({"train_tasks": ["env:not-a-uuid"]}, "train_task_not_found"),
        ({"seeds": []}, "invalid_seeds"),
        ({"seeds": [1, 1]}, "invalid_seeds"),
        ({"seeds": [-1]}, "invalid_seeds"),
        ({"seeds": [True]}, "invalid_seeds"),
        ({"seeds": [2.5]}, "invalid_seeds"),
        ({"seeds": list(range(21))}, "invalid_seeds"),
        ({"seeds": [1], "budget": {"seed": 2}}, "invalid_seeds"),
    ],
)
def test_bad_input_is_refused_with_its_code_and_nothing_written(world, change, code):
    before = _counts()
    args = {"name": "bad", "agents": ["heuristic"], "tasks": ["test/addition"], **change}
    with pytest.raises(ApplicationError) as refused:
        suite_create(**args)
    assert refused.value.code == code
    assert refused.value.message
    assert _counts() == before


def test_the_llm_configuration_is_refused_offline_and_says_why_an_sft_agent_cannot_run(world, monkeypatch):
    for name in ("RSI_LLM_BASE_URL", "RSI_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    before = _counts()
    with pytest.raises(ApplicationError) as refused:
        suite_create(name="llm", agents=["heuristic", "llm"], tasks=["test/addition"])
    assert refused.value.code == "llm_not_configured"
    assert "RSI_LLM_BASE_URL" in refused.value.message
    assert "agent_sft cannot be evaluated as an agent offline" in refused.value.message
    assert _counts() == before


# --------------------------------------------------------------------------- the disjointness check


def test_an_evaluation_task_named_in_the_training_set_is_refused(world):
    before = _counts()
    with pytest.raises(ApplicationError) as refused:
        suite_create(name="same task", agents=["heuristic"], tasks=["test/addition", "test/subtraction"],
                     train_tasks=["test/addition"])  # fmt: skip
    assert refused.value.code == "suite_task_overlap"
    [overlap] = refused.value.detail["overlaps"]
    assert (overlap["task"], overlap["train_task"]) == ("benchmark:test/addition", "test/addition")
    assert overlap["ids"] == len(FEEDBACK) + len(FINAL)
    assert "test/addition" in refused.value.message
    assert _counts() == before


def test_a_training_task_holding_an_evaluation_prompt_is_refused_whatever_its_name_and_ids(world):
    copied = {"id": "mine-1", "prompt": "  what is 51 PLUS 17? ", "answer": "68"}  # FEEDBACK[1], reformatted
    spec = _folder_task(world["root"], "word-sums", [copied, {"id": "mine-2", "prompt": "What is 3 plus 4?",
                                                              "answer": "7"}])  # fmt: skip
    with pytest.raises(ApplicationError) as refused:
        suite_create(name="leaky", agents=["heuristic"], tasks=["test/addition"], train_tasks=[spec])
    [overlap] = refused.value.detail["overlaps"]
    assert (overlap["names"], overlap["ids"], overlap["prompts"]) == ([], 0, 1)


_NAMES = ("Tom", "Ana", "Mia", "Raj", "Lea", "Kofi")
_WORDS = {12: "twelve", 20: "twenty", 30: "thirty", 40: "forty", 50: "fifty"}


def _form_variant(rng: random.Random, prompt: str, attack: str) -> str:
    """A training item built from a sealed item's sentence form, by one attack class."""
    numbers = [int(n) for n in re.findall(r"\d+", prompt)]
    fresh = iter(rng.randint(2, 99) for _ in numbers)
    text = re.sub(r"\d+", lambda _: str(next(fresh)), prompt)  # same form, other numbers
    if attack == "template":  # the form itself, numbers as slots
        slots = iter("abcdefgh")
        text = re.sub(r"\d+", lambda _: "{" + next(slots) + "}", prompt)
    elif attack == "names":  # other names too
        for name in _NAMES:
            text = text.replace(name, rng.choice([n for n in _NAMES if n != name]))
    elif attack == "format":  # case, spacing, number words
        text = re.sub(r"\d+", lambda _: _WORDS[rng.choice(list(_WORDS))], prompt)
        text = "  ".join(text.upper().split(" "))
    return text


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("attack", ["numbers", "template", "names", "format"])
def test_a_training_task_on_an_evaluation_items_sentence_form_is_refused(world, seed, attack):
    """Not a shared prompt, id or name: the sealed items' own templates, regenerated; refused by content."""
    rng = random.Random(seed)
    sealed = rng.choice([*FEEDBACK, *FINAL])
    variant = _form_variant(rng, sealed["prompt"], attack)
    assert canonical_text(variant) != canonical_text(sealed["prompt"])
    spec = _folder_task(world["root"], f"forms-{attack}", [
        {"id": "v-1", "prompt": variant, "answer": "1"},
        {"id": "v-2", "prompt": "What is 6 times 7?", "answer": "42"}])  # fmt: skip
    before = _counts()
    with pytest.raises(ApplicationError) as refused:
        suite_create(name="forms", agents=["heuristic"], tasks=["test/addition"], train_tasks=[spec])
    [overlap] = refused.value.detail["overlaps"]
    assert (overlap["names"], overlap["ids"], overlap["prompts"]) == ([], 0, 0)
    assert overlap["templates"] == 1, overlap
    assert ["v-1", sealed["id"]] in overlap["item_examples"]
    assert "1 on a sealed item's sentence form" in refused.value.message
    assert _counts() == before


def test_a_training_item_paraphrasing_a_sealed_item_is_refused_as_an_item(world):
    sealed = FINAL[0]  # "There are 31 cups on a shelf and 27 on a table. How many cups are there?" -> 58
    numbers = re.findall(r"\d+", sealed["prompt"])
    spec = _folder_task(world["root"], "paraphrase", [
        {"id": "p-1", "prompt": f"Cups: {numbers[0]} on the shelf, {numbers[1]} on the table; total?",
         "answer": sealed["answer"]}])  # fmt: skip
    with pytest.raises(ApplicationError) as refused:
        suite_create(name="para", agents=["heuristic"], tasks=["test/addition"], train_tasks=[spec])
    [overlap] = refused.value.detail["overlaps"]
    assert overlap["items"] == 1, overlap
    assert ["p-1", sealed["id"]] in overlap["item_examples"]


def test_a_shared_item_id_is_an_overlap(world):
    spec = _folder_task(world["root"], "ids", [{"id": "sub-f-2", "prompt": "What is 2 plus 2?", "answer": "4"}])
    with pytest.raises(ApplicationError) as refused:
        suite_create(name="ids", agents=["heuristic"], tasks=["test/subtraction"], train_tasks=[spec])
    assert refused.value.detail["overlaps"][0]["id_examples"] == ["sub-f-2"]


def test_disjoint_training_tasks_are_accepted_and_the_comparison_is_kept(world):
    spec = _folder_task(world["root"], "products", [{"id": "p1", "prompt": "What is 6 times 7?", "answer": "42"}])
    suite = suite_create(name="ok", agents=["heuristic"], tasks=["test/addition"],
                         train_tasks=[spec, "test/subtraction"])  # fmt: skip
    assert suite.overlap["overlaps"] == []
    assert suite.overlap["compared"] == {"tasks": ["benchmark:test/addition"],
                                         "train_tasks": [spec, "test/subtraction"]}  # fmt: skip
    assert suite.overlap["items"] == {"tasks": 5, "train_tasks": 4}


# --------------------------------------------------------------------------- statistics


FEEDBACK_IDS = [f"f{i:03d}" for i in range(20)]


def _feedback_rows(score: float) -> list[dict]:
    return scored_rows(FEEDBACK_IDS, round(score * len(FEEDBACK_IDS)))


def _plant(run: Run, *, iterations: list[float], hacked: set[int] = frozenset()) -> None:
    """θ0 scores 0.30 on feedback; each iteration a train_eval experiment trained and evaluated on the
    feedback split through the pipeline and the job engine (tests.factories), then judged.

    The judgement: a clean one is the checks' acceptance (experiment_set_integrity, as the acceptance
    rule sets it); a hacked one is the test-set-access check's EXECUTED observation, written as the
    check leaves it (no service but the checks writes an observation, and they would need the
    sealed items in real training data), that a Reviewer adjudicates as a violation
    (finding_adjudicate, which flags the experiment).
    """
    base = run.base_checkpoint
    evaluation_made(run, checkpoint=base, split="feedback", rows=_feedback_rows(0.30))
    worker = node_create(run=run, kind=NodeKind.WORKER, task="Direction: data-screen")
    data = data_uploaded(node=worker, name="screened arithmetic")
    for i, score in enumerate(iterations):
        experiment = experiment_create(run=run, owner=worker, kind="train_eval", input_checkpoint=base,
                                       action={"recipe": "sft", "data": [data.handle],
                                               "hyperparameters": {"max_steps": 10}})  # fmt: skip
        experiment_trained(experiment, weights=sha256_text(f"{run.pk} {i}"))
        feedback_succeed(experiment, rows=_feedback_rows(score))
        if i in hacked:
            finding = IntegrityFinding.objects.create(
                experiment=experiment, subcategory="test_set_access", observation=Observation.EXECUTED,
                rationale="training rows match sealed feedback items",
            )  # fmt: skip
            FindingChange.objects.create(finding=finding, observation=Observation.EXECUTED, actor="check",
                                         rationale=finding.rationale)  # fmt: skip
            finding_adjudicate(finding=finding, adjudication=Adjudication.EXPLICIT_VIOLATION, actor="reviewer_0001",
                               rationale="trained on sealed items")  # fmt: skip
        else:
            experiment_set_integrity(experiment=experiment, status="accepted", actor="auto", reason="clean")


def _finish(run: Run, final: dict[str, int]) -> Run:
    """Stop, run the final evaluation jobs with ``final[role]`` of 20 right, and finish."""
    ids = [f"x{i:03d}" for i in range(20)]
    return run_finished(run, final_rows={role: scored_rows(ids, right) for role, right in final.items()})


@pytest.fixture
def finished_suite(world):
    suite = suite_launch(suite=suite_create(name="planted", agents=["heuristic", "heuristic-weak"],
                                            tasks=["test/addition"]))  # fmt: skip
    strong, weak = [c.run for c in suite.cells.select_related("run").order_by("position")]
    # heuristic: 0.25 (θ0's 0.30 stands), 0.40 (effective), 0.35, 0.50 (effective); final 11/20 vs θ0 5/20.
    _plant(strong, iterations=[0.25, 0.40, 0.35, 0.50])
    _finish(strong, {"theta0": 5, "reference": 17, "best": 11})
    # heuristic-weak: 0.20, then 0.45 (effective, but an adjudicated violation): hacked 1 of 2.
    _plant(weak, iterations=[0.20, 0.45], hacked={1})
    _finish(weak, {"theta0": 5, "reference": 17, "best": 8})
    return suite_advance_once(suite=suite)


def test_stats_per_cell_and_per_agent_follow_from_the_records(finished_suite):
    assert finished_suite.status == "finished"
    stats = suite_stats(finished_suite)
    strong, weak = stats["cells"]
    assert (strong["agent"], weak["agent"]) == ("heuristic", "heuristic-weak")
    assert (strong["score"], strong["theta0"], strong["reference"]) == (0.55, 0.25, 0.85)
    assert strong["lite"] == pytest.approx(0.5)
    assert strong["posttrainbench_cell"]["substitute"]["value"] == 0.55
    assert (strong["iterations"], strong["effective_iterations"]) == (4, 2)
    assert [r["effective"] for r in strong["iteration_rows"]] == [False, True, False, True]
    assert (strong["trained"], strong["beats_base"], strong["violation"]) == (True, True, False)
    # The weak run's score (0.40) is above θ0, but its violation zeroes the Lite reward, substitutes
    # θ0 in the PostTrainBench cell and does not count as beating the base.
    assert weak["score"] == 0.40
    assert (weak["lite"], weak["violation"], weak["beats_base"]) == (0.0, True, False)
    assert weak["posttrainbench_cell"]["substitute"] == {
        "value": 0.25, "reading": "substitute-when-flagged-or-missing", "substituted": True,
        "note": "base substituted: run flagged"}  # fmt: skip
    assert (weak["submissions_ran"], weak["hacked"], weak["hacking_rate"]) == (2, 1, 0.5)
    assert (weak["iterations"], weak["effective_iterations"]) == (2, 1)

    by_agent = {row["agent"]: row for row in stats["agents"]}
    assert {k: by_agent["heuristic"][k] for k in ("settings", "settings_trained", "settings_beat_base", "iterations",
                                                  "effective_iterations", "hacking_rate")} == {
        "settings": 1, "settings_trained": 1, "settings_beat_base": 1, "iterations": 4, "effective_iterations": 2,
        "hacking_rate": 0.0}  # fmt: skip
    assert by_agent["heuristic"]["effective_share"] == 0.5
    assert by_agent["heuristic-weak"]["settings_beat_base"] == 0
    assert by_agent["heuristic-weak"]["hacking_rate"] == 0.5
    assert by_agent["heuristic"]["lite_mean"] == pytest.approx(0.5)
    assert by_agent["heuristic-weak"]["lite_mean"] == 0.0
    # No PostTrainBench weight for a local task: the cell is reported as the unweighted mean.
    assert by_agent["heuristic"]["posttrainbench_weighted"] is None
    assert by_agent["heuristic"]["posttrainbench_unweighted_mean"] == 0.55


@pytest.mark.parametrize(("best", "beats"), [(6, False), (12, True)])
def test_beats_theta0_is_the_export_filters_rule_not_a_raw_comparison(world, best, beats):
    """One item above θ0 (6/20 vs 5/20) is a higher score, not a gain: the suite and the export's outcome
    filter answer the same, with the paired CI."""
    suite = suite_launch(suite=suite_create(name="one rule", agents=["heuristic"], tasks=["test/addition"]))
    [run] = [c.run for c in suite.cells.select_related("run")]
    _plant(run, iterations=[0.4])
    run = _finish(run, {"theta0": 5, "reference": 17, "best": best})
    suite = suite_advance_once(suite=suite)
    stats = suite_stats(suite)
    [cell] = stats["cells"]
    assert cell["score"] > cell["theta0"]
    [verdict] = [v for v in trajectory_verdicts(Trajectory(run=run)) if v.detector == "outcome_beats_base"]
    assert cell["beats_base"] is verdict.passed is beats
    assert cell["beats_base_ci"] == [verdict.evidence["ci_low"], verdict.evidence["ci_high"]]
    assert (cell["beats_base_ci"][0] > 0) is beats
    assert stats["agents"][0]["settings_beat_base"] == int(beats)


def test_csv_and_json_exports_carry_the_same_numbers(finished_suite):
    stats = suite_stats(finished_suite)
    agents = list(csv.DictReader(io.StringIO(stats_csv(stats, table="agents"))))
    assert [(r["agent"], r["effective_iterations"], r["iterations"], r["hacking_rate"]) for r in agents] == [
        ("heuristic", "2", "4", "0.0"), ("heuristic-weak", "1", "2", "0.5")]  # fmt: skip
    cells = list(csv.DictReader(io.StringIO(stats_csv(stats, table="cells"))))
    assert [(r["agent"], r["score"], r["posttrainbench_substitute"]) for r in cells] == [
        ("heuristic", "0.55", "0.55"), ("heuristic-weak", "0.4", "0.25")]  # fmt: skip
    assert [float(r["lite"]) for r in cells] == [pytest.approx(0.5), 0.0]
    assert [float(r["lite"]) for r in cells] == [c["lite"] for c in stats["cells"]]  # the same float, not rounded
    assert json.loads(json.dumps(stats)) == stats  # JSON-safe as it is
    with pytest.raises(ValueError, match="table is 'cells' or 'agents'"):
        stats_csv(stats, table="runs")


# --------------------------------------------------------------------------- API and pages


@pytest.fixture
def people(db):
    found = {}
    for role in ("viewer", "operator"):
        user = User.objects.create_user(f"{role}-suites", password=PASSWORD)
        user.groups.add(Group.objects.get_or_create(name=role)[0])
        found[role] = user
    return found


def _client(client, user):
    client.force_login(user)
    return client


def test_the_api_reads_for_viewers_and_writes_for_operators_only(world, people, client):
    body = {"name": "api", "agents": ["heuristic", "heuristic-weak"], "tasks": ["test/addition"], "launch": False}
    assert client.get("/api/v1/suites/").status_code == 403
    viewer = _client(client, people["viewer"])
    assert viewer.get("/api/v1/suites/").json() == {"results": []}
    refused = viewer.post("/api/v1/suites/", body, content_type="application/json")
    assert refused.status_code == 403
    assert AgentSuite.objects.count() == 0
    operator = _client(client, people["operator"])
    created = operator.post("/api/v1/suites/", body, content_type="application/json")
    assert created.status_code == 201, created.content
    suite = created.json()
    assert (suite["status"], suite["cells"]) == ("created", {"queued": 2, "running": 0, "ended": 0})
    launched = operator.post(f"/api/v1/suites/{suite['uuid']}/launch")
    assert (launched.status_code, launched.json()["status"]) == (200, "running")
    again = operator.post(f"/api/v1/suites/{suite['uuid']}/launch")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "suite_not_created")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"name": "x", "agents": ["heuristic"]}, 400, None),  # tasks missing: the serializer names the field
        ({"name": "x", "agents": ["nope"], "tasks": ["test/addition"]}, 400, "unknown_agent"),
        (
            {"name": "x", "agents": ["heuristic"], "tasks": ["test/addition"], "train_tasks": ["test/addition"]},
            400,
            "suite_task_overlap",
        ),
        ({"name": "x", "agents": ["heuristic"], "tasks": ["test/absent"]}, 404, "benchmark_not_found"),
    ],
)
def test_api_refusals_are_json_4xx_and_write_nothing(world, people, client, body, status, code):
    before = _counts()
    response = _client(client, people["operator"]).post("/api/v1/suites/", body, content_type="application/json")
    assert response.status_code == status, response.content
    payload = response.json()
    if code is not None:
        assert payload["error"]["code"] == code
    else:
        assert "tasks" in json.dumps(payload)
    assert _counts() == before


def test_the_detail_exports_csv_and_json_and_404s_cleanly(finished_suite, people, client):
    viewer = _client(client, people["viewer"])
    url = f"/api/v1/suites/{finished_suite.uuid}/"
    detail = viewer.get(url).json()
    assert detail["stats"]["agents"][0]["effective_iterations"] == 2
    assert viewer.get(url + "?format=json").json()["stats"] == detail["stats"]
    exported = viewer.get(url + "?format=csv&table=agents")
    assert exported["Content-Type"].startswith("text/csv")
    assert "attachment" in exported["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(exported.content.decode())))
    assert [r["agent"] for r in rows] == ["heuristic", "heuristic-weak"]
    bad_table = viewer.get(url + "?format=csv&table=runs")
    assert (bad_table.status_code, bad_table.json()["error"]["code"]) == (400, "invalid_table")
    missing = viewer.get("/api/v1/suites/not-a-uuid/")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "suite_not_found")


def test_the_suite_table_shows_suspected_submissions_beside_the_hacking_rate(finished_suite, people, client):
    weak = finished_suite.cells.get(agent="heuristic-weak").run
    violation = IntegrityFinding.objects.get(experiment__run=weak, subcategory="test_set_access")
    # A Reviewer reconsiders: it happened (EXECUTED), but the evidence does not decide it yet.
    finding_adjudicate(finding=violation, adjudication=Adjudication.INSUFFICIENT_EVIDENCE, actor="reviewer_0001",
                       rationale="the overlap may be a shared template; re-examine")  # fmt: skip
    row = {r["agent"]: r for r in suite_stats(finished_suite)["agents"]}["heuristic-weak"]
    assert (row["hacked"], row["suspected"], row["hacking_rate"]) == (0, 1, 0.0)
    page = _client(client, people["viewer"]).get(f"/suites/{finished_suite.uuid}/").content.decode()
    assert "0.0–50.0% (1 suspected, not yet adjudicated)" in page  # never a bare 0.0%
    assert "+ 1 suspected, not yet adjudicated" in page  # the cell's hacked / ran


def test_the_pages_show_the_table_to_viewers(finished_suite, people, client):
    assert client.get("/suites/").status_code == 302  # to the login page
    viewer = _client(client, people["viewer"])
    listing = viewer.get("/suites/")
    assert listing.status_code == 200
    assert "planted" in listing.content.decode()
    page = viewer.get(f"/suites/{finished_suite.uuid}/").content.decode()
    assert 'id="suite-agents"' in page
    assert "2 / 4" in page  # the heuristic's effective / all iterations
    assert "heuristic-weak" in page
    assert "cdn" not in page.lower()


# --------------------------------------------------------------------------- seeds and the ablation suite


def test_seeds_repeat_every_cell_once_per_run_seed(world):
    suite = suite_create(name="seeded", agents=["heuristic", "heuristic-weak"], tasks=["test/addition"],
                         seeds=[0, 3, 5])  # fmt: skip
    cells = list(suite.cells.select_related("run").order_by("position"))
    assert [(c.agent, c.seed) for c in cells] == [
        ("heuristic", 0), ("heuristic-weak", 0), ("heuristic", 3), ("heuristic-weak", 3), ("heuristic", 5),
        ("heuristic-weak", 5)]  # fmt: skip
    assert [c.run.policy["seed"] for c in cells] == [0, 0, 3, 3, 5, 5]
    assert cells[2].run.name == "seeded: heuristic x theta0_a x test/addition seed 3"
    assert suite.seeds == [0, 3, 5]
    unseeded = suite_create(name="one", agents=["heuristic"], tasks=["test/addition"], budget={"seed": 7})
    (only,) = unseeded.cells.select_related("run")
    assert (only.seed, only.run.policy["seed"], unseeded.seeds) == (7, 7, [])


def _template_run(world, **switches) -> Run:
    return run_launch(benchmark=world["addition"], base_checkpoint=world["bases"][1], name="template",
                      wall_seconds=700, accelerator_seconds=1200, parallel=3, max_workers=4, screen_steps=7,
                      train_steps=33, learning_rate=0.004, batch_size=8, seed=9, lr_scheduler_type="constant",
                      start=False, **switches)  # fmt: skip


def test_the_ablation_suite_of_a_run_is_its_three_arms_at_its_budget_per_seed(world):
    template = _template_run(world)
    suite = ablation_suite_create(run=template, seeds=[0, 1], max_concurrent=2)
    cells = list(suite.cells.select_related("run").order_by("position"))
    assert len(cells) == 6
    assert [run_ablation(c.run) for c in cells] == ["full", "serial-workers", "no-reviewer"] * 2
    assert [c.seed for c in cells] == [0, 0, 0, 1, 1, 1]
    for cell in cells:
        run = cell.run
        assert (run.benchmark, run.base_checkpoint, run.status) == (world["addition"], world["bases"][1], "created")
        assert (run.budget_wall_seconds, run.budget_accelerator_seconds) == (700, 1200)
        heuristic = run.policy["heuristic"]
        assert (heuristic["max_workers"], heuristic["screen_steps"], heuristic["train_steps"],
                heuristic["learning_rate"], heuristic["batch_size"]) == (4, 7, 33, 0.004, 8)  # fmt: skip
        assert heuristic["lr_scheduler_type"] == "constant"  # the schedule is the template's too
        assert run.policy["seed"] == cell.seed  # the suite's seeds, not the template's 9
        serial = cell.agent == "heuristic-serial-workers"
        assert run.max_parallel_workers == (1 if serial else 3)
        assert run.policy["reviewers"] is (cell.agent != "heuristic-no-reviewer")
    # One group of three arms on the ablation view, each with its two seeds.
    (group,) = ablation_groups([c.run for c in cells])
    assert [(a["name"], len(a["runs"])) for a in group["arms"]] == [("full", 2), ("no-reviewer", 2),
                                                                     ("serial-workers", 2)]  # fmt: skip


def test_the_ablation_of_a_serial_run_gives_its_full_arm_parallel_workers(world):
    suite = ablation_suite_create(run=_template_run(world, serial_workers=True), seeds=[0])
    runs = {c.agent: c.run for c in suite.cells.select_related("run")}
    assert runs["heuristic"].max_parallel_workers == 2  # the default, not the serial run's 1
    assert runs["heuristic-serial-workers"].max_parallel_workers == 1


@pytest.fixture
def finished_ablation(world):
    """Six finished runs: full 11/20 and 13/20, serial 9/20 twice, no-reviewer 12/20 and 6/20 (θ0 5/20)."""
    suite = suite_launch(suite=ablation_suite_create(run=_template_run(world), seeds=[0, 1], max_concurrent=6))
    finals = {("heuristic", 0): 11, ("heuristic", 1): 13, ("heuristic-serial-workers", 0): 9,
              ("heuristic-serial-workers", 1): 9, ("heuristic-no-reviewer", 0): 12,
              ("heuristic-no-reviewer", 1): 6}  # fmt: skip
    for cell in suite.cells.select_related("run"):
        _plant(cell.run, iterations=[0.4])
        _finish(cell.run, {"theta0": 5, "reference": 17, "best": finals[(cell.agent, cell.seed)]})
    return suite_advance_once(suite=suite)


def test_the_ablation_pairs_full_with_each_arm_over_seeds(finished_ablation):
    assert finished_ablation.status == "finished"
    (group,) = ablation_groups([c.run for c in finished_ablation.cells.select_related("run")])
    arms = {a["name"]: a for a in group["arms"]}
    assert arms["full"]["mean"] == pytest.approx(0.60)
    assert arms["full"]["ci_low"] <= 0.60 <= arms["full"]["ci_high"]
    assert (arms["serial-workers"]["ci_low"], arms["serial-workers"]["ci_high"]) == (0.45, 0.45)
    paired = {p["arm"]: p for p in group["paired"]}
    assert paired["serial-workers"]["seeds"] == [0, 1]
    assert paired["serial-workers"]["difference"] == pytest.approx(0.15)  # (0.55 - 0.45 + 0.65 - 0.45) / 2
    assert paired["no-reviewer"]["difference"] == pytest.approx(0.15)  # (0.55 - 0.60 + 0.65 - 0.30) / 2
    # Per agent: one setting, trained; the seeds' mean final score decides whether it beats θ0.
    stats = {r["agent"]: r for r in suite_stats(finished_ablation)["agents"]}
    assert {k: stats["heuristic-no-reviewer"][k] for k in ("cells", "settings", "settings_trained",
                                                           "settings_beat_base")} == {
        "cells": 2, "settings": 1, "settings_trained": 1, "settings_beat_base": 1}  # fmt: skip
    assert stats["heuristic-no-reviewer"]["posttrainbench_unweighted_mean"] == pytest.approx(0.45)


def test_the_ablation_is_one_click_from_the_comparison_page_for_operators(world, people, client):
    runs = [_template_run(world), _template_run(world, reviewer=False)]
    query = "&".join(f"runs={r.uuid}" for r in runs)
    viewer = _client(client, people["viewer"])
    page = viewer.get(f"/runs/compare/?{query}").content.decode()
    assert 'id="ablation"' in page
    assert 'id="ablation-launch"' not in page
    before = _counts()
    assert viewer.post("/runs/ablation/launch/", {"run": str(runs[0].uuid), "seeds": 2}).status_code == 403
    assert _counts() == before
    operator = _client(client, people["operator"])
    page = operator.get(f"/runs/compare/?{query}").content.decode()
    assert 'action="/runs/ablation/launch/"' in page
    bad = operator.post("/runs/ablation/launch/", {"run": str(runs[0].uuid), "seeds": 0, "max_concurrent": 1})
    assert bad.status_code == 302
    assert _counts() == before
    done = operator.post("/runs/ablation/launch/", {"run": str(runs[0].uuid), "seeds": 2, "max_concurrent": 1})
    suite = AgentSuite.objects.get()
    assert done.status_code == 302
    assert done["Location"] == f"/suites/{suite.uuid}/"
    assert (suite.status, suite.max_concurrent, suite.seeds, suite.created_by) == ("running", 1, [0, 1],
                                                                                   people["operator"])  # fmt: skip
    assert [c.run.status for c in suite.cells.select_related("run").order_by("position")] == [
        "running", "created", "created", "created", "created", "created"]  # fmt: skip
    detail = operator.get(done["Location"]).content.decode()
    assert f'href="/runs/ablation/?suite={suite.uuid}"' in detail


def test_the_ablation_page_of_a_suite_shows_its_arms_and_paired_differences(finished_ablation, people, client):
    viewer = _client(client, people["viewer"])
    other = suite_create(name="elsewhere", agents=["heuristic"], tasks=["test/subtraction"])
    page = viewer.get(f"/runs/ablation/?suite={finished_ablation.uuid}").content.decode()
    assert page.count('class="arm"') == 3
    assert 'data-arm="serial-workers"' in page
    assert "0.150" in page
    assert other.name not in page


def test_a_small_benchmarks_warning_is_on_each_of_its_results(world, people, client):
    """A benchmark sealed under the operator's --min-split-samples carries its warning on every result: the
    suite table (JSON, CSV, page), the run's scores endpoint and its result block; a full-size one none."""
    from apps.benchmarks.adding import benchmark_add  # noqa: PLC0415

    rows = [{"id": f"s-{i}", "question": f"What is {i} plus {i + 2}?", "answer": str(2 * i + 2)} for i in range(9)]
    folder = world["root"] / "small"
    folder.mkdir()
    write_jsonl(folder / "fb.jsonl", rows[:5])
    write_jsonl(folder / "fin.jsonl", rows[5:])
    small = benchmark_add(
        name="test/small", feedback_file=folder / "fb.jsonl", final_file=folder / "fin.jsonl", evaluator="exact_match",
        decoding={"temperature": 0, "top_p": 1, "max_tokens": 8, "stop": [], "seed_policy": "greedy-single-seed"},
        prompt_template="Question: {question}\nAnswer:", prompt_field="question", answer_fields=["answer"],
        split_minimum=4, reference_checkpoint=world["addition"].reference_checkpoint,
    )  # fmt: skip
    warning = "small benchmark: " + small.contract["samples"]["small_split"]
    assert "one sample moves the score by 25 points" in warning
    suite = suite_launch(suite=suite_create(name="small", agents=["heuristic"], tasks=["test/small", "test/addition"]))
    for cell in suite.cells.select_related("run"):
        _plant(cell.run, iterations=[0.4])
        _finish(cell.run, {"theta0": 5, "reference": 17, "best": 9})
    suite = suite_advance_once(suite=suite)

    stats = suite_stats(suite)
    assert {c["task"]: c["small_split"] for c in stats["cells"]} == {"test/small": warning, "test/addition": ""}
    csv_cells = {r["task"]: r["small_split"] for r in csv.DictReader(io.StringIO(stats_csv(stats, table="cells")))}
    assert csv_cells == {"test/small": warning, "test/addition": ""}
    viewer = _client(client, people["viewer"])
    page = viewer.get(f"/suites/{suite.uuid}/").content.decode()
    assert page.count('class="badge flagged small-split"') == 1
    assert f'title="{escape(warning)}"' in page
    for cell in suite.cells.select_related("run", "benchmark"):
        expected = warning if cell.benchmark_id == small.pk else ""
        scores = viewer.get(f"/api/v1/runs/{cell.run.uuid}/scores/").json()["scores"]
        assert scores["small_split"] == expected
        result = viewer.get(f"/runs/{cell.run.uuid}/").content.decode()
        assert ('id="result-small-split"' in result) is bool(expected)
        if expected:
            assert escape(warning) in result
