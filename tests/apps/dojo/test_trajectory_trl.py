"""An exported trajectory file trains in TRL as it stands (issue 34 item 3).

The export of the dashboard's world (tests/apps/dojo/test_trajectory_export.py) is read with
``datasets`` from the datapool's file, unedited, and given to TRL's SFTTrainer at its default
settings (only the step count made tiny), with the minibench's θ0 and its tokenizer carrying a real
Qwen3 chat template (TRL ships the original in trl/chat_templates/qwen3.jinja; nothing is
downloaded). Only the trained assistant messages carry labels; the token counts the export states
are the lengths SFTTrainer tokenizes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined]

from apps.core.errors import ApplicationError
from apps.core.hashing import sha256_tree
from apps.datapool.models import DataEntry
from apps.datapool.services import data_load_rows
from apps.datapool.storage import artifact_store
from apps.dojo.export import trajectory_export
from apps.experiments.services import manifest_digest
from apps.expos.api.dojo import tool_definitions
from apps.ml.chat_render import load_chat_tokenizer
from tests.apps.dojo.test_trajectory_export import _world
from tests.factories import CheckpointFactory

pytestmark = pytest.mark.django_db
TEMPLATES = Path(trl.__file__).parent / "chat_templates"


def _with_template(theta0: Path, out: Path, template: str) -> Path:
    shutil.copytree(theta0, out)
    (out / "chat_template.jinja").write_text((TEMPLATES / template).read_text(encoding="utf-8"), encoding="utf-8")
    return out


def _short_definitions(role: str) -> list[dict]:
    """The registry's tools by name only: rows the tiny tokenizer (a 1,024-token BPE trained on
    arithmetic, some 1.6 characters a token) fits in TRL's default max_length of 1,024."""
    return [{"type": "function", "function": {"name": d["function"]["name"], "parameters": {"type": "object"}}}
            for d in tool_definitions(role)]  # fmt: skip


def _file(entry: DataEntry) -> str:
    store = artifact_store()
    return str(Path(store.root) / store.key(entry.uri))


def test_sft_trainer_trains_on_the_unedited_export_and_only_trained_messages_carry_loss(
    artifact_root, tmp_path, minibench_dir
):
    world = _world(tmp_path / "world")
    model_dir = _with_template(minibench_dir / "theta0", tmp_path / "qwen3-style", "qwen3.jinja")
    chat_tokenizer = load_chat_tokenizer(model_dir)
    # With the registry's own definitions each row states its length: worker_submit's and worker_add_data's
    # schemas alone are some 7,500 characters, over TRL's default max_length under this tokenizer.
    full = trajectory_export(runs=[world.run], name="full", filters="outcome", tool_definitions=tool_definitions,
                             tokenizer=chat_tokenizer)  # fmt: skip
    totals = [row["metadata"]["tokens"]["total"] for row in data_load_rows(entry=full.entry)]
    assert full.report["tokens"]["rows_over_1024"] == sum(t > 1024 for t in totals) > 0
    assert full.report["tokens"]["max"] == max(totals)

    result = trajectory_export(runs=[world.run], name="trl", filters="outcome", tool_definitions=_short_definitions,
                               tokenizer=chat_tokenizer)  # fmt: skip
    dataset = datasets.load_dataset("json", data_files=_file(result.entry), split="train")
    assert sorted(dataset.column_names) == ["completion", "metadata", "prompt", "tools"]
    # worker_0001: step 2 (step 1 had a 403); worker_0002 segment 0: both; segment 1: the call after the 409;
    # and the Reviewer's two (exported at the Main Agent's visibility, issue 31).
    roles = sorted(row["role"] for row in dataset["metadata"])
    assert roles == ["reviewer", "reviewer", "worker", "worker", "worker", "worker"]
    tokens = result.report["tokens"]
    assert tokens["name"] == "qwen3-style"
    # The Reviewer's turns carry its tool answers (long evidence): the only rows past TRL's default
    # max_length. Each row states its length, so a user keeps the rows that fit without editing any.
    over = [row["metadata"]["role"] for row in dataset if row["metadata"]["tokens"]["total"] > 1024]
    assert tokens["rows_over_1024"] == len(over), tokens
    assert set(over) <= {"reviewer"}, over
    dataset = dataset.filter(lambda row: row["metadata"]["tokens"]["total"] <= 1024)
    assert sorted(row["role"] for row in dataset["metadata"]).count("worker") == 4

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = SFTConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, report_to="none", save_strategy="no", use_cpu=True
    )  # defaults otherwise (bf16 on: this machine has no accelerator)
    model = AutoModelForCausalLM.from_pretrained(minibench_dir / "theta0")
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    prepared = trainer.train_dataset
    assert len(prepared) == len(dataset)  # no row dropped, none fully masked

    for row, example in zip(dataset, prepared, strict=True):
        tools = json.loads(row["tools"])
        prompt = [{k: v for k, v in m.items() if v is not None} for m in row["prompt"]]
        completion = [{k: v for k, v in m.items() if v is not None} for m in row["completion"]]
        before = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(prompt + completion, tools=tools, tokenize=False)
        assert full.startswith(before)
        learned = tokenizer.decode([t for t, label in zip(example["input_ids"], example["labels"], strict=True)
                                    if label != -100])  # fmt: skip
        # The loss covers exactly the completion's rendering (its text, its calls, its end of turn).
        assert learned == full[len(before) :], (learned, full[len(before) :])
        assert learned.endswith("<|im_end|>\n")
        for call in completion[0].get("tool_calls", []):
            assert f'"name": "{call["function"]["name"]}"' in learned
        # Nothing before it is learned: the refused calls, tool answers, system and task stay context.
        context = tokenizer.decode([t for t, label in zip(example["input_ids"], example["labels"], strict=True)
                                    if label == -100])  # fmt: skip
        assert context == before
        assert row["metadata"]["tokens"]["total"] == len(example["input_ids"])

    learned_rows = [tokenizer.decode([t for t, lab in zip(e["input_ids"], e["labels"], strict=True) if lab != -100])
                    for e in prepared]  # fmt: skip
    assert not any("worker_add_data" in text for text in learned_rows)  # step 1's call got a 403
    assert not any('"recipe": "dpo"}' in text for text in learned_rows)  # the call refused with 409
    assert any('"max_steps": 20' in text for text in learned_rows)  # the call after it, trained

    trained = trainer.train()
    assert trained.global_step == 2
    assert trained.training_loss > 0


def test_a_template_that_refuses_the_rows_refuses_the_export_naming_them(artifact_root, tmp_path, minibench_dir):
    """Llama 3.1's template raises on a message with several tool calls (a heuristic step has two)."""
    world = _world(tmp_path / "world")
    model_dir = _with_template(minibench_dir / "theta0", tmp_path / "llama31", "llama3_1.jinja")
    entries = DataEntry.objects.count()
    with pytest.raises(ApplicationError) as caught:
        trajectory_export(runs=[world.run], name="llama", filters="outcome", tool_definitions=tool_definitions,
                          tokenizer=load_chat_tokenizer(model_dir))  # fmt: skip
    assert caught.value.code == "chat_template_refuses_rows"
    assert "worker_0001 segment 0 message 5" in caught.value.message
    assert DataEntry.objects.count() == entries


def _registered(folder: Path, handle: str) -> str:
    """``folder`` stored in the artifact store and registered as checkpoint ``handle``; returns its URI."""
    manifest = sha256_tree(folder)
    uri = artifact_store().put_dir(folder, key=f"checkpoints/{manifest_digest(manifest)}")
    CheckpointFactory(handle=handle, uri=uri, manifest=manifest, manifest_sha256=manifest_digest(manifest))
    return uri


def test_the_rest_export_states_token_counts_under_a_registered_checkpoints_tokenizer(
    artifact_root, tmp_path, minibench_dir, client
):
    """The endpoint names the tokenizer by a checkpoint handle, never a path: its stored files, checked
    against the manifest, count each row as the CLI's --tokenizer does with the same folder."""
    world = _world(tmp_path / "world")
    model_dir = _with_template(minibench_dir / "theta0", tmp_path / "qwen3-style", "qwen3.jinja")
    uri = _registered(model_dir, "qwen3_chat")
    plain = tmp_path / "no-template"
    shutil.copytree(minibench_dir / "theta0", plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    _registered(plain, "no_template")
    client.force_login(world.people["operator"])
    url = "/api/v1/dojo/trajectory-exports"
    body = {"runs": [str(world.run.uuid)], "filters": ["outcome"], "name": "rest-tokens"}
    entries = DataEntry.objects.count()
    refusals = [("/tmp/qwen3-style", 404, "checkpoint_not_found"), ("ckpt_9999", 404, "checkpoint_not_found"),
                ("no_template", 400, "invalid_tokenizer")]  # fmt: skip
    for handle, status, code in refusals:
        answer = client.post(url, {**body, "tokenizer": handle}, content_type="application/json")
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.json()
        assert str(tmp_path) not in answer.json()["error"]["message"]
    assert DataEntry.objects.count() == entries

    made = client.post(url, {**body, "tokenizer": "qwen3_chat"}, content_type="application/json")
    assert made.status_code == 201, made.json()
    tokens = made.json()["report"]["tokens"]
    local = trajectory_export(runs=[world.run], name="cli-tokens", filters="outcome", tool_definitions=tool_definitions,
                              tokenizer=load_chat_tokenizer(model_dir)).report["tokens"]  # fmt: skip
    assert tokens["name"] == "qwen3_chat"
    assert {k: v for k, v in tokens.items() if k != "name"} == {k: v for k, v in local.items() if k != "name"}
    rows = data_load_rows(entry=DataEntry.objects.get(name="rest-tokens"))
    assert all(row["metadata"]["tokens"]["total"] > 0 for row in rows)

    # The stored tokenizer changed after registration: refused, nothing registered.
    stored = artifact_store().local_path(uri) / "tokenizer.json"
    stored.chmod(0o644)
    stored.write_text(stored.read_text(encoding="utf-8") + " ", encoding="utf-8")
    edited = {**body, "name": "after-edit", "tokenizer": "qwen3_chat"}
    changed = client.post(url, edited, content_type="application/json")
    assert (changed.status_code, changed.json()["error"]["code"]) == (409, "checkpoint_files_changed")
    assert not DataEntry.objects.filter(name="after-edit").exists()
