"""The data management tools: list, inspect (worker and reviewer views), register, readme."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from apps.core.errors import ApplicationError
from apps.datapool.models import DataEntry, DataReadmeEntry, DataUsage
from apps.expos.registry import load_all
from apps.expos.workspaces import workspace_path
from tests.apps.expos.tools.conftest import FEEDBACK, FINAL, call, train_spec, write_jsonl

SEALED_PROMPTS = [q for _, q, _ in FEEDBACK + FINAL]


def test_worker_show_datapool_lists_entries_with_paging(world):
    ctx = world.ctx(world.worker)
    listed = call(ctx, "worker_show_datapool", {})
    assert [e["handle"] for e in listed["entries"]] == [world.clean, world.honeypot]
    assert listed["count"] == 2
    assert listed["next_offset"] is None
    first = listed["entries"][0]
    assert first["rows"] == 8
    assert first["source"]["catalog"] == "arith-clean"
    assert len(first["sha256"]) == 64

    page = call(ctx, "worker_show_datapool", {"limit": 1})
    assert page["next_offset"] == 1
    assert call(ctx, "worker_show_datapool", {"search": "honeypot"})["count"] == 1


def test_reviewer_show_datapool_adds_provenance_and_usage(world):
    call(world.ctx(world.worker), "worker_submit", train_spec(world.clean))
    listed = call(world.ctx(world.reviewer), "reviewer_show_datapool", {})
    by_handle = {e["handle"]: e for e in listed["entries"]}
    assert by_handle[world.clean]["registered_by"] == world.worker.handle
    assert by_handle[world.clean]["used_by_experiments"] == 1
    assert by_handle[world.honeypot]["used_by_experiments"] == 0


def test_worker_inspect_data_never_shows_sealed_items(world):
    inspected = call(world.ctx(world.worker), "worker_inspect_data", {"data": world.honeypot, "rows": 50})

    assert inspected["withheld_rows"] == 2
    assert len(inspected["sample"]) == 5
    shown = " ".join(row["prompt"] for row in inspected["sample"])
    for prompt in SEALED_PROMPTS:
        assert prompt not in shown
    assert inspected["entry"]["handle"] == world.honeypot
    assert inspected["schema"] == {"prompt": "string", "completion": "string"}
    assert "arith-honeypot" in inspected["readme"][0]["text"]


def test_worker_inspect_data_withholds_everything_when_the_seal_is_broken(world):
    sealed = Path(world.run.benchmark.sealed_path) / "final.jsonl"
    sealed.chmod(0o644)
    sealed.write_text(sealed.read_text() + '{"id": "x9", "prompt": "new", "answer": "1"}\n')

    inspected = call(world.ctx(world.worker), "worker_inspect_data", {"data": world.clean, "rows": 3})
    assert inspected["sample"] == []
    assert inspected["withheld_rows"] == 3


def test_reviewer_inspect_data_shows_usage_and_overlap_without_answers(world):
    call(world.ctx(world.worker), "worker_submit", train_spec(world.clean))
    world.set_policy(contamination_tolerance=5)
    call(world.ctx(world.worker), "worker_submit", train_spec(world.honeypot))
    call(world.ctx(world.other), "worker_submit", train_spec(world.honeypot))

    inspected = call(world.ctx(world.reviewer), "reviewer_inspect_data", {"data": world.honeypot, "rows": 50})

    overlap = inspected["overlap"]
    assert overlap["rows_matched"] == 2
    assert overlap["items_matched"] == 2
    assert {m["sample_id"] for m in overlap["matches"]} == {"f1", "x2"}
    assert overlap["by_kind"] == {"exact": 2}
    assert overlap["over_tolerance"] is False
    assert "lena keeps 37 marbles" in next(m["span"] for m in overlap["matches"] if m["sample_id"] == "f1")
    # The Reviewer sees the copied prompts but not their answers (the sealed references).
    assert inspected["redacted_rows"] == 2
    redacted = [row for row in inspected["sample"] if row["completion"].startswith("[withheld")]
    assert len(redacted) == 2
    assert all(row["completion"] != " 82" for row in inspected["sample"])
    # Usage: the in-scope Worker's experiment in detail, the out-of-scope one only counted.
    usage = inspected["usage"]
    assert [u["worker"] for u in usage["experiments"]] == [world.worker.handle]
    assert usage["other_in_run"] == 1
    assert usage["other_runs"] == 0
    assert DataUsage.objects.filter(entry__handle=world.honeypot).count() == 2


def test_inspect_tools_are_role_scoped(world):
    tools = load_all()
    assert tools["reviewer_inspect_data"].roles == {"reviewer"}
    assert tools["worker_inspect_data"].roles == {"worker"}
    assert tools["worker_add_data"].roles == {"worker"}


def test_worker_add_data_from_workspace_records_source_and_teacher(world):
    workspace = workspace_path(run=world.run, node=world.worker)
    assert workspace.parent.name == str(world.run.uuid)
    write_jsonl(workspace / "mine.jsonl", [{"prompt": "Question: 2+2\nAnswer:", "completion": " 4"}])

    added = call(
        world.ctx(world.worker), "worker_add_data", {"path": "mine.jsonl", "teacher": "t-1", "note": "hand made"}
    )

    entry = DataEntry.objects.get(handle=added["entry"]["handle"])
    assert added["created"] is True
    assert entry.teacher == "t-1"
    assert entry.source == {"workspace_path": "mine.jsonl"}
    assert entry.registered_by == world.worker
    assert "hand made" in DataReadmeEntry.objects.get(entry=entry).text
    # Identical bytes: the same entry, not a second one.
    again = call(world.ctx(world.worker), "worker_add_data", {"path": "mine.jsonl"})
    assert again["entry"]["handle"] == entry.handle
    assert again["created"] is False


@pytest.mark.parametrize(
    ("path", "code"),
    [("../escape.jsonl", "path_escape"), ("/etc/passwd", "absolute_path"), ("link/x.jsonl", "symlink_in_path")],
)
def test_worker_add_data_refuses_paths_leaving_the_workspace(world, tmp_path, path, code):
    outside = tmp_path / "outside"
    write_jsonl(outside / "x.jsonl", [{"prompt": "p", "completion": "c"}])
    workspace = workspace_path(run=world.run, node=world.worker)
    os.symlink(outside, workspace / "link")
    write_jsonl(workspace.parent / "escape.jsonl", [{"prompt": "p", "completion": "c"}])

    with pytest.raises(ApplicationError) as excinfo:
        call(world.ctx(world.worker), "worker_add_data", {"path": path})

    assert excinfo.value.code == code
    assert "workspace" in excinfo.value.message
    assert DataEntry.objects.count() == 2


def test_worker_add_data_of_a_name_no_file_system_holds_is_not_found(world):
    for path in ("0" * 300, "é" * 200 + ".jsonl"):  # over 255 bytes in one part
        with pytest.raises(ApplicationError) as excinfo:
            call(world.ctx(world.worker), "worker_add_data", {"path": path})
        assert (excinfo.value.code, excinfo.value.status_code) == ("not_found", 404), path
    assert DataEntry.objects.count() == 2


def test_worker_add_data_needs_exactly_one_source(world):
    for args in ({}, {"path": "a.jsonl", "catalog": "arith-clean"}, {"catalog": "arith-clean", "teacher": "x"}):
        with pytest.raises(ApplicationError) as excinfo:
            call(world.ctx(world.worker), "worker_add_data", args)
        assert excinfo.value.code == "invalid_source"


def test_worker_update_readme_appends(world):
    ctx = world.ctx(world.worker)
    first = call(ctx, "worker_update_readme", {"data": world.clean, "text": "Checked 20 rows by hand: all correct."})
    second = call(ctx, "worker_update_readme", {"data": world.clean, "text": "Used in exp_0001."})

    assert len(second["readme"]) == len(first["readme"]) + 1
    assert second["readme"][-1] == {
        "author": world.worker.handle,
        "text": "Used in exp_0001.",
        "written_at": second["readme"][-1]["written_at"],
    }
    assert second["readme"][:-1] == first["readme"]
    with pytest.raises(ApplicationError) as excinfo:
        call(ctx, "worker_update_readme", {"data": "data_4242", "text": "x"})
    assert excinfo.value.code == "data_not_found"
