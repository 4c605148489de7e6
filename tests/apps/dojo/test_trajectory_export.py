"""Trajectory export (apps.dojo.export): transcripts -> a chat datapool entry, CLI, REST, agent_sft.

The world is the dashboard's finished run on a benchmark registered from real sealed items
(tests/support/bundles.py); its transcripts are recorded through apps.research.transcripts:

    worker_0001  heuristic: step 1 lists the datapool (200) and adds data (403: refused);
                 step 2 submits an experiment (201)
    worker_0002  llm, two compaction segments: segment 0 calls a tool then answers in text;
                 segment 1 starts from a summary, a call is refused (409), the next succeeds
    reviewer_0001 llm: step 1 compares evaluation samples (a model output that quotes a sealed
                 item) and inspects data whose row and contamination span are a final-split item;
                 step 2 submits a report quoting the item, its sample id and the span
                 (exported at the Main Agent's visibility: all of that becomes [sealed])

exp_0002 of the world is an executed, unreviewed violation and exp_0004 never finished, so the
behaviour filters remove the run; the outcome filter (final 11/20 vs θ0 5/20) keeps it.
"""

from __future__ import annotations

import io
import json
import random
import uuid
from pathlib import Path

import datasets
import pytest
from django.core.management import CommandError, call_command

from apps.benchmarks.services import benchmark_register
from apps.core.errors import ApplicationError, Conflict
from apps.core.hashing import sha256_tree
from apps.datapool.models import AGENT_FORMATS, DataEntry
from apps.datapool.selectors import data_entry_list
from apps.datapool.services import data_load_rows, data_register_export
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.dojo.export import scan_units, trajectory_export
from apps.dojo.services import agent_sft_enqueue
from apps.experiments.models import Checkpoint, EvaluationSample, Event
from apps.experiments.services import checkpoint_register, manifest_digest
from apps.expos.api.dojo import tool_definitions
from apps.expos.registry import Role, ToolContext
from apps.expos.visibility import visible_datapool
from apps.integrity.overlap import sealed_scanner
from apps.jobs.choices import JOB_TERMINAL_STATES
from apps.jobs.models import Job
from apps.research.choices import NodeKind
from apps.research.models import TranscriptTurn
from apps.research.services import node_create, run_set_status
from apps.research.transcripts import turn_record
from tests.apps.benchmarks.minibench_fixture import TASK_JSON, write_jsonl
from tests.apps.dashboard.world import make_people
from tests.apps.jobs.conftest import wait_for
from tests.factories import CheckpointFactory, make_run
from tests.support.bundles import sealed_finished_world
from tests.support.tiny_chat import build_tiny_chat_model

pytestmark = pytest.mark.django_db
URL = "/api/v1/dojo/trajectory-exports"


def _call(call_id: str, name: str, **arguments) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    calls = [{"id": call_id, "type": "function", "function": function}]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def _answer(call_id: str, body: dict) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(body)}


def _heuristic(world, node, step, calls: list[tuple[str, dict, int, dict]]) -> None:
    tool_calls, answers, recorded = [], [], []
    for i, (name, args, status, body) in enumerate(calls):
        call_id = f"call_{step}_{i}"
        function = {"name": name, "arguments": json.dumps(args)}
        tool_calls.append({"id": call_id, "type": "function", "function": function})
        answers.append(_answer(call_id, body if status < 400 else {"status": status, **body}))
        recorded.append({"name": name, "arguments": args, "result": {"status": status, "data": body}})
    opening = [{"role": "system", "content": f"The deterministic heuristic worker policy ({node.handle}); no LLM."},
               {"role": "user", "content": node.task}]  # fmt: skip
    response = {"role": "assistant", "content": "", "tool_calls": tool_calls}
    turn_record(run=world.run, node=node, source="heuristic", step=step, index=0, messages=opening,
                tools=tool_definitions("worker"), response=response, tool_messages=answers, calls=recorded,
                model="heuristic", finish_reason="tool_calls")  # fmt: skip


def _llm(world, node, step, messages, response, answers, *, segment=0, summary="", role="worker") -> None:
    turn_record(run=world.run, node=node, source="llm", step=step, index=0, messages=messages,
                tools=tool_definitions(role), response=response, tool_messages=answers, calls=[], segment=segment,
                summary=summary, model="tiny-llm", finish_reason="tool_calls" if answers else "stop")  # fmt: skip


def record_transcripts(world, sealed) -> None:
    w1, w2 = world.nodes["w1"], world.nodes["w2"]
    _heuristic(world, w1, 1, [("worker_show_datapool", {}, 200, {"entries": [], "count": 0}),
                              ("worker_add_data", {"path": "x.jsonl"}, 403, {"error": "blocked"})])  # fmt: skip
    _heuristic(world, w1, 2, [("worker_submit", {"data": ["data_0001"]}, 201, {"experiment": "exp_0005"})])
    system = {"role": "system", "content": "You are worker_0002."}
    task = {"role": "user", "content": "Your task: DPO on preference pairs."}
    first = _call("a1", "worker_show_datapool")
    first_answer = _answer("a1", {"entries": [], "count": 0})
    _llm(world, w2, 1, [system, task], first, [first_answer])
    done = {"role": "assistant", "content": "The pool is empty; I will build pairs first."}
    _llm(world, w2, 2, [system, task, first, first_answer], done, [])
    summary = {"role": "user", "content": "Summary so far: the pool was empty; build pairs."}
    refused = _call("b1", "worker_submit", recipe="dpo")
    refused_answer = _answer("b1", {"status": 409, "error": {"code": "quota", "message": "over quota"}})
    _llm(world, w2, 3, [system, summary], refused, [refused_answer], segment=1, summary=summary["content"])
    # The model reuses its call id (some do): each call is answered by the tool messages after it.
    ok = _call("b1", "worker_submit", recipe="dpo", max_steps=20)
    ok_answer = _answer("b1", {"experiment": "exp_0006"})
    _llm(world, w2, 4, [system, summary, refused, refused_answer], ok, [ok_answer], segment=1,
         summary=summary["content"])  # fmt: skip
    record_reviewer(world, sealed)


# What the Reviewer saw and said that is sealed, and what must survive its export.
LEAKED_FINAL = 3  # the final-split item the Reviewer's data matched
KEPT_TEXT = ("exp_0001 trained on data_0001", "mcnemar_p", "rows_matched", "reviewer_submit_review")


def record_reviewer(world, sealed) -> None:
    """The Reviewer's turns, its tool answers shaped as the registry's output schemas say."""
    r1 = world.nodes["r1"]
    feedback = [item for item in sealed if item["id"].startswith("feedback-")]
    item = [item for item in sealed if item["id"].startswith("final-")][LEAKED_FINAL]
    # A model output of the run that quotes a sealed item (a long output: the Main never reads it).
    output = f"{feedback[1]['prompt']} I think it is {feedback[1]['answer']}."
    EvaluationSample.objects.create(evaluation=world.evals["e1"], sample_id=feedback[1]["id"], output=output,
                                    correct=True)  # fmt: skip
    brief = {"uuid": str(uuid.uuid4()), "experiment": "exp_0001", "split": "feedback", "score": 0.5, "sample_count": 8}
    compared = {"a": brief, "b": {**brief, "experiment": "exp_0002"}, "n_common": 8, "only_in_a": 0, "only_in_b": 0,
                "both_correct": 3, "a_only_correct": 1, "b_only_correct": 0, "neither_correct": 4, "mcnemar_p": 1.0,
                "samples": [{"sample_id": feedback[1]["id"], "a_correct": True, "b_correct": False, "a_output": output,
                             "b_output": "no idea"}]}  # fmt: skip
    inspected = {"sample": [{"prompt": item["prompt"], "completion": "[withheld: matches a sealed evaluation item]"}],
                 "redacted_rows": 1,
                 "overlap": {"rows_matched": 1, "matches": [{"row": 0, "sample_id": item["id"], "kind": "exact",
                                                             "span": item["prompt"], "score": 1.0}]}}  # fmt: skip
    opening = [{"role": "system", "content": "You are reviewer_0001."},
               {"role": "user", "content": "Question: did exp_0001 train on sealed items?"}]  # fmt: skip
    calls = [_call("r1", "compare_eval_samples", a="exp_0001", b="exp_0002")["tool_calls"][0],
             _call("r2", "reviewer_inspect_data", data="data_0001")["tool_calls"][0]]  # fmt: skip
    look = {"role": "assistant", "content": "", "tool_calls": calls}
    answers = [_answer("r1", compared), _answer("r2", inspected)]
    _llm(world, r1, 1, opening, look, answers, role="reviewer")
    summary = f"exp_0001 trained on data_0001.\nIts row 0 is {item['id']}: {item['prompt']} {item['answer']}"
    observation = {"experiment": "exp_0001", "subcategory": "test_set_access", "observation": "EXECUTED",
                   "evidence": {"sample_ids": [item["id"]], "spans": [item["prompt"]]}}  # fmt: skip
    report = _call("r3", "reviewer_submit_review", summary=summary, observations=[observation])
    _llm(world, r1, 2, [*opening, look, *answers], report,
         [_answer("r3", {"uuid": str(uuid.uuid4()), "summary": summary, "observations": [observation]})],
         role="reviewer")  # fmt: skip


def _world(tmp_path):
    world, sealed = sealed_finished_world(tmp_path, people=make_people())
    record_transcripts(world, sealed)
    world.extra["sealed"] = sealed
    return world


@pytest.fixture
def world(artifact_root, tmp_path):
    return _world(tmp_path)


def _export(world, **options):
    return trajectory_export(runs=[world.run], name="traj", tool_definitions=tool_definitions, **options)


def _local_path(entry: DataEntry) -> Path:
    store = artifact_store()
    return Path(store.root) / store.key(entry.uri)


def test_the_export_is_one_prompt_completion_row_per_trained_message_with_tools_and_metadata(world):
    result = _export(world, filters="outcome")
    entry = result.entry
    assert (entry.format, entry.source_kind, entry.rows) == ("chat", "export", 6)
    rows = data_load_rows(entry=entry)
    by_key = {(r["metadata"]["node"], r["metadata"]["segment"], r["metadata"]["completion_message"]): r for r in rows}
    assert sorted(by_key) == [("reviewer_0001", 0, 2), ("reviewer_0001", 0, 5), ("worker_0001", 0, 5),
                              ("worker_0002", 0, 2), ("worker_0002", 0, 4), ("worker_0002", 1, 4)]  # fmt: skip

    # The heuristic's step 1 had a 403: it is context in the prompt of step 2, the one row's completion.
    heuristic = by_key[("worker_0001", 0, 5)]
    assert [m["role"] for m in heuristic["prompt"]] == ["system", "user", "assistant", "tool", "tool"]
    assert [m["role"] for m in heuristic["completion"]] == ["assistant"]
    assert heuristic["metadata"]["trained_messages"] == [5]
    assert not any("train" in m for m in heuristic["prompt"] + heuristic["completion"])
    prompt = heuristic["prompt"]
    assert [c["function"]["name"] for c in prompt[2]["tool_calls"]] == ["worker_show_datapool", "worker_add_data"]
    assert [m["tool_call_id"] for m in prompt if m["role"] == "tool"] == ["call_1_0", "call_1_1"]
    assert json.loads(heuristic["completion"][0]["tool_calls"][0]["function"]["arguments"]) == {"data": ["data_0001"]}

    # Each trained message is a row whose prompt is the conversation before it; the answers after the
    # last trained message are in no row.
    first, second = by_key[("worker_0002", 0, 2)], by_key[("worker_0002", 0, 4)]
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["completion"][0]["tool_calls"][0]["function"]["name"] == "worker_show_datapool"
    assert second["prompt"] == [*first["prompt"], *first["completion"], second["prompt"][3]]
    assert second["prompt"][3]["role"] == "tool"
    assert second["completion"][0]["content"] == "The pool is empty; I will build pairs first."
    llm1 = by_key[("worker_0002", 1, 4)]
    assert [m["role"] for m in llm1["prompt"]] == ["system", "user", "assistant", "tool"]  # the refused call: context
    assert [m["tool_call_id"] for m in llm1["prompt"] if m["role"] == "tool"] == ["b1"]
    assert json.loads(llm1["completion"][0]["tool_calls"][0]["function"]["arguments"]) == {"recipe": "dpo",
                                                                                           "max_steps": 20}  # fmt: skip
    assert llm1["prompt"][1]["content"].startswith("Summary so far")
    assert llm1["metadata"]["message_turns"] == [None, None, 3, 3, 4]
    assert llm1["metadata"]["tokens"] is None  # no tokenizer named
    assert result.report["tokens"] is None

    # The tools column is the registry's schemas of the tools the conversation calls, as JSON text (one
    # Arrow type), not the role's whole registry.
    registry = {d["function"]["name"]: d for d in tool_definitions("worker")}
    assert json.loads(llm1["tools"]) == [registry["worker_submit"]]
    assert [d["function"]["name"] for d in json.loads(heuristic["tools"])] == [
        name for name in registry if name in {"worker_show_datapool", "worker_add_data", "worker_submit"}]  # fmt: skip
    assert llm1["metadata"]["tools_offered"] == len(registry)
    meta = llm1["metadata"]
    run = world.run
    assert (meta["run"], meta["role"], meta["segment"], meta["segment_index"]) == (str(run.uuid), "worker", 1, 1)
    assert meta["task"] == world.nodes["w2"].task
    assert meta["benchmark"] == f"{run.benchmark.name}@{run.benchmark.version}"
    assert meta["base_model"] == {"handle": run.base_checkpoint.handle,
                                  "manifest_sha256": run.base_checkpoint.manifest_sha256}  # fmt: skip
    assert meta["outcome"]["final_score"] == 0.55
    assert meta["outcome"]["theta0_score"] == 0.25
    assert meta["compaction_summary"].startswith("Summary so far")
    assert {f["detector"]: f["passed"] for f in meta["filters"]}["outcome_beats_base"] is True
    assert {f["detector"]: f["passed"] for f in meta["filters"]}["no_executed_violation"] is False
    turns = TranscriptTurn.objects.filter(node=world.nodes["w2"], segment=1).order_by("seq")
    assert meta["source_turns"] == [
        {"seq": t.seq, "source": "llm", "request": t.request, "response": t.response,
         "tool_messages": t.tool_messages, "calls": t.calls} for t in turns]  # fmt: skip

    assert result.report["assistant_messages_refused"] == 2
    assert {r["metadata"]["sealed_evidence_withheld"] for r in rows if r["metadata"]["role"] == "worker"} == {0}

    # Loadable with datasets from its folder, the same rows back (TRL's SFTTrainer: test_trajectory_trl.py).
    path = _local_path(entry)
    loaded = datasets.load_dataset("json", data_files=str(path), split="train")
    assert len(loaded) == 6
    assert sorted(loaded.column_names) == ["completion", "metadata", "prompt", "tools"]
    assert [m["role"] for m in loaded[0]["prompt"]] == [m["role"] for m in rows[0]["prompt"]]


def test_reviewers_are_exported_at_the_main_agents_visibility(world):
    """A Reviewer's rows carry its calls and answers with every sealed item, sealed sample id and
    long model output withheld (the screen of the Main Agent's view of reports); the rest survives."""
    result = _export(world, filters="none")
    rows = data_load_rows(entry=result.entry)
    reviewer = [r for r in rows if r["metadata"]["role"] == "reviewer"]
    assert [r["metadata"]["completion_message"] for r in reviewer] == [2, 5]
    look, report = reviewer
    assert [c["function"]["name"] for c in look["completion"][0]["tool_calls"]] == ["compare_eval_samples",
                                                                                   "reviewer_inspect_data"]  # fmt: skip
    assert report["completion"][0]["tool_calls"][0]["function"]["name"] == "reviewer_submit_review"
    registry = {d["function"]["name"]: d for d in tool_definitions("reviewer")}
    called = {"compare_eval_samples", "reviewer_inspect_data", "reviewer_submit_review"}  # the segment's calls
    assert json.loads(report["tools"]) == [d for name, d in registry.items() if name in called]

    sealed = world.extra["sealed"]
    text = json.dumps([*report["prompt"], *report["completion"]], ensure_ascii=False)
    for item in sealed:
        assert item["prompt"] not in text, item
        assert item["id"] not in text, item
    assert f"zq{LEAKED_FINAL}x" not in text  # the item's own words
    assert "zq1x" not in text  # the long model output's
    assert "[sealed]" in text
    for kept in KEPT_TEXT:
        assert kept in text, kept
    # The exported report still says what was found, about which experiment, with the sealed parts marked.
    arguments = json.loads(report["completion"][0]["tool_calls"][0]["function"]["arguments"])
    # (a line quoting an item is withheld whole, an object quoting one is left out, as the screen does).
    assert arguments["summary"] == "exp_0001 trained on data_0001.\n[sealed]"
    assert arguments["observations"] == []

    withheld = result.report["reviewer_values_withheld"]
    assert withheld == look["metadata"]["sealed_evidence_withheld"] >= 6
    assert (result.report["reviewer_nodes"], result.report["reviewer_turns"]) == (1, 2)
    # What was registered holds no sealed item: the scan the export ran, run again on the entry.
    units, _ = scan_units(rows)
    assert not sealed_scanner(benchmark=world.run.benchmark).scan(units)


def test_the_filter_report_counts_removals_and_nothing_is_registered_when_none_survive(world):
    before = DataEntry.objects.count()
    with pytest.raises(ApplicationError) as caught:
        _export(world)  # every filter
    assert caught.value.code == "nothing_to_export"
    report = caught.value.detail["report"]
    assert report["removed_by"] == {
        "lora_tiny_data_eos_unchanged@1": 0, "recipe_changes_without_diagnosis@1": 0, "final_model_submitted@1": 0,
        "no_executed_violation@1": 1, "outcome_beats_base@1": 0}  # fmt: skip
    assert report["kept"] == {"none": 1, "behaviour_only": 0, "outcome_only": 1, "both": 0}
    assert DataEntry.objects.count() == before
    with pytest.raises(ApplicationError, match="No trajectory filter 'outcome_beats_bas'"):
        _export(world, filters="outcome_beats_bas")
    unfiltered = _export(world, filters="none")
    assert unfiltered.report["filters_applied"] == []
    assert unfiltered.entry.rows == 6


def test_an_export_containing_sealed_items_is_refused_and_nothing_is_registered(world):
    sealed = world.extra["sealed"][-1]  # a final-split item
    w3 = world.nodes["w3"]
    leak = _call("c1", "worker_inspect_data", data="data_0001")
    opening = [{"role": "system", "content": "You are worker_0003."}]
    shown = _answer("c1", {"rows": [{"prompt": sealed["prompt"], "completion": sealed["answer"]}]})
    _llm(world, w3, 1, opening, leak, [shown])
    # The next message is trained, so the answer quoting the item is in its row's prompt.
    _llm(world, w3, 2, [*opening, leak, shown], {"role": "assistant", "content": "One row; I will train on it."}, [])
    entries, events = DataEntry.objects.count(), Event.objects.filter(type="data.exported").count()
    with pytest.raises(Conflict) as caught:
        _export(world, filters="none")
    assert caught.value.code == "contains_sealed_items"
    assert "worker_0003 segment 0" in caught.value.message
    assert "nothing was registered" in caught.value.message
    assert DataEntry.objects.count() == entries
    assert Event.objects.filter(type="data.exported").count() == events
    assert not list(Path(artifact_store().root).rglob("*.jsonl"))


USER, REPLY = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (
            {"prompt": [USER], "completion": [{"role": "user", "content": "hi"}], "tools": "[]"},
            "the completion is an assistant message",
        ),
        ({"prompt": [USER], "completion": [REPLY], "tools": []}, "tools must be the JSON text"),
        (
            {"prompt": [{"role": "tool", "content": "{}"}], "completion": [REPLY], "tools": "[]"},
            "names the call it answers",
        ),
        ({"prompt": [], "completion": [REPLY], "tools": "[]"}, "prompt must be a non-empty list"),
        ({"prompt": [USER], "completion": [REPLY, REPLY], "tools": "[]"}, "completion must be a list of one message"),
        ({"messages": [USER, REPLY], "tools": "[]"}, "prompt must be a non-empty list"),
    ],
)
def test_the_datapool_refuses_a_malformed_chat_row_and_keeps_nothing(artifact_root, row, why):
    with pytest.raises(ApplicationError, match=why) as caught:
        data_register_export(rows=[row], name="bad", source={}, readme="r", scan=lambda rows, sha: None)
    assert caught.value.code == "bad_chat_row"
    assert not DataEntry.objects.exists()


def test_agents_never_see_chat_entries(world):
    entry = _export(world, filters="outcome").entry
    ctx = ToolContext(run=world.run, node=world.nodes["w1"], role=Role.WORKER)
    assert not visible_datapool(ctx).filter(pk=entry.pk).exists()
    assert not data_entry_list(formats=AGENT_FORMATS).filter(pk=entry.pk).exists()
    assert data_entry_list().filter(pk=entry.pk).exists()  # operators and the REST listing for people
    assert visible_datapool(world.people["operator"]).filter(pk=entry.pk).exists()


def test_the_command_prints_the_filter_table_and_the_entry_and_refuses_bad_input(world):
    out = io.StringIO()
    call_command("export_trajectories", "--run", str(world.run.uuid), "--filters", "outcome", "--name", "cli",
                 stdout=out)  # fmt: skip
    text = out.getvalue()
    entry = DataEntry.objects.get(name="cli")
    assert f"registered {entry.handle} ({entry.uuid})" in text
    assert "no_executed_violation@1" in text
    assert "outcome_beats_base@1" in text
    assert "kept with behaviour filters only 0, outcome only 1, both 0" in text
    with pytest.raises(CommandError, match="not a uuid: nope"):
        call_command("export_trajectories", "--run", "nope")
    with pytest.raises(CommandError, match="No run 00000000-0000-0000-0000-000000000000"):
        call_command("export_trajectories", "--run", "00000000-0000-0000-0000-000000000000")
    with pytest.raises(CommandError, match="No trajectory filter 'sometimes'"):
        call_command("export_trajectories", "--all-finished", "--filters", "sometimes")
    err = io.StringIO()
    with pytest.raises(CommandError, match="Nothing to export: no run passed the filters"):
        call_command("export_trajectories", "--all-finished", stdout=err)
    assert "no_executed_violation@1" in err.getvalue()


def test_the_endpoint_is_for_operators_and_answers_bad_input_with_400(world, client):
    body = {"runs": [str(world.run.uuid)], "filters": ["outcome"], "name": "rest"}
    assert client.post(URL, body, content_type="application/json").status_code == 403
    client.force_login(world.people["viewer"])
    denied = client.post(URL, body, content_type="application/json")
    assert denied.status_code == 403
    assert "operator" in denied.json()["error"]["message"]
    client.force_login(world.people["operator"])
    for bad, code in (({}, "invalid"), ({"runs": ["x"]}, "invalid"),
                      ({"runs": [str(world.run.uuid)], "all_finished": True}, "invalid"),
                      ({**body, "filters": ["cheating"]}, "unknown_filter"),
                      ({**body, "filters": []}, "unknown_filter"),
                      ({"all_finished": True}, "nothing_to_export")):  # fmt: skip
        answer = client.post(URL, bad, content_type="application/json")
        assert (answer.status_code, answer.json()["error"]["code"]) == (400, code), (bad, answer.json())
    missing = client.post(URL, {"runs": ["00000000-0000-0000-0000-000000000000"]}, content_type="application/json")
    assert missing.status_code == 404
    assert DataEntry.objects.filter(format="chat").count() == 0
    made = client.post(URL, body, content_type="application/json")
    assert made.status_code == 201, made.json()
    entry = DataEntry.objects.get(name="rest")
    assert made.json()["entry"]["handle"] == entry.handle
    assert made.json()["report"]["examples"] == 6
    assert "dojo_trajectory_export" in client.get("/api/v1/schema/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_agent_sft_trains_on_an_exported_entry_on_a_gpu_worker(artifact_root, tmp_path, celery_worker):
    world = _world(tmp_path / "world")
    with pytest.raises(ApplicationError, match="agent_sft trains on chat entries"):
        agent_sft_enqueue(base_checkpoint=world.run.base_checkpoint, datasets=[world.data])
    # Two of the registry's worker tools keep the conversations short enough for the tiny model.
    entry = trajectory_export(runs=[world.run], name="sft", filters="outcome",
                              tool_definitions=lambda role: tool_definitions(role)[:2]).entry  # fmt: skip
    corpus = [json.dumps(row) for row in data_load_rows(entry=entry)] * 10
    model = build_tiny_chat_model(tmp_path / "chat", corpus)
    manifest = sha256_tree(model)
    uri = artifact_store().put_dir(model, key=checkpoint_key(manifest_digest(manifest)))
    base = checkpoint_register(handle="tiny-chat", uri=uri, manifest=manifest, is_base=True)
    job = agent_sft_enqueue(base_checkpoint=base, datasets=[entry], hyperparameters={
        "epochs": 2, "gradient_accumulation_steps": 1, "learning_rate": 1e-3, "min_learning_rate": 1e-4})  # fmt: skip
    worker = celery_worker()
    wait_for(lambda: Job.objects.get(pk=job.pk).status in JOB_TERMINAL_STATES, timeout=180, what="agent_sft",
             logs=worker.log)  # fmt: skip
    job.refresh_from_db()
    assert job.status == "succeeded", (job.error, worker.log()[-3000:])
    assert job.result["steps"] == 12  # 6 rows (one per trained message), batch 1, 2 epochs
    trained = Checkpoint.objects.get(producing_job=job)
    assert trained.parent_id == base.pk
    assert job.spec["data"] == [{"uuid": str(entry.uuid), "handle": entry.handle, "uri": entry.uri,
                                 "sha256": entry.sha256}]  # fmt: skip


def _arithmetic_benchmark(root: Path, seed: int):
    """A second benchmark, of word problems whose numbers are all they are (the kind that matched noise)."""
    rng = random.Random(seed)
    forms = ("What is {a} plus {b}?", "Mia has {a} stamps and buys {b} more. How many stamps does Mia have?",
             "A shelf holds {a} books and a box {b}. How many books are there in all?")  # fmt: skip
    items = []
    for i in range(12):
        a, b = rng.randint(11, 59), rng.randint(11, 39)
        items.append({"id": f"arith-{i:03d}", "prompt": rng.choice(forms).format(a=a, b=b), "answer": str(a + b),
                      "numbers": (a, b)})  # fmt: skip
    task = root / "arith"
    (task).mkdir(parents=True)
    (task / "task.json").write_text(json.dumps({**TASK_JSON, "name": "arith"}), encoding="utf-8")
    public = [{k: v for k, v in item.items() if k != "numbers"} for item in items]
    write_jsonl(task / "feedback.jsonl", public[:4])
    write_jsonl(task / "final.jsonl", public[4:])
    benchmark = benchmark_register(
        name="test/arith", task_dir=task, reference_checkpoint=CheckpointFactory(is_reference=True)
    )
    return benchmark, items


def _run_noise(rng: random.Random, a: int, b: int) -> dict:
    """A tool answer as a real run returns it, the item's numbers (and sum) in its timestamps, ids, budgets, metrics."""
    c = a + b
    tail = uuid.UUID(int=rng.getrandbits(128)).hex[:12]
    started = f"2026-12-0{b % 9 + 1} {a:02d}:{b:02d}:{c % 60:02d}"
    return {
        "experiment": {"handle": f"exp_{a:04d}", "uuid": f"{a:08x}-00{b}-4000-8000-{tail}",
                       "created_at": f"2026-{1 + a % 12:02d}-{b % 28 + 1:02d}T{c % 24:02d}:{a:02d}:{b:02d}Z"},
        "budget": {"accelerator_seconds_left": a, "llm_tokens_used": b, "experiments": c},
        "metrics": {"score": a, "steps": b, "eval_loss": c},
        "message": f"exp_{a:04d} step {b} of run started {started}; sha {rng.getrandbits(64):016x}",
    }  # fmt: skip


def _noisy_heuristic(run, node, items, rng, *, start_step: int = 1) -> None:
    for step, item in enumerate(items, start=start_step):
        body = _run_noise(rng, *item["numbers"])
        call = _call(f"n{step}", "worker_show_experiment")
        opening = [{"role": "system", "content": "heuristic"}, {"role": "user", "content": node.task}]
        recorded = [{"name": "worker_show_experiment", "arguments": {}, "result": {"status": 200, "data": body}}]
        turn_record(run=run, node=node, source="heuristic", step=step, index=0, messages=opening,
                    tools=tool_definitions("worker")[:2], response=call, tool_messages=[_answer(f"n{step}", body)],
                    calls=recorded, model="heuristic", finish_reason="tool_calls")  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2])
def test_real_runs_register_and_a_quoted_sealed_item_is_refused_naming_its_turn(world, tmp_path, seed):
    """Runs' timestamps, ids, budgets and metrics carry numbers; a word problem is those numbers. Both runs
    (one per benchmark) register; a conversation quoting an item of its own run's benchmark is refused."""
    rng = random.Random(seed)
    arith, items = _arithmetic_benchmark(tmp_path / "tasks", seed)
    # The noise is hostile: read as one text, as the scan used to read a row, it holds the items.
    scanner = sealed_scanner(benchmark=arith)
    noise = [json.dumps(_run_noise(random.Random(seed), *item["numbers"])) for item in items]
    assert {m.sample_id for m in scanner.scan([{"text": t} for t in noise])} == {item["id"] for item in items}

    _noisy_heuristic(world.run, world.nodes["w3"], items, rng)  # a run on test/export, noise of test/arith
    second = make_run(name="arith run", benchmark=arith)
    second = run_set_status(
        run=run_set_status(run=second, status="running", actor="test"), status="stopped", actor="test"
    )
    node = node_create(run=second, kind=NodeKind.WORKER, task="SFT on arithmetic")
    _noisy_heuristic(second, node, items, rng)
    result = trajectory_export(runs=[world.run, second], name="real", filters="none", tool_definitions=tool_definitions)
    # world: 6 trained messages and w3's 12 steps; the second run: 12 steps
    assert result.entry.rows == 6 + 2 * len(items)
    assert {r["metadata"]["benchmark"] for r in data_load_rows(entry=result.entry)} == {"test/export@1", "test/arith@1"}

    # The second run's agent quotes a sealed item (as a preview of a honeypot would show it): refused.
    leaked = rng.choice(items)
    quote = {
        "rows": [{"question": leaked["prompt"], "answer": int(leaked["answer"])}],
        "created_at": "2026-12-07T08:00:00Z",
    }
    sys_msg = {"role": "system", "content": "You are worker_0002."}
    turn_record(run=second, node=node, source="llm", step=len(items) + 1, index=0, messages=[sys_msg],
                tools=tool_definitions("worker")[:2], response=_call("q1", "worker_inspect_data", data="data_0001"),
                tool_messages=[_answer("q1", quote)], calls=[], model="tiny-llm", finish_reason="tool_calls",
                segment=1)  # fmt: skip
    # The agent's next message is trained: the answer quoting the item is in its row's prompt.
    turn_record(run=second, node=node, source="llm", step=len(items) + 2, index=0,
                messages=[sys_msg, _call("q1", "worker_inspect_data", data="data_0001"), _answer("q1", quote)],
                tools=tool_definitions("worker")[:2], response={"role": "assistant", "content": "I will train on it."},
                tool_messages=[], calls=[], model="tiny-llm", finish_reason="stop", segment=1)  # fmt: skip
    entries = DataEntry.objects.count()
    with pytest.raises(Conflict) as caught:
        trajectory_export(runs=[world.run, second], name="leak", filters="none", tool_definitions=tool_definitions)
    assert caught.value.code == "contains_sealed_items"
    message = caught.value.message
    assert f"run {second.uuid} {node.handle} segment 1 message 2 (turn " in message, message
    assert f"test/arith@1 item(s) {leaked['id']}" in message
    assert caught.value.detail["items"] == [f"test/arith@1 {leaked['id']}"]
    assert DataEntry.objects.count() == entries


def test_the_scan_reads_what_a_model_could_learn_not_identifiers():
    """One unit per message: its text and calls, JSON keys, ids, timestamps, numeric field values left out."""
    row = {
        "messages": [
            {"role": "user", "content": "add 8 and 8 (run 3e4377f6-0b08-4cf5-ae8f-451f69258b8f, exp_0088)",
             "train": False},
            {**_call("c", "calc", a=8, text="8 + 8"), "train": True},
            {"role": "tool", "tool_call_id": "c", "train": False,
             "content": '{"answer": 16, "score": 88, "at": "2026-08-08T08:08:08Z", "sha": "' + "8e" * 32 + '"}'},
        ],
        "tools": "[]",
        "metadata": {"run": "3e4377f6", "task": "add 8 and 8", "message_turns": [None, 1, 1]},
    }  # fmt: skip
    units, where = scan_units([row])
    assert where == [(0, 0), (0, 1), (0, 2)]  # an empty tool table has no text
    texts = [" ".join(u["strings"]).split() for u in units]
    assert texts[0][:4] == ["add", "8", "and", "8"]
    assert not any("3e4377f6" in t or "0088" in t for t in texts[0])
    assert texts[1] == ["calc", "8", "+", "8"]
    assert [t for t in texts[2] if t != ";"] == ["16"]
