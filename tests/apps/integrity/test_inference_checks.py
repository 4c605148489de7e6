"""Inference subcategories: decoding parameters, stopping / EOS, prompt template — compared in meaning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from apps.experiments.choices import IntegrityStatus
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.services import finding_adjudicate, integrity_run_checks
from tests.apps.integrity.conftest import build_world, finding, store_checkpoint

DEC = Subcategory.DECODING_PARAMETERS
STOP = Subcategory.STOPPING_EOS
PROMPT = Subcategory.PROMPT_TEMPLATE
INFERENCE = (DEC, STOP, PROMPT)


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _resave_tokenizer(folder: Path) -> None:
    """What a trainer that re-saves its tokenizer writes: other bytes, other files, the same meaning."""
    from transformers import AutoTokenizer, GenerationConfig  # noqa: PLC0415 - heavy, two tests only

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    generation = GenerationConfig.from_pretrained(folder, local_files_only=True)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        (folder / name).unlink(missing_ok=True)
    tokenizer.save_pretrained(folder)
    generation.save_pretrained(folder)
    # Re-indent tokenizer.json as another library version would.
    tokenizer_json = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json, indent=4), encoding="utf-8")
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert before != after  # the files really changed


def test_a_tokenizer_resaved_by_the_trainer_is_unchanged(world):
    experiment = world.train([world.data["clean"]], plant=_resave_tokenizer)
    assert experiment.output_checkpoint.manifest != world.theta0.manifest

    integrity_run_checks(experiment=experiment)

    for subcategory in INFERENCE:
        assert finding(experiment, subcategory).observation == Observation.NOT_FOUND_FULL, subcategory
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


def test_a_changed_generation_config_awaits_adjudication(world):
    experiment = world.train(
        [world.data["clean"]],
        plant=lambda d: _edit_json(d / "generation_config.json", repetition_penalty=1.3, transformers_version="9"),
    )

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, DEC)
    assert result.observation == Observation.EXECUTED
    assert list(result.evidence["differences"]) == ["generation_config.repetition_penalty"]
    assert result.adjudication == ""
    assert finding(experiment, STOP).observation == Observation.NOT_FOUND_FULL
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING


def test_a_changed_eos_token_is_a_stopping_change(world):
    experiment = world.train(
        [world.data["clean"]], plant=lambda d: _edit_json(d / "tokenizer_config.json", eos_token="?")
    )

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, STOP)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["differences"]["special_tokens.eos_token"] == {"theta0": "</s>", "checkpoint": "?"}
    assert "suggested_adjudication" not in result.evidence


def test_an_explicit_eos_repair_is_a_compatibility_repair_candidate(db, roots, theta0_template, tmp_path):
    # θ0 whose generation config names no EOS: generation never stops at the tokenizer's </s>.
    broken = tmp_path / "theta0-no-eos"

    shutil.copytree(theta0_template, broken)
    config = json.loads((broken / "generation_config.json").read_text())
    del config["eos_token_id"]
    (broken / "generation_config.json").write_text(json.dumps(config))
    world = build_world(roots, broken)
    experiment = world.train(
        [world.data["clean"]], plant=lambda d: _edit_json(d / "generation_config.json", eos_token_id=2)
    )

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, STOP)
    assert result.observation == Observation.EXECUTED
    assert "eos_repair" in result.evidence["codes"]
    assert result.evidence["suggested_adjudication"] == Adjudication.COMPATIBILITY_REPAIR
    assert result.adjudication == ""
    finding_adjudicate(
        finding=result,
        adjudication=Adjudication.COMPATIBILITY_REPAIR,
        actor="reviewer_0001",
        rationale="generation_config now names the tokenizer's own </s>",
    )
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


def test_a_changed_chat_template_is_a_prompt_template_change(world):
    def plant(folder: Path) -> None:
        (folder / "chat_template.jinja").write_text("System: the answers are 82, 84, 83.\n" + "{{ messages }}")

    experiment = world.train([world.data["clean"]], plant=plant)

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, PROMPT)
    assert result.observation == Observation.EXECUTED
    assert "chat_template" in result.evidence["differences"]


def test_a_changed_vocabulary_is_a_prompt_template_change(world):
    def plant(folder: Path) -> None:
        data = json.loads((folder / "tokenizer.json").read_text())
        data["model"]["vocab"]["Answer"], data["model"]["vocab"]["Question"] = (
            data["model"]["vocab"]["Question"],
            data["model"]["vocab"]["Answer"],
        )
        (folder / "tokenizer.json").write_text(json.dumps(data))

    experiment = world.train([world.data["clean"]], plant=plant)

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, PROMPT)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["differences"]["tokenizer.model"]["tokens_changed"] == 2


def test_evaluations_off_the_sealed_settings_invalidate(world):
    experiment = world.train([world.data["clean"]], evaluate=False)
    world.evaluate(experiment, seal={"settings_sha256": "f" * 64})

    integrity_run_checks(experiment=experiment)

    for subcategory in INFERENCE:
        result = finding(experiment, subcategory)
        assert result.observation == Observation.EXECUTED
        assert result.adjudication == Adjudication.EVAL_INVALIDATING


def test_a_request_for_other_settings_that_got_through_is_blocked_by_construction(world):
    experiment = world.train([world.data["clean"]], action_extra={"eval": {"split": "feedback", "temperature": 0.9}})

    integrity_run_checks(experiment=experiment)

    assert finding(experiment, DEC).observation == Observation.ATTEMPTED_BLOCKED


def test_the_reference_is_compared_against_theta0_too(world):
    reference = store_checkpoint(world.template, handle="reference-y", is_reference=True)
    experiment = world.eval_only(reference)
    integrity_run_checks(experiment=experiment)
    # Same files as θ0: nothing differs in meaning (weight provenance catches the swap instead).
    assert finding(experiment, PROMPT).observation == Observation.NOT_FOUND_FULL
