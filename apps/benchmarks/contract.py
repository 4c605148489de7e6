"""What a registered benchmark promises, explicitly: the record its evaluations are verified against.

A benchmark's **contract** is built at registration and stored (with its sha256) on the row:

- ``adapter``: ``builtin`` (HF generate in the evaluation worker, a built-in evaluator) or
  ``inspect`` (an inspect_evals task or a task module, run out of process; adapters.py);
- ``code_sha256``: each sealed code file (evaluator, sandbox, an Inspect task module) by name;
- ``packages``: the harness's pinned requirements and their sha256 (Inspect only);
- ``prompt``: the prompt template, whether the chat template is applied and which;
- ``decoding``: temperature, top_p, max_tokens, stop and the seed policy, all explicit (an
  unset temperature must never fall back to a checkpoint's generation_config.json);
- ``samples``: the id field and the count per split (the ids themselves are on the row);
- ``metric``: how per-sample results become the score (evaluators.CONTRACTS);
- ``extraction``: what of the model's output the evaluator scores, and how (for ``code_tests``:
  the fenced block Inspect's humaneval would take, and the verifier that no exit status fools);
- ``context``: the one rule at the model's context limit, applied before either engine sees a
  prompt (apps.ml.context: cap-max-tokens).

No Django imports.
"""

from __future__ import annotations

from typing import Any

from apps.ml import evaluators
from apps.ml.context import CONTEXT_CONTRACT

SEED_POLICIES = ("greedy-single-seed", "per-sample-seeds")
DECODING_KEYS = ("temperature", "top_p", "max_tokens", "stop", "seed_policy")


class ContractError(ValueError):
    """A task's settings do not state what the contract needs; the message says what to add."""


def decoding_contract(task: dict[str, Any], *, strict: bool) -> dict[str, Any]:
    """The explicit decoding of a task.

    ``strict`` (``benchmark_add``): every key of ``DECODING_KEYS`` must be in ``task["decoding"]``.
    Otherwise (the minibench's older task.json: ``max_new_tokens``, ``do_sample: false`` and a
    top-level ``stop``) the greedy values are written out: temperature 0, top_p 1, one seed.
    """
    decoding = dict(task.get("decoding") or {})
    if strict:
        missing = [k for k in DECODING_KEYS if k not in decoding]
        if missing:
            raise ContractError(
                f"decoding must state {', '.join(missing)} explicitly "
                '(e.g. {"temperature": 0, "top_p": 1, "max_tokens": 512, "stop": [], '
                '"seed_policy": "greedy-single-seed"})'
            )
        explicit = {k: decoding[k] for k in DECODING_KEYS}
    else:
        if decoding.get("do_sample"):
            raise ContractError("sealed evaluation decodes greedily; task has do_sample=true")
        explicit = {
            "temperature": float(decoding.get("temperature", 0.0)),
            "top_p": float(decoding.get("top_p", 1.0)),
            "max_tokens": int(
                decoding["max_tokens"] if "max_tokens" in decoding else decoding.get("max_new_tokens", 32)
            ),
            "stop": list(decoding.get("stop", task.get("stop", []))),
            "seed_policy": str(decoding.get("seed_policy", "greedy-single-seed")),
        }
    if not isinstance(explicit["temperature"], int | float) or explicit["temperature"] < 0:
        raise ContractError("decoding.temperature must be a number >= 0")
    if not isinstance(explicit["top_p"], int | float) or not 0 < explicit["top_p"] <= 1:
        raise ContractError("decoding.top_p must be in (0, 1]")
    if not isinstance(explicit["max_tokens"], int) or explicit["max_tokens"] < 1:
        raise ContractError("decoding.max_tokens must be a positive integer")
    if not isinstance(explicit["stop"], list) or not all(isinstance(s, str) for s in explicit["stop"]):
        raise ContractError("decoding.stop must be a list of strings")
    if explicit["seed_policy"] not in SEED_POLICIES:
        raise ContractError(f"decoding.seed_policy must be one of {list(SEED_POLICIES)}")
    if explicit["temperature"] == 0 and explicit["seed_policy"] != "greedy-single-seed":
        raise ContractError("temperature 0 is greedy: seed_policy must be greedy-single-seed")
    return {**explicit, "temperature": float(explicit["temperature"]), "top_p": float(explicit["top_p"])}


def build_contract(
    task: dict[str, Any],
    *,
    code_sha256: dict[str, str],
    sample_counts: dict[str, int],
    packages: dict[str, Any] | None,
    strict: bool,
) -> dict[str, Any]:
    """The contract of a task (module docstring); raises ContractError naming what is missing."""
    evaluator = task.get("evaluator")
    if evaluator not in evaluators.CONTRACTS:
        raise ContractError(f"evaluator {evaluator!r} is not one of {sorted(evaluators.CONTRACTS)}")
    adapter = "inspect" if task.get("inspect_task") else "builtin"
    contract: dict[str, Any] = {
        "adapter": adapter,
        "code_sha256": dict(sorted(code_sha256.items())),
        "packages": packages,
        "prompt": {
            "template": task.get("prompt_template"),
            "use_chat_template": bool(task.get("use_chat_template", False)),
            "chat_template": task.get("chat_template"),  # None: the checkpoint tokenizer's own
        },
        "decoding": decoding_contract(task, strict=strict),
        "samples": {"id_field": "id", "counts": dict(sorted(sample_counts.items()))},
        "metric": evaluators.CONTRACTS[evaluator].metric,
        "evaluator": evaluator,
        "extraction": evaluators.CONTRACTS[evaluator].extraction,
        "context": dict(CONTEXT_CONTRACT),
    }
    if task.get("small_split"):  # a split under the default size, allowed by the operator (apps.benchmarks.adding)
        contract["samples"]["small_split"] = str(task["small_split"])
    if adapter == "inspect":
        contract["inspect"] = {
            "task": task["inspect_task"],
            "task_args": task.get("inspect_task_args") or {},
            "task_function": str(task.get("inspect_task_function", "task")),
        }
        if not packages or not packages.get("task_source_sha256"):
            raise ContractError("an Inspect task needs its packages and task source hash recorded")
    return contract
