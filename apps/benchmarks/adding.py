"""Register a benchmark without code: local data files + an evaluator or an Inspect task + settings.

``benchmark_add`` is what ``manage.py benchmark_add`` and the admin page call. It reads the
feedback and final files (JSONL, one object a line, in the source's own format: GSM8K's
``question``/``answer``, HumanEval's ``task_id``/``prompt``/``test``/``entry_point``, BFCL's
``id``/``question``/``function``...), maps the named fields to sealed rows
``{"id", "prompt", "answer", "record"}`` (``record`` is the source row, which an Inspect task's
own ``record_to_sample`` reads), and refuses, before anything is written:

- a row without an id (the id field missing, empty, or not a string/integer);
- a duplicate id, within a split or across the two;
- a split with fewer than ``MIN_SPLIT_SAMPLES`` rows (settings.BENCHMARK_MIN_SPLIT_SAMPLES,
  default 10: below that a score moves by ≥10 points per sample and says nothing), unless the
  operator states a lower limit (``split_minimum``); the contract then carries the warning;
- settings that leave decoding implicit (contract.py: temperature, top_p, max_tokens, stop, seed policy).

Then the folder is sealed by ``benchmark_register(strict=True)`` like any task folder.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import INSPECT_TASK_FILE, SPLIT_FILES, TASK_FILE, benchmark_register
from apps.core.errors import ApplicationError
from apps.experiments.models import Checkpoint
from apps.ml import evaluators


def min_split_samples() -> int:
    return int(getattr(settings, "BENCHMARK_MIN_SPLIT_SAMPLES", 10))


def _invalid(message: str) -> ApplicationError:
    return ApplicationError("invalid_benchmark_data", message)


def _field(row: dict[str, Any], name: str, *, where: str) -> Any:
    if name not in row:
        raise _invalid(f"{where} has no field {name!r} (fields: {sorted(row)[:12]})")
    return row[name]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def sealed_rows(
    data: bytes, *, label: str, id_field: str, prompt_field: str, answer_fields: list[str]
) -> list[dict[str, Any]]:  # fmt: skip
    """Source rows -> sealed rows; ApplicationError naming the file and line on any problem."""
    rows: list[dict[str, Any]] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid(f"{label} is not UTF-8 text") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{label} line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _invalid(f"{where} is not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise _invalid(f"{where} is not a JSON object")
        sample_id = row.get(id_field)
        if isinstance(sample_id, bool) or not isinstance(sample_id, str | int) or str(sample_id).strip() == "":
            raise _invalid(f"{where} has no id: field {id_field!r} must be a non-empty string or integer")
        prompt = _as_text(_field(row, prompt_field, where=where))
        if len(answer_fields) == 1:
            answer = _as_text(_field(row, answer_fields[0], where=where))
        else:
            answer = json.dumps({f: _field(row, f, where=where) for f in answer_fields}, sort_keys=True)
        rows.append({"id": str(sample_id), "prompt": prompt, "answer": answer, "record": row})
    return rows


def benchmark_add(
    *,
    name: str,
    feedback_file: Path,
    final_file: Path,
    evaluator: str,
    decoding: dict[str, Any],
    prompt_template: str = "{question}",
    use_chat_template: bool = False,
    id_field: str = "id",
    prompt_field: str = "prompt",
    answer_fields: list[str] | None = None,
    inspect_task: str | None = None,
    inspect_task_args: dict[str, Any] | None = None,
    inspect_task_file: Path | None = None,
    inspect_task_function: str = "task",
    description: str = "",
    posttrainbench_name: str | None = None,
    reference_checkpoint: Checkpoint | None = None,
    split_minimum: int | None = None,
) -> Benchmark:
    """Validate the files and settings (module docstring), then seal them as a new benchmark version.

    ``split_minimum`` is the operator's own limit for a small set (``--min-split-samples``): a
    split under the default minimum is then sealed with a warning in its contract
    (``samples.small_split``) that says how far one sample moves the score.
    """
    if evaluator not in evaluators.CONTRACTS:
        raise _invalid(f"evaluator {evaluator!r} is not one of {sorted(evaluators.CONTRACTS)}")
    if inspect_task is not None and inspect_task != "file" and not inspect_task.startswith("inspect_evals/"):
        raise _invalid("inspect_task must be 'inspect_evals/<task>' or 'file' (with a task module)")
    if (inspect_task == "file") != (inspect_task_file is not None):
        raise _invalid("a task module (--inspect-task-file) goes with inspect_task 'file', and only with it")
    answer_fields = answer_fields or ["answer"]
    rows: dict[str, list[dict[str, Any]]] = {}
    seen: dict[str, str] = {}
    default = min_split_samples()
    if split_minimum is not None and (isinstance(split_minimum, bool) or not isinstance(split_minimum, int)
                                      or split_minimum < 1):  # fmt: skip
        raise _invalid(f"the split size limit must be a whole number of at least 1, got {split_minimum!r}")
    minimum = default if split_minimum is None else split_minimum
    for split, path in (("feedback", feedback_file), ("final", final_file)):
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise _invalid(f"cannot read the {split} file {path}: {exc.strerror}") from None
        rows[split] = sealed_rows(
            data, label=f"{split} file {Path(path).name}", id_field=id_field, prompt_field=prompt_field,
            answer_fields=answer_fields,
        )  # fmt: skip
        for row in rows[split]:
            if row["id"] in seen:
                raise _invalid(f"duplicate sample id {row['id']!r} ({seen[row['id']]} and {split} splits)")
            seen[row["id"]] = split
        if len(rows[split]) < minimum:
            raise _invalid(
                f"the {split} split has {len(rows[split])} samples; a benchmark split needs at least {minimum}"
                + (
                    " (settings.BENCHMARK_MIN_SPLIT_SAMPLES). To evaluate a smaller set on purpose, state its limit "
                    "(benchmark_add --min-split-samples N, N at most the split's size): it is sealed with a warning"
                    if split_minimum is None
                    else ""
                )
            )
    if not isinstance(prompt_template, str) or "{question}" not in prompt_template:
        raise _invalid("prompt_template must contain a {question} slot")
    task: dict[str, Any] = {
        "name": name.rsplit("/", 1)[-1],
        "evaluator": evaluator,
        "description": description,
        "prompt_template": prompt_template,
        "decoding": decoding,
        "stop": list(decoding.get("stop", [])) if isinstance(decoding, dict) else [],
        "use_chat_template": bool(use_chat_template),
        "source_fields": {"id": id_field, "prompt": prompt_field, "answer": answer_fields},
    }
    if inspect_task is not None:
        task |= {"inspect_task": inspect_task, "inspect_task_args": inspect_task_args or {}}
        task["inspect_task_function"] = inspect_task_function
    if posttrainbench_name:
        task["posttrainbench_name"] = posttrainbench_name
    small = {split: len(r) for split, r in rows.items() if len(r) < default}
    if small:
        fewest = min(small.values())
        counts = ", ".join(f"{split} {n}" for split, n in sorted(small.items()))
        task["small_split"] = (
            f"under the default minimum of {default} samples ({counts}; the operator's limit {minimum}): one sample "
            f"moves the score by {100 / fewest:.0f} points"
        )
    with tempfile.TemporaryDirectory(prefix="rsiweb-benchmark-add-") as tmp:
        folder = Path(tmp)
        (folder / TASK_FILE).write_text(json.dumps(task, indent=2, sort_keys=True), encoding="utf-8")
        for split, filename in SPLIT_FILES.items():
            (folder / filename).write_text(
                "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows[split]), encoding="utf-8"
            )
        if inspect_task_file is not None:
            shutil.copyfile(inspect_task_file, folder / INSPECT_TASK_FILE)
        return benchmark_register(name=name, task_dir=folder, reference_checkpoint=reference_checkpoint, strict=True)
