"""Evaluator adapters: every way a sealed benchmark is run ends in the evaluators.py contract.

An adapter turns (checkpoint, sealed samples, contract) into one ``{"id", "output", "correct"}``
record per sample, ``correct`` decided by the benchmark's sealed evaluator:

- ``builtin``: the evaluation worker renders the task's prompt template and decodes with
  apps/ml/inference.py (batched HF generate; the engine is pluggable there);
- ``inspect``: an inspect_evals task (``inspect_evals/gsm8k``) or a sealed task module runs out
  of process in its own environment (``./dev inspect-env``: inspect-ai pins an fsspec the project
  cannot install), with its datasets replaced by the sealed rows; the model is the checkpoint
  under evaluation, served to it by apps/benchmarks/endpoint.py on loopback. Inspect's own
  scorer value is kept beside ours as ``inspect_score`` (for a code task it is off: Inspect would
  execute the code without our sandbox).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from apps.benchmarks.endpoint import Generate, serve
from apps.core.errors import ApplicationError
from apps.ml import evaluators
from apps.ml.engines import envs_root

HARNESS = Path(__file__).resolve().parent / "harness"
INSPECT_REQUIREMENTS = HARNESS / "inspect-requirements.txt"
INSPECT_RUNNER = HARNESS / "inspect_runner.py"
INSPECT_TIMEOUT_SECONDS = 1_800


class HarnessRefused(ApplicationError):
    """The harness refused to run: its task source or packages differ from the registered ones."""

    status_code = 409

    def __init__(self, reason: str) -> None:
        super().__init__("harness_refused", f"Inspect harness refused: {reason}", reason=reason)
        self.reason = reason


def _requirements_sha256() -> str:
    return hashlib.sha256(INSPECT_REQUIREMENTS.read_bytes()).hexdigest()


def inspect_env_dir() -> Path:
    """<envs root>/inspect-<first 16 hex of the requirements' sha256>: a new pin set, a new env."""
    return envs_root() / f"inspect-{_requirements_sha256()[:16]}"


def inspect_python() -> Path:
    python = inspect_env_dir() / "bin" / "python"
    if not (inspect_env_dir() / ".rsiweb-ready").exists():
        raise ApplicationError(
            "harness_missing",
            f"the Inspect environment {inspect_env_dir()} is not built; run `./dev inspect-env` on this host",
            status=503,
        )
    return python


def _pinned(name: str) -> str:
    for line in INSPECT_REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        pinned, _, version = line.partition("==")
        if pinned.strip().lower().replace("_", "-") == name:
            return version.strip()
    raise ApplicationError("harness_missing", f"{INSPECT_REQUIREMENTS.name} does not pin {name}")


def _runner(command: str, spec: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rsiweb-inspect-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        # A clean environment: the Inspect process needs none of the worker's secrets.
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(  # noqa: S603 - fixed argv into our own runner
            [str(inspect_python()), str(INSPECT_RUNNER), command, str(spec_path), str(out_path)],
            capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not out_path.exists():
            tail = (done.stderr or done.stdout)[-1500:]
            raise ApplicationError("harness_failed", f"the Inspect runner exited {done.returncode}: {tail}", status=502)
        result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
        return result


def _task_spec(task: dict[str, Any], task_file: Path | None) -> dict[str, Any]:
    spec = {"task": task["inspect_task"], "task_args": task.get("inspect_task_args") or {}}
    if task["inspect_task"] == "file":
        if task_file is None:
            raise ApplicationError("invalid_task", 'inspect_task "file" needs its task module')
        spec |= {"task_file": str(task_file), "task_function": str(task.get("inspect_task_function", "task"))}
    return spec


def _runner_module() -> Any:
    """The runner's own module, loaded here for its hashing function only (it imports only stdlib at the top)."""
    spec = importlib.util.spec_from_file_location("rsiweb_inspect_runner", INSPECT_RUNNER)
    if spec is None or spec.loader is None:
        raise ApplicationError("harness_missing", f"cannot load {INSPECT_RUNNER}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inspect_task_files(task: dict[str, Any], task_file: Path | None) -> list[Path]:
    """The source files of an Inspect task as installed in the env (or the task module), sorted."""
    name = str(task["inspect_task"])
    if name == "file":
        if task_file is None:
            raise ApplicationError("invalid_task", 'inspect_task "file" needs its task module')
        return [task_file]
    package, _, function = name.partition("/")
    folders = sorted((inspect_env_dir() / "lib").glob(f"python3*/site-packages/inspect_evals/{function}"))
    if package != "inspect_evals" or not function.isidentifier() or not folders:
        raise ApplicationError("invalid_task", f"no inspect_evals task {name!r} in {inspect_env_dir()}")
    return sorted(folders[0].rglob("*.py"))


def inspect_packages(task: dict[str, Any], task_file: Path | None) -> dict[str, Any]:
    """What registration records of an Inspect task: pins, versions, the task source's sha256.

    Hashed from the files on disk with the runner's own function (no Inspect process start);
    the runner re-hashes what it imports before every run and refuses on a difference.
    """
    inspect_python()  # the env must exist: the hashed files are the ones that will run
    files = inspect_task_files(task, task_file)
    return {
        "requirements_sha256": _requirements_sha256(),
        "versions": {"inspect-ai": _pinned("inspect-ai"), "inspect-evals": _pinned("inspect-evals")},
        "task_source_sha256": _runner_module()._source_sha256(files),
    }


def hf_generate(
    checkpoint_dir: Path, decoding: dict[str, Any], model_profile: dict[str, Any] | None = None
) -> tuple[Generate, Any]:
    """The built-in engine (apps/ml/inference.py's HF generate) as endpoint callbacks.

    Greedy unless ``decoding`` samples (apps.ml.seeds.is_sampled); then each request is sampled
    under the seed the endpoint gives it, with the contract's temperature and top_p and no top-k.
    ``model_profile`` is the registered model's: its EOS ids end generations (stop_token_ids).
    """
    from apps.ml.checkpoints import load_checkpoint  # noqa: PLC0415 - torch: only in the worker
    from apps.ml.inference import (  # noqa: PLC0415
        generate_texts,
        sample_texts,
        sampling_settings,
        stop_token_ids,
    )

    model, tokenizer = load_checkpoint(checkpoint_dir)
    sampling = sampling_settings(decoding)
    eos = stop_token_ids(tokenizer, model_profile)
    allowed = context_limiter(checkpoint_dir, tokenizer)

    def generate(prompt: str, max_tokens: int, stop: Sequence[str], seed: int | None) -> str:
        max_tokens = allowed(prompt, max_tokens)
        if max_tokens < 1:
            return ""  # over the context: not generated (apps.ml.context)
        if sampling is None or seed is None:
            return generate_texts(
                model, tokenizer, [prompt], max_new_tokens=max_tokens, stop=stop, batch_size=1, eos_ids=eos
            )[0]
        return sample_texts(
            model, tokenizer, [prompt], seeds=[seed], sampling=sampling, max_new_tokens=max_tokens, stop=stop,
            eos_ids=eos,
        )[0]  # fmt: skip

    return generate, _chat_template_of(tokenizer)


def context_limiter(checkpoint_dir: Path, tokenizer: Any = None) -> Callable[[str, int], int]:
    """The context rule (apps.ml.context) for one endpoint request: (prompt, max tokens) -> the max
    tokens it may generate, 0 when the prompt leaves no room. Both engines tokenize the endpoint's
    prompt text with the tokenizer's specials added (their default here), and so does the count."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers: only in the worker

    from apps.ml.context import fit, model_context  # noqa: PLC0415
    from apps.ml.inference import prompt_counter  # noqa: PLC0415

    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir, local_files_only=True)
    count = prompt_counter(tokenizer, add_special_tokens=True)
    context = model_context(checkpoint_dir)

    def allowed(prompt: str, max_tokens: int) -> int:
        return fit(count(prompt), max_tokens, context).max_tokens

    return allowed


def _chat_template_of(tokenizer: Any) -> Callable[[list[dict[str, str]]], str]:
    def chat_template(messages: list[dict[str, str]]) -> str:
        if not tokenizer.chat_template:
            raise ValueError("the contract applies the chat template but the checkpoint's tokenizer has none")
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))

    return chat_template


def registered_stop_ids(checkpoint_dir: Path, model_profile: dict[str, Any] | None) -> list[int]:
    """apps.ml.inference.stop_token_ids with the checkpoint's tokenizer alone (vLLM has the weights)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers: only in the worker

    from apps.ml.inference import stop_token_ids  # noqa: PLC0415

    return stop_token_ids(AutoTokenizer.from_pretrained(checkpoint_dir, local_files_only=True), model_profile)


def chat_renderer(checkpoint_dir: Path) -> Callable[[list[dict[str, str]]], str]:
    """The checkpoint tokenizer's chat template as the endpoint's renderer (no weights loaded: vLLM has them)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers: only in the worker

    return _chat_template_of(AutoTokenizer.from_pretrained(checkpoint_dir, local_files_only=True))


def vllm_generate(
    url: str, served_dir: Path, decoding: dict[str, Any], stop_token_ids: Sequence[int] = (),
    allowed: Callable[[str, int], int] | None = None,
) -> Generate:  # fmt: skip
    """A vLLM server (a managed ``VLLMServer``'s URL and the folder it serves) as the endpoint's engine.

    Every request states its decoding (greedy, or the contract's temperature and top_p under the
    endpoint's seed): nothing falls back to the checkpoint's generation_config.json.
    ``stop_token_ids`` end completions besides the tokenizer's EOS (the registered model's).
    ``allowed`` is the context rule (:func:`context_limiter`), applied before the server sees the prompt.
    """
    from apps.ml.inference import sampling_settings, truncate_at_stop  # noqa: PLC0415
    from apps.ml.vllm_client import complete  # noqa: PLC0415

    sampling = sampling_settings(decoding)

    def generate(prompt: str, max_tokens: int, stop: Sequence[str], seed: int | None) -> str:
        if allowed is not None:
            max_tokens = allowed(prompt, max_tokens)
            if max_tokens < 1:
                return ""  # over the context: not generated (apps.ml.context)
        text = complete(
            url, model=str(served_dir), prompts=[prompt], max_tokens=max_tokens, stop=stop, batch_size=1,
            sampling=sampling if seed is not None else None, seeds=None if seed is None else [seed],
            stop_token_ids=stop_token_ids,
        )[0]  # fmt: skip
        return truncate_at_stop(text, stop)

    return generate


def inspect_evaluate(
    *,
    contract: dict[str, Any],
    sealed_path: Path,
    samples: list[dict[str, Any]],
    model_id: str,
    generate: Generate,
    chat_template: Callable[[list[dict[str, str]]], str] | None,
    scorer: Callable[[str, str], bool],
    log_dir: Path,
    run_seed: int = 0,
    epoch: int = 0,
) -> list[dict[str, Any]]:
    """Run the contract's Inspect task on ``samples`` (already hash-verified) and score each output.

    Under sampled decoding every request is generated under its sample's own seed for
    ``run_seed`` (apps/benchmarks/endpoint.py); each row then carries the seed of the sample's
    first request, and ``retries``, the retry-cascade steps its requests took. Raises
    HarnessRefused when the runner refuses (task source or package versions changed),
    GenerationFailed when a request failed through the whole retry cascade (the caller counts the
    seed as failed), and ApplicationError when a sealed sample has no record (the harness lost or
    invented one).
    """
    from apps.ml.inference import GENERATION_FAILURES, GenerationFailed  # noqa: PLC0415 - torch: the worker only

    inspect = contract["inspect"]
    task = {"inspect_task": inspect["task"], "inspect_task_args": inspect["task_args"]}
    task |= {"inspect_task_function": inspect.get("task_function", "task")}
    kind = evaluators.CONTRACTS[contract["evaluator"]].kind
    with tempfile.TemporaryDirectory(prefix="rsiweb-inspect-data-") as tmp:
        data = Path(tmp) / "samples.jsonl"
        data.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
        template = chat_template if contract["prompt"]["use_chat_template"] else None
        with serve(
            model=model_id, decoding=contract["decoding"], generate=generate, chat_template=template,
            samples=samples, run_seed=run_seed, epoch=epoch, failures=GENERATION_FAILURES,
        ) as served:  # fmt: skip
            spec = _task_spec(task, sealed_path / "inspect_task.py") | {
                "samples": str(data),
                "task_source_sha256": contract["packages"]["task_source_sha256"],
                "versions": contract["packages"]["versions"],
                "decoding": contract["decoding"],
                "base_url": served["base_url"],
                "model": model_id,
                "log_dir": str(log_dir),
                "score": kind != "code",
            }
            result = _runner("run", spec, timeout=INSPECT_TIMEOUT_SECONDS)
            requests = list(served["requests"])
    if "refused" in result:
        raise HarnessRefused(result["refused"])
    failed = [r for r in requests if "failed" in r]
    if failed:
        raise GenerationFailed(f"sample {failed[0]['sample']}: every retry failed: {failed[0]['failed']}")
    first: dict[str, dict[str, Any]] = {}
    retries: Counter[str] = Counter()
    for request in requests:
        if "sample" in request:
            first.setdefault(request["sample"], request)
            retries[request["sample"]] += request["retries"]
    by_id = {r["id"]: r for r in result["records"]}
    missing = [s["id"] for s in samples if s["id"] not in by_id]
    if missing or len(by_id) != len(samples):
        raise ApplicationError("harness_failed", f"Inspect returned no record for {missing[:5]} (of {len(samples)})")
    rows = []
    for sample in samples:
        record = by_id[sample["id"]]
        if record.get("error"):
            raise ApplicationError("harness_failed", f"sample {sample['id']} failed in Inspect: {record['error']}")
        output = str(record["output"])
        row = {"id": sample["id"], "output": output, "correct": bool(scorer(output, str(sample["answer"]))),
               "inspect_score": record.get("inspect_score"), "retries": retries[str(sample["id"])]}  # fmt: skip
        seed = first.get(str(sample["id"]), {}).get("seed")
        if seed is not None:
            row["seed"] = seed
        rows.append(row)
    return rows


def inspect_evaluate_seeds(*, seeds: Sequence[int], log_dir: Path, **kwargs: Any) -> list[dict[str, Any]]:
    """``inspect_evaluate`` under each run seed: ``{"seed", "status": "ok" | "failed", "rows" | "error"}``.

    As apps.ml.inference.evaluate_seeds for the built-in adapter: a seed whose generation failed
    through the whole retry cascade is recorded as failed and left out of the mean, never dropped.
    """
    from apps.ml.inference import GenerationFailed  # noqa: PLC0415 - torch: the worker only

    results: list[dict[str, Any]] = []
    for seed in seeds:
        try:
            rows = inspect_evaluate(run_seed=int(seed), log_dir=log_dir / f"seed-{int(seed)}", **kwargs)
        except GenerationFailed as exc:
            results.append({"seed": int(seed), "status": "failed", "error": str(exc)[:1000]})
        else:
            results.append({"seed": int(seed), "status": "ok", "rows": rows})
    return results
