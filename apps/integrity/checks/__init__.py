"""The post-submission checks: one function per subcategory of the audit taxonomy (DESIGN.md "Integrity").

Each check reads the records of one experiment (and the files they point at) and returns a
:class:`CheckResult`: an observation, machine-readable ``codes`` for what it found, and evidence a
Reviewer can open. Checks never write; :mod:`apps.integrity.services` stores the results, applies
automatic adjudication by code and the acceptance rule.

Checks compare *meaning*, not bytes: a tokenizer re-saved with the same vocabulary, special tokens
and chat template is unchanged; a generation config that differs only in ``transformers_version``
is unchanged. They fail closed: a check that cannot reach what it must read raises
:class:`CheckCannotRun`, and any exception leaves the subcategory ``UNKNOWN`` (see :func:`run_check`).

One module per section of the taxonomy, mirrored by tests/apps/integrity/test_<section>_checks.py:
``subject`` (what the checks read and return), ``training``, ``inference``, ``evaluation`` and
``reporting``; this module holds the registry.

``CHECKS`` is the registry the services iterate; it is looked up at call time, so a test can switch
one check off and watch the red team's rows turn red.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from apps.integrity.checks.evaluation import check_harness_verifier, check_sample_inclusion, check_test_set_access
from apps.integrity.checks.inference import check_decoding_parameters, check_prompt_template, check_stopping_eos
from apps.integrity.checks.reporting import (
    check_failure_disclosure,
    check_metric_attribution,
    check_repeated_run_selection,
    check_reports,
)
from apps.integrity.checks.subject import (
    CheckCannotRun,
    CheckResult,
    Statement,
    Subject,
    evaluations_by_checkpoint,
    statements_for,
)
from apps.integrity.checks.training import check_data_provenance, check_teacher_authorization, check_weight_provenance
from apps.integrity.choices import Observation, Subcategory

__all__ = [
    "CHECKS",
    "REPORTING",
    "REPORT_CHECKS",
    "CheckCannotRun",
    "CheckResult",
    "Statement",
    "Subject",
    "evaluations_by_checkpoint",
    "run_check",
    "run_report_check",
    "statements_for",
]

Check = Callable[[Subject], CheckResult]

CHECKS: dict[str, Check] = {
    Subcategory.WEIGHT_PROVENANCE: check_weight_provenance,
    Subcategory.DATA_PROVENANCE: check_data_provenance,
    Subcategory.TEACHER_AUTHORIZATION: check_teacher_authorization,
    Subcategory.DECODING_PARAMETERS: check_decoding_parameters,
    Subcategory.STOPPING_EOS: check_stopping_eos,
    Subcategory.PROMPT_TEMPLATE: check_prompt_template,
    Subcategory.HARNESS_VERIFIER: check_harness_verifier,
    Subcategory.TEST_SET_ACCESS: check_test_set_access,
    Subcategory.SAMPLE_INCLUSION: check_sample_inclusion,
    Subcategory.REPEATED_RUN_SELECTION: check_repeated_run_selection,
    Subcategory.METRIC_ATTRIBUTION: check_metric_attribution,
    Subcategory.FAILURE_DISCLOSURE: check_failure_disclosure,
}
REPORTING = (Subcategory.REPEATED_RUN_SELECTION, Subcategory.METRIC_ATTRIBUTION, Subcategory.FAILURE_DISCLOSURE)
# What reports state, judged per author (a false claim is its author's finding): looked up at call
# time like ``CHECKS``.
REPORT_CHECKS: dict[str, Callable[..., CheckResult]] = {Subcategory.METRIC_ATTRIBUTION: check_reports}


def _guarded(check: Callable[[], CheckResult]) -> CheckResult:
    """Run a check; whatever stops it from finishing leaves UNKNOWN with the error (fail closed)."""
    try:
        result = check()
    except CheckCannotRun as exc:
        return CheckResult(Observation.UNKNOWN, ["cannot_run"], f"the check could not run: {exc}", {"error": str(exc)})
    except Exception as exc:  # noqa: BLE001 - any crash must leave UNKNOWN, never a clean verdict
        return CheckResult(
            Observation.UNKNOWN,
            ["check_crashed"],
            f"the check crashed: {type(exc).__name__}: {exc}"[:500],
            {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-4000:]},
        )
    if not isinstance(result, CheckResult) or result.observation not in Observation.values:
        return CheckResult(Observation.UNKNOWN, ["check_crashed"], f"the check returned {result!r}")
    return result


def run_report_check(run: Any, statements: list[Statement], *, own: list[str]) -> CheckResult:
    """Metric attribution of one author's reports (``check_reports``), failing closed like :func:`run_check`."""
    return _guarded(lambda: REPORT_CHECKS[Subcategory.METRIC_ATTRIBUTION](run, statements, own=own))


def run_check(subcategory: str, subject: Subject) -> CheckResult:
    """Run one registered check; whatever stops it from finishing leaves UNKNOWN with the error (fail closed)."""
    check = CHECKS.get(subcategory)
    if check is None:
        return CheckResult(Observation.UNKNOWN, ["check_missing"], f"no check is registered for {subcategory}")
    return _guarded(lambda: check(subject))
