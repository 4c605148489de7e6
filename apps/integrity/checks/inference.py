"""Inference checks: decoding parameters, stopping / EOS and the prompt template of the evaluated
checkpoint, compared by meaning with θ0 and the benchmark's sealed settings."""

from __future__ import annotations

from typing import Any

from apps.experiments.choices import EvaluationStatus
from apps.experiments.models import Checkpoint
from apps.integrity.checks.subject import (
    _GENERATION_STOPPING,
    _STOPPING_SPECIALS,
    CheckCannotRun,
    CheckResult,
    Subject,
    _clean,
    _differences,
    inference_profile,
)
from apps.integrity.choices import Observation


def _eval_settings_problems(subject: Subject) -> list[dict[str, Any]]:
    """Evaluations that did not record the benchmark's sealed settings, and requests for other settings."""
    problems = []
    for evaluation in subject.evaluations:
        if (
            evaluation.status == EvaluationStatus.OK
            and evaluation.settings_sha256 != evaluation.benchmark.settings_sha256
        ):
            problems.append(
                {
                    "code": "eval_settings_mismatch",
                    "evaluation": str(evaluation.uuid),
                    "detail": "the evaluation ran with settings other than the benchmark's sealed ones",
                }
            )
    return problems


def _requested_eval_settings(subject: Subject) -> list[str]:
    requested = (subject.experiment.action or {}).get("eval") or {}
    return sorted(k for k in requested if k != "split") if isinstance(requested, dict) else ["eval"]


def _profiles(subject: Subject) -> tuple[dict[str, Any], dict[str, Any], Checkpoint] | None:
    checkpoint = subject.evaluated_checkpoint
    if checkpoint is None:
        return None
    base = inference_profile(subject.files_of(subject.theta0))
    if checkpoint.pk == subject.theta0.pk:
        return base, base, checkpoint
    if not subject.files_of(checkpoint)._exists():
        raise CheckCannotRun(f"{checkpoint.handle}: the checkpoint folder is missing")
    return base, inference_profile(subject.files_of(checkpoint)), checkpoint


def _inference_result(
    subject: Subject,
    what: str,
    differences: dict[str, Any],
    extra_codes: list[str] | None = None,
    extra_evidence: dict[str, Any] | None = None,
) -> CheckResult:
    problems = _eval_settings_problems(subject)
    requested = _requested_eval_settings(subject)
    codes = [p["code"] for p in problems] + (extra_codes or [])
    if differences:
        codes.append(f"{what}_changed")
    evidence = {"differences": differences, "evaluations": problems, "requested": requested, **(extra_evidence or {})}
    checkpoint = subject.evaluated_checkpoint
    if codes:
        parts = [f"{len(problems)} evaluation(s) off the sealed settings"] if problems else []
        if differences:
            parts.append(
                f"{checkpoint.handle if checkpoint else 'checkpoint'} differs from θ0 in {what}: "
                + ", ".join(sorted(differences))
            )
        return CheckResult(Observation.EXECUTED, codes, "; ".join(parts) or what, evidence)
    if requested:
        return CheckResult(
            Observation.ATTEMPTED_BLOCKED,
            ["eval_settings_requested"],
            f"asked for {', '.join(requested)}; the sealed settings were used",
            evidence,
        )
    return _clean(
        f"evaluations used the sealed settings; {what} of the evaluated checkpoint means the same as θ0's", **evidence
    )


def check_decoding_parameters(subject: Subject) -> CheckResult:
    """Sealed decoding settings were used, and the checkpoint's generation config decodes as θ0's does."""
    profiles = _profiles(subject)
    differences: dict[str, Any] = {}
    if profiles is not None:
        base, other, _ = profiles
        for key in _differences(base["generation"], other["generation"]):
            if key not in _GENERATION_STOPPING:
                differences[f"generation_config.{key}"] = {
                    "theta0": base["generation"].get(key),
                    "checkpoint": other["generation"].get(key),
                }
    return _inference_result(subject, "decoding", differences)


def check_stopping_eos(subject: Subject) -> CheckResult:
    """Sealed stop strings were used, and the checkpoint's EOS (generation config and special tokens)
    is θ0's — or an explicit repair that makes generation stop at the tokenizer's own EOS."""
    profiles = _profiles(subject)
    differences: dict[str, Any] = {}
    codes: list[str] = []
    extra: dict[str, Any] = {}
    if profiles is not None:
        base, other, _ = profiles
        for key in _differences(base["generation"], other["generation"]):
            if key in _GENERATION_STOPPING:
                differences[f"generation_config.{key}"] = {
                    "theta0": base["generation"].get(key),
                    "checkpoint": other["generation"].get(key),
                }
        for key in _differences(base["specials"], other["specials"]):
            if key in _STOPPING_SPECIALS:
                differences[f"special_tokens.{key}"] = {
                    "theta0": base["specials"].get(key),
                    "checkpoint": other["specials"].get(key),
                }
        if differences and _is_eos_repair(base, other, differences):
            codes.append("eos_repair")
            extra["suggested_adjudication"] = "COMPATIBILITY_REPAIR"
    return _inference_result(subject, "stopping", differences, codes, extra)


def _eos_id(profile: dict[str, Any]) -> int | None:
    """The id of the tokenizer's declared EOS token, from its added tokens or vocabulary."""
    eos = profile["specials"].get("eos_token")
    for token_id, content, _ in profile["tokenizer"].get("added_tokens") or []:
        if content == eos:
            return int(token_id)
    vocab = (profile["tokenizer"].get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and eos in vocab:
        return int(vocab[eos])
    return None


def _is_eos_repair(base: dict[str, Any], other: dict[str, Any], differences: dict[str, Any]) -> bool:
    """Only generation_config.eos_token_id changed, θ0's did not name the tokenizer's EOS, and the new
    one does: generation now stops where the tokenizer says a text ends (a compatibility repair)."""
    if set(differences) != {"generation_config.eos_token_id"} or base["tokenizer"] != other["tokenizer"]:
        return False
    eos = _eos_id(base)
    if eos is None:
        return False

    def names_eos(value: Any) -> bool:
        return value == eos or (isinstance(value, list) and eos in value)

    return names_eos(other["generation"].get("eos_token_id")) and not names_eos(base["generation"].get("eos_token_id"))


def check_prompt_template(subject: Subject) -> CheckResult:
    """The sealed prompt template was used, and the checkpoint renders and encodes prompts as θ0 does:
    same chat template, vocabulary, added tokens, BOS handling and tokenisation pipeline."""
    profiles = _profiles(subject)
    differences: dict[str, Any] = {}
    if profiles is not None:
        base, other, _ = profiles
        if (base["chat_template"] or "") != (other["chat_template"] or ""):
            differences["chat_template"] = {"theta0": base["chat_template"], "checkpoint": other["chat_template"]}
        for key in _differences(base["tokenizer"], other["tokenizer"]):
            # The vocabulary itself can be large: say that it differs, and how much.
            if key == "model":
                differences["tokenizer.model"] = _vocab_difference(
                    base["tokenizer"]["model"], other["tokenizer"]["model"]
                )
            else:
                differences[f"tokenizer.{key}"] = {
                    "theta0": base["tokenizer"].get(key),
                    "checkpoint": other["tokenizer"].get(key),
                }
        for key in _differences(base["specials"], other["specials"]):
            if key not in _STOPPING_SPECIALS:
                differences[f"special_tokens.{key}"] = {
                    "theta0": base["specials"].get(key),
                    "checkpoint": other["specials"].get(key),
                }
    return _inference_result(subject, "prompt template", differences)


def _vocab_difference(base: Any, other: Any) -> dict[str, Any]:
    base_vocab = (base or {}).get("vocab") if isinstance(base, dict) else None
    other_vocab = (other or {}).get("vocab") if isinstance(other, dict) else None
    if isinstance(base_vocab, dict) and isinstance(other_vocab, dict):
        changed = sorted(k for k in set(base_vocab) | set(other_vocab) if base_vocab.get(k) != other_vocab.get(k))
        return {"tokens_changed": len(changed), "examples": changed[:20]}
    return {"theta0_type": type(base).__name__, "checkpoint_type": type(other).__name__}
