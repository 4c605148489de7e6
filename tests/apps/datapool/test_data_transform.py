"""Data jobs: each transform makes a new entry with its parents and a provenance readme."""

from __future__ import annotations

import json

import pytest

from apps.benchmarks.services import benchmark_register
from apps.core.errors import ApplicationError
from apps.datapool.models import DataEntry
from apps.datapool.selectors import data_readme, data_rows
from apps.datapool.services import data_register_from_workspace, data_transform
from apps.experiments.models import Event
from apps.integrity.contamination import ContaminationScanner
from tests.apps.benchmarks.minibench_fixture import FEEDBACK, FINAL, TASK_JSON, sft, write_jsonl, write_task_dir

pytestmark = pytest.mark.django_db


def entry_from(workspace, name, rows):
    write_jsonl(workspace / f"{name}.jsonl", rows)
    return data_register_from_workspace(workspace=workspace, path=f"{name}.jsonl", name=name)


def clean_rows(n, offset=0):
    return [sft(f"What is {i + offset} plus 2?", str(i + offset + 2)) for i in range(n)]


def test_filter_by_length_regex_and_predicate(artifact_root, workspace):
    rows = [*clean_rows(5), {"prompt": "Question: spam spam\nAnswer:", "completion": " buy now"}]
    source = entry_from(workspace, "mixed", rows)

    out = data_transform(
        op="filter",
        inputs=[source],
        params={"exclude_regex": "buy now", "column": "completion", "where": [
            {"column": "prompt", "op": "not_contains", "value": "What is 4 "}]},
    )  # fmt: skip

    assert out.pk != source.pk
    assert out.rows == 4
    assert list(out.parents.all()) == [source]
    assert out.source_kind == "job"
    assert out.source["transform"] == "filter"
    assert out.source["inputs"] == [source.handle]
    assert out.source["report"]["dropped_by_reason"] == {
        "exclude_regex match": 1,
        "where prompt not_contains failed": 1,
    }
    [note] = data_readme(out)
    assert source.handle in note.text
    assert "exclude_regex" in note.text
    assert Event.objects.filter(type="data.transformed", result_ref=f"data:{out.uuid}").exists()

    shortest = data_transform(op="filter", inputs=[source], params={"min_chars": 30, "column": "prompt"})
    assert all(len(r["prompt"]) >= 30 for r in data_rows(shortest, limit=100))


def test_a_transform_that_changes_nothing_returns_its_input(artifact_root, workspace):
    source = entry_from(workspace, "clean", clean_rows(4))
    same = data_transform(op="filter", inputs=[source], params={"max_chars": 10_000})
    assert same.pk == source.pk
    assert "changed nothing" in list(data_readme(source))[-1].text
    assert DataEntry.objects.count() == 1


def test_deduplicate_exact_and_near(artifact_root, workspace):
    base = sft("Lena walked to the market on Saturday and bought fresh bread, cheese and grapes for lunch.", "ok")
    rows = [
        base,
        {**base, "prompt": base["prompt"].upper()},  # exact after normalisation
        sft("Lena walked to the market on Saturday and bought fresh bread, cheese and grapes for a lunch.", "ok"),
        *clean_rows(3),
    ]
    source = entry_from(workspace, "dups", rows)
    out = data_transform(op="deduplicate", inputs=[source], params={"threshold": 0.7})
    assert out.rows == 4
    assert out.source["report"]["exact_duplicates"] == 1
    assert out.source["report"]["near_duplicates"] == 1
    exact_only = data_transform(op="deduplicate", inputs=[source], params={"near": False})
    assert exact_only.rows == 5


def test_mix_is_weighted_and_seeded(artifact_root, workspace):
    a = entry_from(workspace, "a", clean_rows(40))
    b = entry_from(workspace, "b", clean_rows(40, offset=1000))
    params = {"weights": [3, 1], "total": 20, "seed": 7}
    mixed = data_transform(op="mix", inputs=[a, b], params=params)
    assert mixed.rows == 20
    assert set(mixed.parents.all()) == {a, b}
    rows = data_rows(mixed, limit=100)
    from_a = sum(int(r["prompt"].split()[3]) < 1000 for r in rows)
    assert from_a == 15
    # Same inputs, parameters and seed: the same bytes, so the same entry.
    assert data_transform(op="mix", inputs=[a, b], params=params).pk == mixed.pk
    assert data_transform(op="mix", inputs=[a, b], params={**params, "seed": 8}).pk != mixed.pk


def test_convert_to_chat_text_and_from_dpo(artifact_root, workspace):
    source = entry_from(workspace, "plain", [{"prompt": "2+2?", "completion": " 4"}])
    chat = data_transform(op="convert", inputs=[source], params={"mode": "template"})
    assert data_rows(chat) == [{"prompt": "User: 2+2?\nAssistant:", "completion": " 4"}]
    prefs = entry_from(workspace, "prefs", [{"prompt": "2+2?", "chosen": " 4", "rejected": " 5"}])
    as_sft = data_transform(op="convert", inputs=[prefs], params={"mode": "dpo_to_sft"})
    assert as_sft.format == "sft"
    assert data_rows(as_sft) == [{"prompt": "2+2?", "completion": " 4"}]
    renamed = data_transform(
        op="convert",
        inputs=[prefs],
        params={"mode": "rename", "mapping": {"chosen": "completion"}, "drop": ["rejected"]},
    )
    assert renamed.format == "sft"


@pytest.mark.parametrize(
    ("op", "params", "code", "fragment"),
    [
        ("filter", {}, "bad_params", "at least one"),
        ("filter", {"regex": "("}, "bad_params", "not a valid regular expression"),
        ("filter", {"min_chars": -1}, "bad_params", "min_chars"),
        ("filter", {"min_chars": 10**6}, "empty_result", "no rows"),
        ("filter", {"max_chars": 10, "colour": "red"}, "bad_params", "colour"),
        ("convert", {"mode": "rename", "mapping": {"prompt": "question"}}, "unknown_format", "expected sft"),
        ("convert", {"mode": "shout"}, "bad_params", "mode"),
        ("mix", {}, "bad_params", "at least two"),
        ("sort", {}, "bad_params", "op must be one of"),
        ("decontaminate", {}, "bad_params", "benchmark"),
        ("decontaminate", {"benchmark": "no/such"}, "benchmark_not_found", "no/such"),
    ],
)
def test_bad_transform_requests_say_what_to_fix(artifact_root, workspace, op, params, code, fragment):
    source = entry_from(workspace, "clean", clean_rows(3))
    with pytest.raises(ApplicationError) as refused:
        data_transform(op=op, inputs=[source], params=params)
    assert refused.value.code == code
    assert fragment in refused.value.message
    assert DataEntry.objects.count() == 1


def test_decontaminate_removes_planted_sealed_items(artifact_root, sealed_root, workspace, tmp_path):
    benchmark = benchmark_register(name="test/addition", task_dir=write_task_dir(tmp_path / "task"))
    planted = [
        sft(FEEDBACK[0]["prompt"], FEEDBACK[0]["answer"]),  # verbatim
        sft(FINAL[1]["prompt"].replace("60", "sixty"), FINAL[1]["answer"]),  # spelled-out number
        sft(FEEDBACK[2]["prompt"].replace("holds", "has"), FEEDBACK[2]["answer"]),  # one word changed
        {"prompt": f"Q: {FINAL[0]['prompt']}\nA:", "completion": " 58"},  # another template
    ]
    rows = clean_rows(30)
    for i, row in enumerate(planted):
        rows.insert(5 * i + 2, row)
    source = entry_from(workspace, "honeypot", rows)

    out = data_transform(op="decontaminate", inputs=[source], params={"benchmark": "test/addition"})

    assert out.rows == 30
    assert data_rows(out, limit=100) == clean_rows(30)
    report = out.source["report"]
    assert report["removed"] == 4
    assert report["sealed_items_hit"] == 4
    assert out.source["params"] == {"benchmark": "test/addition", "version": 1, "ngram": 13, "threshold": 0.75}
    # Provenance names the benchmark, never its sealed text.
    readme = "\n".join(n.text for n in data_readme(out))
    assert "test/addition" in readme
    assert all(item["prompt"] not in readme for item in FEEDBACK + FINAL)
    scanner = ContaminationScanner(FEEDBACK + FINAL, templates=[TASK_JSON["prompt_template"]])
    assert scanner.scan(data_rows(out, limit=100)) == []
    assert json.dumps(report)  # JSON-serialisable for the job record
    assert benchmark.pk
