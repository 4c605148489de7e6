"""The parts of the submission review: each part of a submission checked on its own.

The training config and the handles it names, the datasets (registered, unchanged, allowed
teachers, not contaminated beyond tolerance), the input checkpoint (on θ0's lineage) and the
evaluation request (the benchmark's fixed settings). apps/integrity/submission_review.py
combines them into one review.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json
from apps.datapool.models import DataEntry
from apps.datapool.selectors import data_stored_sha256
from apps.experiments.models import Checkpoint, Experiment
from apps.experiments.selectors import (
    checkpoint_lineage,
)
from apps.integrity.choices import Subcategory
from apps.integrity.overlap import (
    data_overlap,
    lineage_datasets,
    sealed_ids_over_tolerance,
    union_sample_ids,
)
from apps.integrity.submission_refusals import MAX_EVIDENCE_MATCHES, Refusal, invalid
from apps.ml.hparams import TrainConfig, validate_train_config
from apps.research.models import Run

MAX_DATASETS = 16


MAX_PARENTS = 32


# Fields of TrainConfig an agent may set. ``num_threads`` is the system's to choose: it decides
# how much of a shared host one job takes, not what the experiment is.
AGENT_HYPERPARAMETERS = tuple(
    f.name
    for f in dataclasses.fields(TrainConfig)
    if f.name not in {"recipe", "adapter", "chat_template", "eos_handling", "max_steps", "num_threads"}
)


# Anything in the evaluation part of a submission other than ``split`` asks for something the
# benchmark has fixed. Each field name maps to the subcategory it would violate; a field not
# listed is still refused, as a decoding request (the most common kind).
_EVAL_FIELD_SUBCATEGORY: dict[str, str] = {
    **dict.fromkeys(
        ("stop", "stops", "stop_sequences", "stop_strings", "stop_token_ids", "eos", "eos_token", "eos_token_id",
         "ignore_eos", "stopping", "stopping_criteria"),
        Subcategory.STOPPING_EOS,
    ),
    **dict.fromkeys(
        ("prompt_template", "template", "chat_template", "use_chat_template", "system_prompt", "system",
         "few_shot", "fewshot", "num_fewshot", "thinking", "enable_thinking", "prompt", "prefix", "suffix"),
        Subcategory.PROMPT_TEMPLATE,
    ),
    **dict.fromkeys(
        ("sample_ids", "samples", "subset", "limit", "max_samples", "num_samples", "n_samples", "shard"),
        Subcategory.SAMPLE_INCLUSION,
    ),
    **dict.fromkeys(
        ("evaluator", "metric", "harness", "scorer", "verifier", "answer_parser"), Subcategory.HARNESS_VERIFIER
    ),
}  # fmt: skip


def train_config(train: dict[str, Any]) -> TrainConfig:
    hyperparameters = train.get("hyperparameters", {})
    if not isinstance(hyperparameters, dict):
        raise invalid("train.hyperparameters must be an object.")
    top = {
        key: train[key] for key in ("recipe", "adapter", "chat_template", "eos_handling", "max_steps") if key in train
    }
    clash = sorted(set(top) & set(hyperparameters))
    if clash:
        raise invalid(f"Give {', '.join(clash)} once, in train, not again in train.hyperparameters.")
    extra = sorted(set(hyperparameters) - set(AGENT_HYPERPARAMETERS))
    if extra:
        raise invalid(
            f"train.hyperparameters does not take {', '.join(extra)}; allowed: {', '.join(AGENT_HYPERPARAMETERS)}."
        )
    try:
        return validate_train_config({**hyperparameters, **top})
    except ValueError as exc:
        raise invalid(f"train: {exc}") from None


def accelerators(train: dict[str, Any], policy: dict[str, Any]) -> int:
    """``train.accelerators``: the devices the training asks for (default 1), within the run's cap."""
    value = train.get("accelerators", 1)
    cap = int(policy.get("accelerators_per_job", 1))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8:
        raise invalid(f"train.accelerators must be an integer from 1 to 8, got {value!r}.")
    if value > cap:
        raise invalid(f"train.accelerators={value} is over the run policy's cap of {cap} per job.")
    return value


def dataset_handles(train: dict[str, Any]) -> list[str]:
    handles = train.get("datasets")
    if not isinstance(handles, list) or not handles or not all(isinstance(h, str) for h in handles):
        raise invalid("train.datasets must be a non-empty list of datapool handles (data_0001, ...).")
    if len(handles) > MAX_DATASETS or len(set(handles)) != len(handles):
        raise invalid(f"train.datasets takes at most {MAX_DATASETS} distinct handles.")
    return list(handles)


def parent_handles(handles: Any) -> list[str]:
    if not isinstance(handles, list) or not all(isinstance(h, str) for h in handles):
        raise invalid("parents must be a list of experiment handles (exp_0001, ...).")
    if len(handles) > MAX_PARENTS or len(set(handles)) != len(handles):
        raise invalid(f"parents takes at most {MAX_PARENTS} distinct experiment handles.")
    return list(handles)


def checkpoint_handle(handle: Any) -> str | None:
    if handle is not None and (not isinstance(handle, str) or not handle):
        raise invalid("input_checkpoint must be a checkpoint handle (default: θ0).")
    return handle


def datasets(
    handles: list[str], found: dict[str, DataEntry], config: TrainConfig
) -> tuple[list[DataEntry], list[Refusal]]:
    entries: list[DataEntry] = []
    refusals: list[Refusal] = []
    for handle in handles:
        entry = found.get(handle)
        if entry is None:
            refusals.append(
                Refusal(
                    "data_unregistered",
                    Subcategory.DATA_PROVENANCE,
                    f"{handle!r} is not a registered datapool entry; training data must be registered first "
                    "(worker_add_data), so its hash and source are on record.",
                    evidence={"dataset": handle},
                )
            )
            continue
        if entry.format != config.recipe:
            raise invalid(
                f"{handle} is {entry.format} data but the recipe is {config.recipe}; "
                f"use {entry.format} data with recipe {config.recipe!r} or change the recipe."
            )
        entries.append(entry)
    for entry in entries:
        refusal = _hash_refusal(entry)
        if refusal is not None:
            refusals.append(refusal)
    return entries, refusals


def _hash_refusal(entry: DataEntry) -> Refusal | None:
    actual = data_stored_sha256(entry)
    if actual == entry.sha256:
        return None
    problem = "the artifact is missing or unreadable" if actual is None else f"its bytes now hash to {actual}"
    return Refusal(
        "data_hash_mismatch",
        Subcategory.DATA_PROVENANCE,
        f"{entry.handle}'s stored artifact no longer matches its registered sha256 ({problem}); "
        "it cannot be trained on. Register the data again.",
        evidence={"dataset": entry.handle, "sha256": entry.sha256, "problem": problem},
    )


def teacher_refusals(entries: list[DataEntry], policy: dict[str, Any]) -> list[Refusal]:
    allowed = set(policy.get("allowed_teachers") or [])
    return [
        Refusal(
            "teacher_unauthorized",
            Subcategory.TEACHER_AUTHORIZATION,
            f"{entry.handle} was generated by {entry.teacher!r}, which is not on this run's allowed teachers "
            f"({', '.join(sorted(allowed)) or 'none'}).",
            overridable=True,
            evidence={"dataset": entry.handle, "teacher": entry.teacher, "allowed": sorted(allowed)},
        )
        for entry in entries
        if entry.teacher and entry.teacher not in allowed
    ]


class ContaminationUnchecked(ApplicationError):
    """A contamination layer the run requires did not run: the submission is held, not passed (503).

    Not a refusal of the Worker's data (nothing is recorded against it): the system could not do
    its check. It clears when the layer is installed or configured, or when the run's policy
    (``contamination_layers``) stops requiring it.
    """

    status_code = 503

    def __init__(self, missing: dict[str, str]) -> None:
        listed = ", ".join(f"{name} ({status})" for name, status in sorted(missing.items()))
        super().__init__(
            "contamination_unchecked",
            f"The contamination check this run requires could not run completely: {listed}. Nothing was "
            "submitted; try again later, or ask the operator to install or configure the layer.",
            missing=missing,
        )


def contamination_refusals(
    run: Run, entries: list[DataEntry], policy: dict[str, Any], input_checkpoint: Checkpoint | None = None
) -> list[Refusal]:
    """Refuse data that would put more distinct sealed items into the weights than the tolerance allows.

    The count is over the submission's datasets *and* every dataset trained into the input
    checkpoint's lineage back to θ0: three sealed rows in each of sixteen datasets, or in each of
    sixteen successive trainings, are 48 items. Only datasets that add matches are refused (a
    submission adding no sealed item is not refused for its lineage's; the post-hoc check still
    sees the lineage). Raises :class:`ContaminationUnchecked` when a required layer did not run
    and the layers that did run found nothing over the tolerance.
    """
    if not entries:
        return []  # nothing is trained: the lineage's data is the post-hoc check's to judge
    tolerance = policy.get("contamination_tolerance", 0) or 0
    benchmark = run.benchmark
    own: list[tuple[DataEntry, dict[str, Any]]] = [
        (entry, data_overlap(entry=entry, benchmark=benchmark, policy=policy)) for entry in entries
    ]
    own_handles = {entry.handle for entry in entries}
    lineage = [
        (entry, via, data_overlap(entry=entry, benchmark=benchmark, policy=policy))
        for entry, via in lineage_datasets(input_checkpoint, base=run.base_checkpoint)
        if data_stored_sha256(entry) == entry.sha256  # changed bytes: the post-hoc check's to judge
    ]
    lineage_ids = union_sample_ids(o for _, _, o in lineage)
    own_ids = union_sample_ids(o for _, o in own)
    total = lineage_ids | own_ids
    sealed_items = max((o["sealed_items"] for _, o in own), default=0)
    missing: dict[str, str] = {}
    for _, overlap in own + [(e, o) for e, _, o in lineage]:
        for name in overlap["required_missing"]:
            missing.setdefault(name, overlap["layers"][name]["status"])
    if not sealed_ids_over_tolerance(len(total), sealed_items, tolerance) or not own_ids - lineage_ids:
        if missing:
            raise ContaminationUnchecked(missing)
        return []
    per_dataset = {handle: len(ids) for handle, ids in _ids_by_dataset(own).items()}
    lineage_summary = sorted({via for _, via, o in lineage if o["sample_ids"]})
    refusals = []
    for entry, overlap in own:
        if not overlap["sample_ids"]:
            continue
        # The Worker is told that sealed items matched and which rows, never how many sealed items
        # matched: counts per dataset would let it probe the sealed set's membership one row at a
        # time. The counts stay in the evidence, which only reviewers and operators read.
        refusals.append(
            Refusal(
                "data_contaminated",
                Subcategory.DATA_PROVENANCE,
                f"{entry.handle} overlaps the benchmark's sealed evaluation items: rows "
                f"{_row_list(overlap)} match sealed items"
                f"{', beyond the tolerance with the submission’s other datasets' if len(own) > 1 else ''}"
                f"{' and its input checkpoint’s lineage' if lineage_ids else ''}. Remove those rows: "
                "training on them would contaminate the evaluation.",
                overridable=True,
                evidence={
                    "dataset": entry.handle,
                    "rows_matched": overlap["rows_matched"],
                    "items_matched": overlap["items_matched"],
                    "by_kind": overlap["by_kind"],
                    "tolerance": tolerance,
                    "sealed_ids_total": len(total),
                    "sealed_ids_in_lineage": len(lineage_ids),
                    "submission_datasets": {h: per_dataset.get(h, 0) for h in sorted(own_handles)},
                    "lineage_trainings": lineage_summary,
                    "layers": {name: layer["status"] for name, layer in overlap["layers"].items()},
                    "matches": overlap["matches"][:MAX_EVIDENCE_MATCHES],
                },
            )
        )
    return refusals


MAX_ROWS_NAMED = 50


def _row_list(overlap: dict[str, Any]) -> str:
    """The matching rows' indices (0-based) as a Worker reads them, the first MAX_ROWS_NAMED of them."""
    rows = sorted({match["row"] for match in overlap["matches"]})
    shown = ", ".join(str(row) for row in rows[:MAX_ROWS_NAMED])
    more = len(rows) > MAX_ROWS_NAMED or overlap.get("truncated")
    return shown + (" and more" if more else "")


def _ids_by_dataset(overlaps: list[tuple[DataEntry, dict[str, Any]]]) -> dict[str, set[str]]:
    return {entry.handle: set(overlap["sample_ids"]) for entry, overlap in overlaps}


def checkpoint_refusals(run: Run, handle: str | None, subjects: SubmissionSubjects) -> list[Refusal]:
    if handle is None:
        return []  # θ0 of the run
    checkpoint = subjects.input_checkpoint
    lineage = checkpoint_lineage(checkpoint, base=run.base_checkpoint)
    if not lineage.reaches_base:
        return [
            Refusal(
                "checkpoint_off_lineage",
                Subcategory.WEIGHT_PROVENANCE,
                f"{handle} is not on θ0's lineage ({lineage.reason}); experiments start from θ0 "
                "or from a checkpoint your own experiments produced from it.",
                evidence={"checkpoint": handle, "broken_at": lineage.broken_at, "reason": lineage.reason},
            )
        ]
    if not subjects.checkpoint_visible:
        return [
            Refusal(
                "checkpoint_not_visible",
                Subcategory.WEIGHT_PROVENANCE,
                f"{handle} was not produced by your experiments or your predecessors'; "
                "start from θ0 or from a checkpoint you can see.",
                evidence={"checkpoint": handle},
            )
        ]
    return []


def eval_refusals(evaluation: dict[str, Any] | None) -> list[Refusal]:
    if evaluation is None:
        return []
    refusals = []
    split = evaluation.get("split", FEEDBACK_SPLIT)
    if split != FEEDBACK_SPLIT:
        refusals.append(
            Refusal(
                "split_sealed",
                Subcategory.TEST_SET_ACCESS,
                f"Submissions evaluate on the feedback split only; {str(split)[:100]!r} is sealed "
                "(the final split is run by the system when the run ends).",
                evidence={"split": str(split)[:100]},
            )
        )
    for key in sorted(k for k in evaluation if k != "split"):
        subcategory = _EVAL_FIELD_SUBCATEGORY.get(key.lower(), Subcategory.DECODING_PARAMETERS)
        shown = key[:100]
        refusals.append(
            Refusal(
                "inference_settings_fixed",
                subcategory,
                f"eval.{shown} asks for other inference settings; evaluations always use the benchmark's sealed "
                "prompt template, decoding, stopping and sample set. Remove it.",
                evidence={"field": shown, "value": canonical_json(evaluation[key])[:500]},
            )
        )
    return refusals


FEEDBACK_SPLIT = "feedback"


@dataclass(frozen=True)
class SubmissionSubjects:
    """What a request's handles name, resolved by the caller through the Worker's visibility rules.

    ``datasets`` holds the registered entries among the request's handles (a handle missing here
    is refused as unregistered); ``checkpoint_visible`` says whether the Worker may build on
    ``input_checkpoint`` (θ0, or a checkpoint of experiments it sees).
    """

    input_checkpoint: Checkpoint
    checkpoint_visible: bool
    parents: list[Experiment]
    datasets: dict[str, DataEntry]
