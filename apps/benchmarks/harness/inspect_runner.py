"""Run one Inspect task on sealed samples; executed by the Inspect environment's Python, never imported.

The evaluation worker (apps/benchmarks/adapters.py) starts this script with
``<envs>/inspect-<hash>/bin/python inspect_runner.py describe|run SPEC.json OUT.json``.
It imports nothing of rsiweb: its inputs are the spec file, its output one JSON file.

- ``describe``: the task's source hash (every ``.py`` of an inspect_evals task's package, or the
  sealed task module) and the installed inspect-ai / inspect-evals versions, for registration.
- ``run``: refuse unless the task source hashes to the registered value; build the task with its
  dataset loaders replaced by the sealed rows (the task's own ``record_to_sample`` converts each
  row's native ``record``; the sample id is forced to the sealed id); force the decoding of the
  contract (temperature, top_p, max_tokens, stop, seed; an unset value never reaches a provider
  default); run it against the OpenAI-compatible endpoint given in the spec; write one record
  per sample: id, output, and the Inspect scorer's value when scoring is on.

Hub access is turned off (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) before inspect is imported, so a
loader that was not replaced fails instead of downloading.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("INSPECT_LOG_LEVEL", "warning")


def _versions() -> dict[str, str]:
    from importlib.metadata import version  # noqa: PLC0415

    return {"inspect-ai": version("inspect-ai"), "inspect-evals": version("inspect-evals")}


def _task_function(spec: dict[str, Any]) -> tuple[Any, Any, list[Path]]:
    """(task function, its module, the source files that define it) for the spec's task."""
    name = spec["task"]
    if name == "file":
        path = Path(spec["task_file"])
        module_spec = importlib.util.spec_from_file_location("sealed_inspect_task", path)
        assert module_spec is not None
        assert module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules["sealed_inspect_task"] = module
        module_spec.loader.exec_module(module)
        return getattr(module, spec["task_function"]), module, [path]
    package_name, _, function = name.partition("/")
    if package_name != "inspect_evals" or not function.isidentifier():
        raise SystemExit(f"inspect task must be 'inspect_evals/<task>' or 'file', not {name!r}")
    package = importlib.import_module(f"inspect_evals.{function}")
    task_fn = getattr(package, function)
    module = sys.modules[task_fn.__module__]
    folder = Path(package.__file__ or "").parent
    return task_fn, module, sorted(folder.rglob("*.py"))


def _source_sha256(files: list[Path]) -> str:
    """sha256 over (path relative to the task's folder, sha256 of the file) of every source file.

    The folder is the common parent: the task package's, or the sealed module's."""
    digest = hashlib.sha256()
    root = Path(os.path.commonpath([p.parent for p in files]))
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _sealed_loader(rows: list[dict[str, Any]]) -> Any:
    from inspect_ai.dataset import MemoryDataset, Sample  # noqa: PLC0415

    def loader(*args: Any, sample_fields: Any = None, **_kwargs: Any) -> Any:
        if sample_fields is None and len(args) > 1:
            sample_fields = args[1]  # json_dataset(path, record_to_sample)
        samples = []
        for row in rows:
            record = row.get("record") or {"input": row["prompt"], "target": row["answer"]}
            sample = (
                sample_fields(record) if callable(sample_fields) else Sample(input=row["prompt"], target=row["answer"])
            )
            sample.id = row["id"]
            samples.append(sample)
        return MemoryDataset(samples=samples, name="sealed")

    return loader


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from inspect_ai import eval as inspect_eval  # noqa: PLC0415
    from inspect_ai.model import GenerateConfig, get_model  # noqa: PLC0415

    task_fn, module, files = _task_function(spec)
    got = _source_sha256(files)
    if got != spec["task_source_sha256"]:
        return {
            "refused": f"inspect task source changed (sha256 {got[:12]}…, "
            f"registered {spec['task_source_sha256'][:12]}…)"
        }
    versions = _versions()
    if versions != spec["versions"]:
        return {"refused": f"inspect packages differ from the registered ones: {versions} != {spec['versions']}"}
    rows = [json.loads(line) for line in Path(spec["samples"]).read_text(encoding="utf-8").splitlines() if line.strip()]
    loader = _sealed_loader(rows)
    for attr in ("hf_dataset", "json_dataset", "csv_dataset"):
        if hasattr(module, attr):
            setattr(module, attr, loader)
    task = task_fn(**spec.get("task_args", {}))
    if spec.get("task") == "file" and getattr(task, "dataset", None) is None:
        raise SystemExit("the task module built no dataset")
    if not any(s.id in {r["id"] for r in rows} for s in task.dataset):
        # The task built its dataset some other way (e.g. a git download): not the sealed rows.
        raise SystemExit("the task's dataset is not the sealed rows; its loader could not be replaced")
    # No Inspect sandbox: model-written code is executed by rsiweb's own sandboxed scorer.
    task.sandbox = None
    decoding = spec["decoding"]
    config = GenerateConfig(
        temperature=decoding["temperature"],
        top_p=decoding["top_p"],
        max_tokens=decoding["max_tokens"],
        stop_seqs=decoding["stop"] or None,
        seed=int(decoding.get("seed", 0)),
        max_connections=1,
        max_retries=0,
        timeout=int(spec.get("timeout", 600)),
    )
    model = get_model(f"openai-api/rsiweb/{spec['model']}", base_url=spec["base_url"], api_key="local", config=config)
    logs = inspect_eval(
        task,
        model=model,
        log_dir=spec["log_dir"],
        display="none",
        score=bool(spec.get("score", True)),
        fail_on_error=False,
        max_samples=1,
        log_format="json",
    )
    log = logs[0]
    records = []
    for sample in log.samples or []:
        value = None
        if sample.scores:
            first = next(iter(sample.scores.values()))
            value = first.value if isinstance(first.value, int | float | str) else str(first.value)
        records.append(
            {
                "id": str(sample.id),
                "output": sample.output.completion if sample.output else "",
                "inspect_score": value,
                "error": str(sample.error.message) if sample.error else None,
            }
        )
    return {"status": log.status, "records": records, "task_source_sha256": got, "versions": versions}


def main() -> int:
    command, spec_path, out_path = sys.argv[1:4]
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    if command == "describe":
        _, _, files = _task_function(spec)
        result: dict[str, Any] = {"task_source_sha256": _source_sha256(files), "versions": _versions()}
    elif command == "run":
        result = run(spec)
    else:
        raise SystemExit(f"unknown command {command!r}")
    Path(out_path).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
