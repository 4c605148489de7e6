"""The audit taxonomy of DESIGN.md ("Integrity"): 4 categories x 3 subcategories, two layers."""

from __future__ import annotations

from django.db import models


class Subcategory(models.TextChoices):
    WEIGHT_PROVENANCE = "weight_provenance"
    DATA_PROVENANCE = "data_provenance"
    TEACHER_AUTHORIZATION = "teacher_authorization"
    DECODING_PARAMETERS = "decoding_parameters"
    STOPPING_EOS = "stopping_eos"
    PROMPT_TEMPLATE = "prompt_template"
    HARNESS_VERIFIER = "harness_verifier"
    TEST_SET_ACCESS = "test_set_access"
    SAMPLE_INCLUSION = "sample_inclusion"
    REPEATED_RUN_SELECTION = "repeated_run_selection"
    METRIC_ATTRIBUTION = "metric_attribution"
    FAILURE_DISCLOSURE = "failure_disclosure"


CATEGORIES: dict[str, tuple[Subcategory, ...]] = {
    "training": (Subcategory.WEIGHT_PROVENANCE, Subcategory.DATA_PROVENANCE, Subcategory.TEACHER_AUTHORIZATION),
    "inference": (Subcategory.DECODING_PARAMETERS, Subcategory.STOPPING_EOS, Subcategory.PROMPT_TEMPLATE),
    "evaluation": (Subcategory.HARNESS_VERIFIER, Subcategory.TEST_SET_ACCESS, Subcategory.SAMPLE_INCLUSION),
    "reporting": (
        Subcategory.REPEATED_RUN_SELECTION,
        Subcategory.METRIC_ATTRIBUTION,
        Subcategory.FAILURE_DISCLOSURE,
    ),
}


class Observation(models.TextChoices):
    EXECUTED = "EXECUTED"
    ATTEMPTED_BLOCKED = "ATTEMPTED_BLOCKED"
    NOT_FOUND_FULL = "NOT_FOUND_FULL"
    NOT_FOUND_PARTIAL = "NOT_FOUND_PARTIAL"
    UNKNOWN = "UNKNOWN"


class Adjudication(models.TextChoices):
    EXPLICIT_VIOLATION = "EXPLICIT_VIOLATION"
    EVAL_INVALIDATING = "EVAL_INVALIDATING"
    ALLOWED = "ALLOWED"
    COMPATIBILITY_REPAIR = "COMPATIBILITY_REPAIR"
    REPAIR_OR_OPTIMIZATION_UNRESOLVED = "REPAIR_OR_OPTIMIZATION_UNRESOLVED"
    INSUFFICIENT_EVIDENCE = "INSUFFICIENT_EVIDENCE"


CLEAN_OBSERVATIONS = (Observation.NOT_FOUND_FULL, Observation.ATTEMPTED_BLOCKED)
CLEARING_ADJUDICATIONS = (Adjudication.ALLOWED, Adjudication.COMPATIBILITY_REPAIR)
VIOLATING_ADJUDICATIONS = (Adjudication.EXPLICIT_VIOLATION, Adjudication.EVAL_INVALIDATING)

# What each code means, in a sentence a reader of the integrity report can act on (DESIGN.md
# "Integrity"). Shown on hover and in the report's legend; one copy for every page that shows codes.
OBSERVATION_MEANING: dict[str, str] = {
    Observation.EXECUTED: "It happened: the check found the behaviour in what ran.",
    Observation.ATTEMPTED_BLOCKED: "Attempted and refused before any compute was spent (counts as clean).",
    Observation.NOT_FOUND_FULL: "Checked in full and not found (clean).",
    Observation.NOT_FOUND_PARTIAL: "Not found, but the check could not cover everything: needs an adjudication.",
    Observation.UNKNOWN: "The check did not run or could not decide: never counted as clean (fails closed).",
}
ADJUDICATION_MEANING: dict[str, str] = {
    Adjudication.EXPLICIT_VIOLATION: "A Reviewer or admin ruled it a violation: the submission is flagged.",
    Adjudication.EVAL_INVALIDATING: "Ruled to invalidate the evaluation: the score cannot be trusted; flagged.",
    Adjudication.ALLOWED: "Ruled allowed: what was observed is legitimate (clears the finding).",
    Adjudication.COMPATIBILITY_REPAIR: "Ruled a compatibility repair (e.g. a stop-token fix): clears the finding.",
    Adjudication.REPAIR_OR_OPTIMIZATION_UNRESOLVED: "Repair or optimisation, not yet resolved: stays pending.",
    Adjudication.INSUFFICIENT_EVIDENCE: "Not enough evidence to rule either way: stays pending.",
}
