"""Sealed benchmarks: register (copy + hash), verify-and-load, and install the minibench.

A benchmark is evaluator code + data + inference settings (DESIGN.md, "Sealed evaluation").
Registration copies the task's files and the evaluator source into
``settings.SEALED_ROOT/<name>/<version>/`` — outside the artifact store, readable only by
evaluation workers — and records a sha256 of each. Loading re-hashes every file from the bytes
it then parses, so what is verified is exactly what is used, and refuses with ``SealBroken`` on
any difference or missing file.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.benchmarks import sandbox
from apps.benchmarks.contract import ContractError, build_contract
from apps.benchmarks.models import Benchmark, Split
from apps.core.errors import ApplicationError, Conflict, NotFound
from apps.core.files import copy_tree_once
from apps.core.hashing import canonical_json, sha256_text
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.events import event_append
from apps.experiments.models import Checkpoint
from apps.experiments.services import checkpoint_register_once
from apps.integrity.contamination import ContaminationScanner
from apps.ml import evaluators

TASK_FILE = "task.json"
EVALUATOR_FILE = "evaluator.py"
SANDBOX_FILE = "sandbox.py"
INSPECT_TASK_FILE = "inspect_task.py"  # a task module sealed with the benchmark (inspect_task: "file")
SPLIT_FILES = {Split.FEEDBACK.value: "feedback.jsonl", Split.FINAL.value: "final.jsonl"}
THETA0_HANDLE = "minibench/theta0"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}(/[a-z0-9][a-z0-9._-]{0,63}){0,3}$")


class SealBroken(ApplicationError):
    """A sealed benchmark failed verification: a file is missing or differs from its registered hash."""

    status_code = 409

    def __init__(self, reason: str) -> None:
        super().__init__("seal_broken", f"Sealed benchmark refused: {reason}", reason=reason)
        self.reason = reason


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _settings_digest(task: dict[str, Any]) -> str:
    # Meaning, not bytes: re-indenting task.json does not change the settings.
    return sha256_text(canonical_json(task))


def _parse_split(data: bytes, *, label: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("id", "prompt", "answer")):
            raise ApplicationError("invalid_task", f"{label} line {lineno} needs string id, prompt and answer.")
        rows.append(row)
    return rows


def _read_task_dir(task_dir: Path) -> tuple[dict[str, Any], dict[str, bytes], dict[str, list[dict[str, Any]]]]:
    """task.json and the split files of a task folder, validated against the ML engineer's contract."""
    try:
        task = json.loads((task_dir / TASK_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ApplicationError("invalid_task", f"{task_dir} has no {TASK_FILE}.") from None
    except json.JSONDecodeError as exc:
        raise ApplicationError("invalid_task", f"{TASK_FILE} is not JSON: {exc}") from None
    if not isinstance(task, dict):
        raise ApplicationError("invalid_task", f"{TASK_FILE} is not an object.")
    if task.get("evaluator") not in evaluators.EVALUATORS:
        raise ApplicationError(
            "invalid_task", f"evaluator {task.get('evaluator')!r} is not one of {sorted(evaluators.EVALUATORS)}."
        )
    template = task.get("prompt_template")
    if not isinstance(template, str) or "{question}" not in template:
        raise ApplicationError("invalid_task", "prompt_template must be a string with a {question} slot.")
    if task.get("inspect_task") == "file" and not (task_dir / INSPECT_TASK_FILE).is_file():
        raise ApplicationError("invalid_task", f'inspect_task "file" needs {INSPECT_TASK_FILE} in {task_dir}.')
    if not isinstance(task.get("decoding"), dict):
        raise ApplicationError("invalid_task", "decoding must be an object (max_new_tokens, do_sample, ...).")
    stop = task.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApplicationError("invalid_task", "stop must be a list of strings.")
    raw: dict[str, bytes] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for split, filename in SPLIT_FILES.items():
        try:
            raw[split] = (task_dir / filename).read_bytes()
        except FileNotFoundError:
            raise ApplicationError("invalid_task", f"{task_dir} has no {filename}.") from None
        rows[split] = _parse_split(raw[split], label=filename)
        if not rows[split]:
            raise ApplicationError("invalid_task", f"{filename} has no samples.")
        ids = [r["id"] for r in rows[split]]
        if len(set(ids)) != len(ids) or seen & set(ids):
            raise ApplicationError("invalid_task", f"sample ids must be unique across splits ({filename}).")
        seen |= set(ids)
    return task, raw, rows


def _sealed_root() -> Path:
    return Path(settings.SEALED_ROOT).resolve()


def benchmark_register(
    *,
    name: str,
    task_dir: Path,
    version: int | None = None,
    reference_checkpoint: Checkpoint | None = None,
    strict: bool = False,
) -> Benchmark:
    """Seal a task folder (task.json, feedback.jsonl, final.jsonl) plus the evaluator source.

    The sealed folder also holds the sandbox source and, for an Inspect task module, the module;
    the contract (apps/benchmarks/contract.py) records all their hashes. ``strict`` (benchmark_add)
    requires every decoding setting to be explicit. Idempotent: registering the same content under
    the same name returns the existing version; different content gets the next version (or
    ``version`` if given and free).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ApplicationError("invalid_name", f"{name!r} is not a benchmark name (lowercase words joined by '/').")
    task_dir = Path(task_dir)
    task, raw, rows = _read_task_dir(task_dir)
    evaluator_source = Path(evaluators.__file__).read_bytes()
    code = {EVALUATOR_FILE: evaluator_source, SANDBOX_FILE: Path(sandbox.__file__).read_bytes()}
    if task.get("inspect_task") == "file":
        code[INSPECT_TASK_FILE] = (task_dir / INSPECT_TASK_FILE).read_bytes()
    packages = None
    if task.get("inspect_task"):
        from apps.benchmarks.adapters import inspect_packages  # noqa: PLC0415 - only Inspect tasks need it

        task_file = task_dir / INSPECT_TASK_FILE if task.get("inspect_task") == "file" else None
        packages = inspect_packages(task, task_file)
    try:
        contract = build_contract(
            task,
            code_sha256={filename: _sha256_bytes(data) for filename, data in code.items()},
            sample_counts={split: len(split_rows) for split, split_rows in rows.items()},
            packages=packages,
            strict=strict,
        )
    except ContractError as exc:
        raise ApplicationError("invalid_task", str(exc)) from None
    hashes = {
        "evaluator_sha256": _sha256_bytes(evaluator_source),
        "settings_sha256": _settings_digest(task),
        "data_sha256": {split: _sha256_bytes(data) for split, data in raw.items()},
    }
    sample_ids = {split: [r["id"] for r in split_rows] for split, split_rows in rows.items()}

    with transaction.atomic():
        same = [
            b
            for b in Benchmark.objects.select_for_update().filter(name=name).order_by("version")
            if (b.evaluator_sha256, b.settings_sha256, b.data_sha256)
            == (hashes["evaluator_sha256"], hashes["settings_sha256"], hashes["data_sha256"])
            and b.contract == contract
            and (version is None or b.version == version)
        ]
        if same:
            return _attach_reference(same[0], reference_checkpoint)
        taken = set(Benchmark.objects.filter(name=name).values_list("version", flat=True))
        if version is None:
            version = max(taken, default=0) + 1
        elif version in taken:
            raise Conflict("benchmark_exists", f"{name}@{version} exists with different content; use a new version.")

        sealed_dir = _sealed_root() / name / str(version)
        _write_sealed(sealed_dir, task_dir=task_dir, code=code)
        try:
            benchmark = Benchmark(
                name=name,
                version=version,
                task=str(task.get("name", name.rsplit("/", 1)[-1])),
                description=str(task.get("description", "")),
                evaluator=task["evaluator"],
                evaluator_sha256=hashes["evaluator_sha256"],
                settings=task,
                settings_sha256=hashes["settings_sha256"],
                sealed_path=str(sealed_dir),
                data_sha256=hashes["data_sha256"],
                sample_ids=sample_ids,
                contract=contract,
                contract_sha256=sha256_text(canonical_json(contract)),
                reference_checkpoint=reference_checkpoint,
            )
            benchmark.full_clean()
            benchmark.save(force_insert=True)
            event_append(
                type="benchmark.registered",
                actor="system",
                role="system",
                arguments={
                    "name": name,
                    "version": version,
                    **hashes,
                    "contract_sha256": benchmark.contract_sha256,
                    "adapter": contract["adapter"],
                    "samples": {s: len(ids) for s, ids in sample_ids.items()},
                },
                result_ref=f"benchmark:{benchmark.uuid}",
            )
        except BaseException:
            shutil.rmtree(sealed_dir, ignore_errors=True)
            raise
    return benchmark


def _attach_reference(benchmark: Benchmark, reference: Checkpoint | None) -> Benchmark:
    if reference is None or benchmark.reference_checkpoint_id == reference.pk:
        return benchmark
    if benchmark.reference_checkpoint_id is not None:
        raise Conflict("reference_differs", f"{benchmark} already has reference {benchmark.reference_checkpoint}.")
    benchmark.reference_checkpoint = reference
    benchmark.save(update_fields=["reference_checkpoint", "updated_at"])
    return benchmark


def _write_sealed(sealed_dir: Path, *, task_dir: Path, code: dict[str, bytes]) -> None:
    """Copy the sealed files into place through a temporary folder and a rename."""
    sealed_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = sealed_dir.parent / f".{sealed_dir.name}.{uuid.uuid4().hex}.partial"
    tmp.mkdir()
    try:
        for filename in (TASK_FILE, *SPLIT_FILES.values()):
            shutil.copyfile(task_dir / filename, tmp / filename)
        for filename, data in code.items():
            (tmp / filename).write_bytes(data)
        for path in tmp.iterdir():
            # Read-only is a guard against accidents, not the security boundary (OS users are).
            path.chmod(0o444)
        if sealed_dir.exists():
            # A folder without a Benchmark row is a leftover of a registration that failed after
            # copying; nothing refers to it.
            shutil.rmtree(sealed_dir)
        tmp.rename(sealed_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _refuse(benchmark: Benchmark, reason: str) -> SealBroken:
    """Record the refusal (evidence for the evaluation-harness subcategory) and build the error."""
    event_append(
        type="benchmark.seal_broken",
        actor="system",
        role="system",
        arguments={"benchmark": benchmark.name, "version": benchmark.version, "reason": reason},
        result_ref=f"benchmark:{benchmark.uuid}",
    )
    return SealBroken(reason)


def _sealed_bytes(benchmark: Benchmark, filename: str) -> bytes:
    path = Path(benchmark.sealed_path) / filename
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise _refuse(benchmark, f"{filename} is missing from the sealed folder") from None
    except OSError as exc:
        raise _refuse(benchmark, f"{filename} cannot be read: {exc.strerror}") from None


def _verify_common(benchmark: Benchmark) -> bytes:
    """Check the evaluator copy and the settings; return the verified evaluator source."""
    source = _sealed_bytes(benchmark, EVALUATOR_FILE)
    got = _sha256_bytes(source)
    if got != benchmark.evaluator_sha256:
        raise _refuse(
            benchmark, f"evaluator code changed (sha256 {got[:12]}…, registered {benchmark.evaluator_sha256[:12]}…)"
        )
    task_bytes = _sealed_bytes(benchmark, TASK_FILE)
    try:
        task = json.loads(task_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _refuse(benchmark, f"{TASK_FILE} is no longer valid JSON") from None
    if _settings_digest(task) != benchmark.settings_sha256:
        raise _refuse(benchmark, f"inference settings in {TASK_FILE} changed since registration")
    if _settings_digest(benchmark.settings) != benchmark.settings_sha256:
        raise _refuse(benchmark, "inference settings in the database changed since registration")
    _verify_contract(benchmark)
    return source


def _verify_contract(benchmark: Benchmark) -> dict[str, bytes]:
    """Check the contract's own hash and every sealed code file it names; return those files.

    Rows registered before contracts existed (empty contract and hash) have only the checks of
    ``_verify_common``; a row with one of the two emptied is refused.
    """
    if not benchmark.contract and not benchmark.contract_sha256:
        return {}
    if sha256_text(canonical_json(benchmark.contract)) != benchmark.contract_sha256:
        raise _refuse(benchmark, "the benchmark contract in the database changed since registration")
    files: dict[str, bytes] = {}
    for filename, want in benchmark.contract.get("code_sha256", {}).items():
        data = _sealed_bytes(benchmark, filename)
        got = _sha256_bytes(data)
        if got != want:
            raise _refuse(benchmark, f"task code {filename} changed (sha256 {got[:12]}…, registered {want[:12]}…)")
        files[filename] = data
    return files


def benchmark_verified_code(*, benchmark: Benchmark) -> dict[str, bytes]:
    """Every sealed code file of the benchmark (evaluator, sandbox, task module), hash-verified."""
    _verify_common(benchmark)
    return _verify_contract(benchmark)


def benchmark_load_sealed(*, benchmark: Benchmark, split: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Verify every hash, then return (samples, settings) for one split.

    ``settings`` is the task's inference contract (task.json: evaluator, prompt_template,
    decoding, stop, use_chat_template) plus ``seal``: the hashes just verified, for the
    evaluation record. Raises ``SealBroken`` (and records an event) on any mismatch.
    """
    if split not in SPLIT_FILES:
        raise ApplicationError("invalid_split", f"split must be one of {sorted(SPLIT_FILES)}.")
    _verify_common(benchmark)
    data = _sealed_bytes(benchmark, SPLIT_FILES[split])
    got = _sha256_bytes(data)
    want = benchmark.data_sha256.get(split)
    if got != want:
        raise _refuse(benchmark, f"{SPLIT_FILES[split]} changed (sha256 {got[:12]}…, registered {str(want)[:12]}…)")
    try:
        rows = _parse_split(data, label=SPLIT_FILES[split])
    except (ApplicationError, ValueError):
        raise _refuse(benchmark, f"{SPLIT_FILES[split]} no longer parses") from None
    ids = [r["id"] for r in rows]
    if ids != list(benchmark.sample_ids.get(split, [])):
        raise _refuse(benchmark, f"sample ids of {split} differ from the registered list")
    info = dict(benchmark.settings)
    info["seal"] = {
        "benchmark": benchmark.name,
        "version": benchmark.version,
        "split": split,
        "evaluator_sha256": benchmark.evaluator_sha256,
        "settings_sha256": benchmark.settings_sha256,
        "data_sha256": got,
        "samples": len(rows),
    }
    return rows, info


def benchmark_sealed_items(*, benchmark: Benchmark) -> list[dict[str, Any]]:
    """Both splits' verified items (each with its ``split``), for contamination scans."""
    items: list[dict[str, Any]] = []
    for split in SPLIT_FILES:
        rows, _ = benchmark_load_sealed(benchmark=benchmark, split=split)
        items.extend({**row, "split": split} for row in rows)
    return items


def benchmark_scanner(*, benchmark: Benchmark, **options: Any) -> ContaminationScanner:
    """A contamination scanner over both sealed splits of a registered benchmark (hashes verified first).

    The benchmark's own prompt template is stripped from rows before near-duplicate comparison,
    and its evaluator picks the salient-content rule (numbers and answer, options, call arguments).
    Raises ``SealBroken`` if the sealed files fail verification.
    """
    template = str((benchmark.settings or {}).get("prompt_template", ""))
    options.setdefault("templates", [template] if template else [])
    options.setdefault("evaluator", benchmark.evaluator)
    return ContaminationScanner(benchmark_sealed_items(benchmark=benchmark), **options)


def _exec_sealed(module_name: str, source: bytes, filename: str) -> types.ModuleType:
    """Execute hash-verified sealed source as a module (listed in sys.modules while it runs,
    which dataclasses need; removed after, so nothing else imports it by accident)."""
    module = types.ModuleType(module_name)
    sys.modules[module_name] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - hash-verified sealed copy of our own code
    finally:
        sys.modules.pop(module_name, None)
    return module


def benchmark_scorer(*, benchmark: Benchmark) -> Callable[[str, str], bool]:
    """The benchmark's evaluator, executed from the verified sealed copy of its source.

    The bytes that are hashed are the bytes that are compiled, so the code that scores is the
    code that was registered, even if ``apps/ml/evaluators.py`` has changed since.
    """
    source = _verify_common(benchmark)
    code = _verify_contract(benchmark)
    label = f"{benchmark.name}@{benchmark.version}"
    module = _exec_sealed(f"sealed_evaluator_{benchmark.evaluator_sha256[:12]}", source, f"<sealed {label} evaluator>")
    if SANDBOX_FILE in code:
        # Code tasks run under the sandbox that was registered, not the worker's current one.
        digest = benchmark.contract["code_sha256"][SANDBOX_FILE][:12]
        module._sandbox = _exec_sealed(f"sealed_sandbox_{digest}", code[SANDBOX_FILE], f"<sealed {label} sandbox>")  # type: ignore[attr-defined]
    name = benchmark.evaluator

    def scorer(output: str, answer: str) -> bool:
        return bool(module.score(name, output, answer))

    return scorer


def benchmark_resolve(reference: str) -> Benchmark:
    """A benchmark by uuid, ``name@version`` or ``name`` (its latest version)."""
    try:
        key = uuid.UUID(reference)
    except ValueError:
        pass
    else:
        found = Benchmark.objects.filter(uuid=key).first()
        if found is None:
            raise NotFound("benchmark_not_found", f"No benchmark {reference}.")
        return found
    name, _, version = reference.partition("@")
    benchmarks = Benchmark.objects.filter(name=name)
    if version:
        benchmarks = benchmarks.filter(version=int(version)) if version.isdigit() else benchmarks.none()
    found = benchmarks.order_by("-version").first()
    if found is None:
        raise NotFound("benchmark_not_found", f"No benchmark {reference!r}.")
    return found


# --------------------------------------------------------------------------- checkpoints outside the store


def checkpoint_local_dir(*, checkpoint: Checkpoint) -> Path:
    """A local folder with a checkpoint's files: the artifact store's copy, or a sealed reference.

    Reference checkpoints live under SEALED_ROOT (only evaluation workers read them), so their
    ``file://`` URIs are not artifact-store URIs; anything else outside both roots is refused.
    """
    uri = checkpoint.uri
    if uri.startswith("file://"):
        path = Path(uri.removeprefix("file://")).resolve()
        if path.is_relative_to(_sealed_root()):
            if not path.is_dir():
                raise ApplicationError("artifact_missing", f"{uri} does not exist.", status=404)
            return path
    return artifact_store().local_path(uri)


# --------------------------------------------------------------------------- the minibench


# The refusal's remedy when a minibench install meets a checkpoint with other weights.
_OTHER_BUILD = "a minibench built from another seed or profile needs its own database"


def _seal_reference(directory: Path, *, task: str, digest: str) -> str:
    """Copy a reference checkpoint under SEALED_ROOT (write-once, content-addressed); return its URI."""
    return copy_tree_once(directory, _sealed_root() / "minibench" / task / "references" / digest).as_uri()


def minibench_install(*, root: Path) -> dict[str, Any]:
    """Register a built minibench: θ0 (one shared base), each task's reference and sealed benchmark.

    θ0 goes into the artifact store as ``minibench/theta0`` (is_base). Each task becomes
    benchmark ``minibench/<task>`` with reference ``minibench/<task>/reference`` (is_reference,
    no parent: references are deliberately not on θ0's lineage, so a Worker that submitted one
    would fail the weight-provenance check). Idempotent: re-running changes nothing. A build whose
    manifest names a ``namespace`` (the hard profile's "minibench-hard") registers under it instead
    of "minibench", so it can sit beside a `ci` build in one database.
    """
    root = Path(root)
    try:
        manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ApplicationError(
            "minibench_missing", f"{root} has no manifest.json; build the minibench first."
        ) from None
    store = artifact_store()
    namespace = str(manifest.get("namespace") or "minibench")
    theta0, theta0_new = checkpoint_register_once(
        handle=f"{namespace}/theta0",
        directory=root / manifest["theta0"],
        store=lambda digest: store.put_dir(root / manifest["theta0"], key=checkpoint_key(digest)),
        remedy=_OTHER_BUILD,
        is_base=True,
    )
    installed: list[dict[str, Any]] = []
    for task in manifest["tasks"]:
        ref_dir = root / manifest["references"][task]
        sealed_task = task if namespace == "minibench" else f"{namespace}/{task}"
        reference, reference_new = checkpoint_register_once(
            handle=f"{namespace}/{task}/reference",
            directory=ref_dir,
            store=lambda digest, d=ref_dir, t=sealed_task: _seal_reference(d, task=t, digest=digest),
            remedy=_OTHER_BUILD,
            is_reference=True,
        )
        before = Benchmark.objects.filter(name=f"{namespace}/{task}").count()
        benchmark = benchmark_register(
            name=f"{namespace}/{task}", task_dir=root / "tasks" / task, reference_checkpoint=reference
        )
        installed.append(
            {
                "task": task,
                "benchmark": f"{benchmark.name}@{benchmark.version}",
                "benchmark_created": Benchmark.objects.filter(name=f"{namespace}/{task}").count() > before,
                "reference": reference.handle,
                "reference_created": reference_new,
            }
        )
    return {
        "root": str(root),
        "seed": manifest.get("seed"),
        "profile": manifest.get("profile"),
        "theta0": theta0.handle,
        "theta0_created": theta0_new,
        "tasks": installed,
        "datasets": manifest.get("datasets", []),
    }
