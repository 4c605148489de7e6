"""State changes of the integrity layer: run the checks, adjudicate, accept or flag (DESIGN.md "Integrity").

For each (experiment, subcategory) one :class:`IntegrityFinding` keeps two layers apart: the
*observation* a check (or a person) made, and the *adjudication*. Every change of either writes a
:class:`FindingChange` row, so a finding's history is never overwritten.

- :func:`integrity_run_checks` runs the twelve registered checks (``apps.integrity.checks.CHECKS``),
  stores their observations, adjudicates the unambiguous cases automatically (:data:`AUTO_ADJUDICATION`)
  and applies the acceptance rule.
- :func:`finding_adjudicate` is how Reviewers and admins (with an audited reason) decide the rest;
  :func:`reviewer_adjudicate` is the Reviewer's way in (its ``reviewer_submit_review`` tool): within
  its review scope only, while it is active; :func:`reviewer_adjudicate_report` the same for a
  report's finding on the node of a Worker of its scope.
- :func:`experiment_integrity_recompute` is the acceptance rule: accepted when every subcategory is
  ``NOT_FOUND_FULL`` or ``ATTEMPTED_BLOCKED``, or adjudicated ``ALLOWED`` / ``COMPATIBILITY_REPAIR``;
  flagged when any is ``EXECUTED`` and adjudicated ``EXPLICIT_VIOLATION`` / ``EVAL_INVALIDATING``;
  pending otherwise. ``UNKNOWN`` is never accepted.
- :func:`integrity_flag_shared` propagates a violation found in shared data (a datapool entry) or an
  evaluator to every submission that touched it, and flags their runs.

Hooks for the rest of the system: the pipeline calls :func:`integrity_on_experiment_finished` when
an experiment ends, and Worker finalization / Main Agent claims call :func:`integrity_on_report`
(reporting subcategories are judged against what is reported, which comes later).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import Q

from apps.core.errors import ApplicationError, Conflict, PermissionDenied
from apps.core.hashing import canonical_json
from apps.core.jsonsafe import storable
from apps.core.queues import TaskName
from apps.datapool.models import DataEntry, DataUsage
from apps.experiments.choices import EXPERIMENT_TERMINAL_STATES, IntegrityStatus
from apps.experiments.events import event_append
from apps.experiments.models import Evaluation, Experiment
from apps.experiments.selectors import checkpoint_descendants
from apps.experiments.services import experiment_set_integrity
from apps.integrity import checks
from apps.integrity.choices import (
    CLEAN_OBSERVATIONS,
    CLEARING_ADJUDICATIONS,
    VIOLATING_ADJUDICATIONS,
    Adjudication,
    Observation,
    Subcategory,
)
from apps.integrity.claims import handles_in
from apps.integrity.models import BlockedAttempt, FindingChange, IntegrityFinding
from apps.integrity.selectors import best_accepted_experiment  # noqa: F401 - the run's selection rule, re-exported
from apps.live.events import LiveEvent, publish_on_commit
from apps.live.groups import run_group
from apps.research.choices import EdgeKind, NodeKind, NodeStatus
from apps.research.models import ResearchEdge, ResearchNode, Run
from apps.research.selectors import run_live_get
from rsiweb.celery import app as celery_app

logger = logging.getLogger(__name__)

CHECK_ACTOR = "integrity-check"
AUTO = "auto"

# Codes a check reports that decide the adjudication without a person: unambiguous evidence.
AUTO_ADJUDICATION: dict[str, dict[str, str]] = {
    Subcategory.WEIGHT_PROVENANCE: dict.fromkeys(
        (
            "foreign_file",
            "missing_file",
            "manifest_mismatch",
            "manifest_digest_mismatch",
            "off_lineage",
            "not_recorded_job",
            "evaluated_other_checkpoint",
        ),
        Adjudication.EXPLICIT_VIOLATION,
    ),
    Subcategory.DATA_PROVENANCE: {
        "contamination_above_tolerance": Adjudication.EXPLICIT_VIOLATION,
        "data_hash_mismatch": Adjudication.EXPLICIT_VIOLATION,
        "unrecorded_data": Adjudication.EXPLICIT_VIOLATION,
        # The run's policy tolerates this much overlap: observed, and allowed by that policy.
        "contamination_within_tolerance": Adjudication.ALLOWED,
    },
    # "teacher_agreement_undeclared" (data copies an undeclared teacher's wrong answers / decoding
    # artefacts) is deliberately absent: a statistical observation, it awaits a Reviewer's adjudication.
    Subcategory.TEACHER_AUTHORIZATION: {"teacher_unauthorized": Adjudication.EXPLICIT_VIOLATION},
    Subcategory.HARNESS_VERIFIER: dict.fromkeys(
        (
            "evaluator_hash_mismatch",
            "settings_hash_mismatch",
            "data_hash_mismatch",
            "rescore_mismatch",
            "aggregate_mismatch",
            "other_benchmark",
        ),
        Adjudication.EVAL_INVALIDATING,
    ),
    Subcategory.SAMPLE_INCLUSION: {"sample_ids_mismatch": Adjudication.EVAL_INVALIDATING},
    Subcategory.TEST_SET_ACCESS: {"final_split_evaluated": Adjudication.EXPLICIT_VIOLATION},
    Subcategory.DECODING_PARAMETERS: {"eval_settings_mismatch": Adjudication.EVAL_INVALIDATING},
    Subcategory.STOPPING_EOS: {"eval_settings_mismatch": Adjudication.EVAL_INVALIDATING},
    Subcategory.PROMPT_TEMPLATE: {"eval_settings_mismatch": Adjudication.EVAL_INVALIDATING},
    Subcategory.METRIC_ATTRIBUTION: {"phantom_citation": Adjudication.EXPLICIT_VIOLATION},
}
# An override from the Main Agent lets a judgement call through the submission review; the same
# judgement after the run is then a Reviewer's, not automatic.
OVERRIDABLE_CODES = {"contamination_above_tolerance", "teacher_unauthorized"}
# When codes of one finding decide differently, the stronger adjudication wins.
_SEVERITY = {Adjudication.EXPLICIT_VIOLATION: 3, Adjudication.EVAL_INVALIDATING: 2, Adjudication.ALLOWED: 1}


def auto_adjudication(subcategory: str, result: checks.CheckResult) -> str:
    """The adjudication the codes alone decide ("" when a Reviewer must): the strongest one wins."""
    if result.observation != Observation.EXECUTED:
        return ""
    rules = AUTO_ADJUDICATION.get(subcategory, {})
    overridden = "override_used" in result.codes
    decided = [rules[code] for code in result.codes if code in rules and not (overridden and code in OVERRIDABLE_CODES)]
    undecided = [
        c for c in result.codes if c != "override_used" and (c not in rules or (overridden and c in OVERRIDABLE_CODES))
    ]
    if not decided:
        return ""
    strongest = max(decided, key=lambda a: _SEVERITY.get(a, 0))
    if strongest == Adjudication.ALLOWED and undecided:
        # Something beside the tolerated part still needs a person.
        return ""
    return strongest


# --------------------------------------------------------------------------- storing observations


def _finding_write(
    *,
    experiment: Experiment | None,
    subcategory: str,
    observation: str,
    adjudication: str,
    evidence: dict[str, Any],
    decided_by: str,
    rationale: str,
    actor: str,
    node: ResearchNode | None = None,
) -> tuple[IntegrityFinding, bool]:
    """Create or update one finding, of an experiment or (a report's) of its author's node; a
    FindingChange row records every change. Returns (finding, changed).

    Caller holds the experiment's (or node's) row lock, so two passes over one never interleave.
    """
    target: dict[str, Any] = {"experiment": experiment} if experiment is not None else {"node": node}
    finding, created = IntegrityFinding.objects.get_or_create(
        **target,
        subcategory=subcategory,
        defaults={
            "observation": observation,
            "adjudication": adjudication,
            "evidence": evidence,
            "decided_by": decided_by,
            "rationale": rationale,
        },
    )
    if created:
        FindingChange.objects.create(
            finding=finding, observation=observation, adjudication=adjudication, actor=actor, rationale=rationale
        )
        return finding, True
    fields = []
    for name, value in (
        ("observation", observation),
        ("adjudication", adjudication),
        ("decided_by", decided_by),
        ("rationale", rationale),
    ):
        if getattr(finding, name) != value:
            setattr(finding, name, value)
            fields.append(name)
    if canonical_json(finding.evidence) != canonical_json(evidence):
        finding.evidence = evidence
        fields.append("evidence")
    if not fields:
        return finding, False
    finding.full_clean()
    finding.save(update_fields=[*fields, "updated_at"])
    # Every change is history, even a new rationale for the same adjudication by another person.
    judged = {"observation", "adjudication", "decided_by"} & set(fields)
    FindingChange.objects.create(
        finding=finding,
        observation=finding.observation,
        adjudication=finding.adjudication,
        actor=actor,
        rationale=rationale if judged or "rationale" in fields else f"evidence updated: {rationale}",
    )
    return finding, True


def _store_result(
    experiment: Experiment | None, subcategory: str, result: checks.CheckResult, *, node: ResearchNode | None = None
) -> tuple[IntegrityFinding, bool]:
    """Store a check's result, keeping what a person decided where it still applies.

    A person's observation (``evidence["manual_observation"]``) stands until a person changes it.
    A person's adjudication stands while the observation it judged is unchanged; a new observation
    needs a new judgement, so it falls back to the automatic one (the old one stays in the history).
    """
    target: dict[str, Any] = {"experiment": experiment} if experiment is not None else {"node": node}
    existing = IntegrityFinding.objects.filter(**target, subcategory=subcategory).first()
    evidence = result.as_evidence()
    observation = result.observation
    manual = (existing.evidence or {}).get("manual_observation") if existing is not None else None
    if manual:
        evidence["manual_observation"] = manual
        evidence["check_observation"] = observation
        observation = manual["observation"]
    adjudication = auto_adjudication(subcategory, result) if not manual else ""
    decided_by = AUTO if adjudication else ""
    rationale = f"{AUTO}: {result.summary}"[:4000] if adjudication else result.summary[:4000]
    if existing is not None and existing.decided_by not in ("", AUTO) and existing.observation == observation:
        adjudication, decided_by, rationale = existing.adjudication, existing.decided_by, existing.rationale
    return _finding_write(
        experiment=experiment,
        node=node,
        subcategory=subcategory,
        observation=observation,
        adjudication=adjudication,
        evidence=evidence,
        decided_by=decided_by,
        rationale=rationale,
        actor=CHECK_ACTOR,
    )


def integrity_run_checks(
    *, experiment: Experiment, subcategories: tuple[str, ...] | None = None
) -> list[IntegrityFinding]:
    """Run the registered checks on one experiment, store the observations, adjudicate and apply acceptance.

    ``subcategories`` limits the pass (the reporting hook re-runs only the reporting three). The
    checks read files and sealed data outside any transaction; their results are then written
    under the experiment's row lock. Idempotent: re-running with nothing changed writes nothing.
    """
    experiment = Experiment.objects.select_related(
        "run__benchmark", "run__base_checkpoint", "owner", "input_checkpoint", "output_checkpoint__producing_job"
    ).get(pk=experiment.pk)
    subject = checks.Subject(experiment)
    wanted = subcategories or tuple(Subcategory.values)
    results = {subcategory: checks.run_check(subcategory, subject) for subcategory in wanted}
    shared: list[IntegrityFinding] = []
    with transaction.atomic():
        locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
        for subcategory, result in results.items():
            finding, changed = _store_result(locked, subcategory, result)
            codes = finding.evidence.get("codes", [])
            edited = finding.evidence.get("edited_after_check")
            if changed and (finding.observation != Observation.NOT_FOUND_FULL or edited):
                arguments = {
                    "experiment": locked.handle,
                    "subcategory": subcategory,
                    "observation": finding.observation,
                    "adjudication": finding.adjudication,
                    "codes": codes,
                }
                if edited:
                    # Files of a checked checkpoint changed in the store since: the operator's action, on record.
                    arguments["attributed_to"] = "operator"
                    arguments["edited"] = [{k: p.get(k) for k in ("checkpoint", "code", "files")} for p in edited[:10]]
                event_append(
                    run=locked.run,
                    type="integrity.observed",
                    actor=CHECK_ACTOR,
                    role="system",
                    arguments=arguments,
                    result_ref=f"experiment:{locked.uuid}",
                )
            if finding.adjudication == Adjudication.EXPLICIT_VIOLATION and subcategory == Subcategory.DATA_PROVENANCE:
                shared.append(finding)
        experiment_integrity_recompute(experiment=locked, actor=CHECK_ACTOR)
    for finding in shared:
        for handle in finding.evidence.get("offending_entries", []):
            integrity_flag_shared(
                entry_handle=handle,
                actor=CHECK_ACTOR,
                reason=f"found in {experiment.handle}: {finding.evidence.get('summary', '')}"[:2000],
                source=finding,
            )
    return list(IntegrityFinding.objects.filter(experiment=experiment).order_by("subcategory"))


def integrity_check_reports(*, run: Run, authors: list[str] | None = None) -> list[IntegrityFinding]:
    """Judge what reports state on their authors' nodes (metric attribution): each Worker's summary
    and the Main Agent's claims against the record of every experiment they cite, whoever ran it.

    ``authors``: node handles to judge (default: every author with a report). A false claim is the
    author's finding; the cited experiments' own findings are left alone. Fails closed: a check that
    cannot finish leaves the author's finding UNKNOWN. Idempotent: nothing changed writes nothing.
    """
    statements = checks.statements_for(run)
    by_author: dict[str, list[checks.Statement]] = {}
    for statement in statements:
        by_author.setdefault(statement.author, []).append(statement)
    wanted = sorted(by_author) if authors is None else sorted(set(authors))
    nodes = {n.handle: n for n in ResearchNode.objects.filter(run=run, handle__in=wanted)}
    results: dict[str, checks.CheckResult] = {}
    for handle in wanted:
        node = nodes.get(handle)
        if node is None:
            logger.warning("report check: %s has no node in run %s", handle, run.pk)
            continue
        own = list(Experiment.objects.filter(owner=node).values_list("handle", flat=True))
        results[handle] = checks.run_report_check(run, by_author.get(handle, []), own=own)
    with transaction.atomic():
        for handle, result in results.items():
            locked = ResearchNode.objects.select_for_update().get(pk=nodes[handle].pk)
            finding, changed = _store_result(None, Subcategory.METRIC_ATTRIBUTION, result, node=locked)
            if changed and finding.observation != Observation.NOT_FOUND_FULL:
                event_append(
                    run=run,
                    type="integrity.observed",
                    actor=CHECK_ACTOR,
                    role="system",
                    arguments={
                        "node": locked.handle,
                        "subcategory": Subcategory.METRIC_ATTRIBUTION,
                        "observation": finding.observation,
                        "adjudication": finding.adjudication,
                        "codes": finding.evidence.get("codes", []),
                    },
                    result_ref=f"node:{locked.uuid}",
                )
    return list(IntegrityFinding.objects.filter(node__run=run, node__handle__in=list(results)).order_by("node__handle"))


def integrity_recheck_run_reports(*, run: Run) -> None:
    """Every report of the run judged again, now: the reporting checks of every experiment that
    ended and was checked, and every author's claims. The run's end calls it before the result is taken, so a claim
    revised or a summary written after the last check cannot slip through."""
    # Experiments whose checks have run (one not yet checked gets all twelve from its own task).
    checked = Experiment.objects.filter(run=run, status__in=EXPERIMENT_TERMINAL_STATES, findings__isnull=False)
    for experiment in checked.distinct().order_by("pk"):
        integrity_run_checks(experiment=experiment, subcategories=checks.REPORTING)
    integrity_check_reports(run=run)


# --------------------------------------------------------------------------- acceptance


def acceptance_status(findings: list[IntegrityFinding]) -> tuple[str, str]:
    """(status, reason) of the acceptance rule over one experiment's findings (DESIGN.md)."""
    by_subcategory = {f.subcategory: f for f in findings}
    violations = [
        f for f in findings if f.observation == Observation.EXECUTED and f.adjudication in VIOLATING_ADJUDICATIONS
    ]
    if violations:
        return IntegrityStatus.FLAGGED, "flagged: " + "; ".join(
            f"{f.subcategory} {f.adjudication} ({', '.join(f.evidence.get('codes', [])) or f.decided_by})"
            for f in violations
        )
    open_items = []
    for subcategory in Subcategory.values:
        finding = by_subcategory.get(subcategory)
        if finding is None:
            open_items.append(f"{subcategory} not checked")
        elif finding.observation == Observation.UNKNOWN:
            open_items.append(f"{subcategory} UNKNOWN")
        elif finding.adjudication in CLEARING_ADJUDICATIONS or (
            finding.observation in CLEAN_OBSERVATIONS and not finding.adjudication
        ):
            continue
        else:
            open_items.append(f"{subcategory} {finding.observation}/{finding.adjudication or 'awaiting adjudication'}")
    if open_items:
        return IntegrityStatus.PENDING, "pending: " + "; ".join(open_items)
    return IntegrityStatus.ACCEPTED, "accepted: every subcategory is clean, blocked or adjudicated allowed"


def experiment_integrity_recompute(*, experiment: Experiment, actor: str) -> Experiment:
    """Apply the acceptance rule and record the status change (with its reason) when there is one."""
    findings = list(IntegrityFinding.objects.filter(experiment=experiment))
    status, reason = acceptance_status(findings)
    return experiment_set_integrity(experiment=experiment, status=status, actor=actor, reason=reason[:4000])


# --------------------------------------------------------------------------- adjudication


def finding_adjudicate(
    *,
    finding: IntegrityFinding,
    adjudication: str,
    actor: str,
    rationale: str,
    observation: str | None = None,
) -> IntegrityFinding:
    """A Reviewer's or admin's judgement of one finding, with its rationale (both required, audited).

    ``actor`` names who decided (``reviewer_0001``, ``user:alice``); the caller has checked that
    they may (a Reviewer only within its scope, a person only as admin). ``observation``, when
    given, records what the person observed (it then stands over the automated check's until a
    person changes it again). ``UNKNOWN`` cannot be cleared by adjudication: re-run the check or
    record what was observed. A violating adjudication needs an ``EXECUTED`` observation.
    Data-provenance violations in a shared datapool entry flag every submission that used it.
    """
    if adjudication not in Adjudication.values and adjudication != "":
        raise ApplicationError("invalid_adjudication", f"adjudication must be one of {Adjudication.values}.")
    if observation is not None and observation not in Observation.values:
        raise ApplicationError("invalid_observation", f"observation must be one of {Observation.values}.")
    if not rationale or not rationale.strip():
        raise ApplicationError("rationale_required", "An adjudication needs a rationale; it is part of the record.")
    if not actor or not actor.strip():
        raise ApplicationError("actor_required", "Say who adjudicates (reviewer_0001, user:alice).")
    if finding.experiment_id is None:
        return _node_finding_adjudicate(
            finding=finding, adjudication=adjudication, actor=actor, rationale=rationale, observation=observation
        )
    with transaction.atomic():
        locked_experiment = Experiment.objects.select_for_update().get(pk=finding.experiment_id)
        locked = IntegrityFinding.objects.select_for_update().get(pk=finding.pk)
        evidence, new_observation = _adjudication_checked(
            locked, adjudication=adjudication, actor=actor, rationale=rationale, observation=observation
        )
        finding, _ = _finding_write(
            experiment=locked_experiment,
            subcategory=locked.subcategory,
            observation=new_observation,
            adjudication=adjudication,
            evidence=evidence,
            decided_by=actor[:200],
            rationale=rationale[:4000],
            actor=actor[:200],
        )
        event_append(
            run=locked_experiment.run,
            type="integrity.adjudicated",
            actor=actor[:200],
            role="system",
            arguments={
                "experiment": locked_experiment.handle,
                "subcategory": finding.subcategory,
                "observation": finding.observation,
                "adjudication": adjudication,
                "rationale": rationale,
            },
            result_ref=f"experiment:{locked_experiment.uuid}",
        )
        experiment_integrity_recompute(experiment=locked_experiment, actor=actor[:200])
    if adjudication == Adjudication.EXPLICIT_VIOLATION and finding.subcategory == Subcategory.DATA_PROVENANCE:
        for handle in (finding.evidence or {}).get("offending_entries", []):
            integrity_flag_shared(entry_handle=handle, actor=actor, reason=rationale, source=finding)
    return finding


def _adjudication_checked(
    locked: IntegrityFinding, *, adjudication: str, actor: str, rationale: str, observation: str | None
) -> tuple[dict[str, Any], str]:
    """The finding's evidence and observation once a manual observation is recorded, or the refusal:
    UNKNOWN is never cleared, a violation needs an EXECUTED observation (experiment and node alike)."""
    evidence = dict(locked.evidence or {})
    new_observation = locked.observation
    if observation is not None:
        evidence["manual_observation"] = {"observation": observation, "actor": actor, "rationale": rationale}
        new_observation = observation
    if new_observation == Observation.UNKNOWN and adjudication in CLEARING_ADJUDICATIONS:
        raise ApplicationError(
            "unknown_not_clearable",
            f"{locked.subcategory} is UNKNOWN (the check could not run); re-run the checks or record what you "
            "observed (observation) before clearing it.",
        )
    if adjudication in VIOLATING_ADJUDICATIONS and new_observation != Observation.EXECUTED:
        raise ApplicationError(
            "violation_needs_execution",
            f"{locked.subcategory} is {new_observation}; a violation is adjudicated on an EXECUTED observation "
            "(record observation=EXECUTED with what you saw).",
        )
    return evidence, new_observation


def _node_finding_adjudicate(
    *, finding: IntegrityFinding, adjudication: str, actor: str, rationale: str, observation: str | None
) -> IntegrityFinding:
    """:func:`finding_adjudicate` for a report's finding on its author's node (no experiment to recompute)."""
    with transaction.atomic():
        node = ResearchNode.objects.select_for_update().get(pk=finding.node_id or 0)
        locked = IntegrityFinding.objects.select_for_update().get(pk=finding.pk)
        evidence, new_observation = _adjudication_checked(
            locked, adjudication=adjudication, actor=actor, rationale=rationale, observation=observation
        )
        finding, _ = _finding_write(
            experiment=None,
            node=node,
            subcategory=locked.subcategory,
            observation=new_observation,
            adjudication=adjudication,
            evidence=evidence,
            decided_by=actor[:200],
            rationale=rationale[:4000],
            actor=actor[:200],
        )
        event_append(
            run=node.run,
            type="integrity.adjudicated",
            actor=actor[:200],
            role="system",
            arguments={
                "node": node.handle,
                "subcategory": finding.subcategory,
                "observation": finding.observation,
                "adjudication": adjudication,
                "rationale": rationale,
            },
            result_ref=f"node:{node.uuid}",
        )
    return finding


def reviewer_adjudicate(
    *,
    reviewer: ResearchNode,
    experiment: Experiment,
    subcategory: str,
    adjudication: str,
    rationale: str,
    observation: str | None = None,
) -> IntegrityFinding:
    """A Reviewer's judgement of one finding: the permission checks, then :func:`finding_adjudicate`.

    Only an active Reviewer, only for an experiment of a Worker on its review-scope in-edges, only a
    finding the checks have stored. ``observation`` is what the Reviewer saw; it is recorded (and
    then stands over the check's) only where it differs from the stored observation, so a
    Reviewer confirming the check's observation leaves later check runs free to update it.
    """
    in_scope = _reviewer_may_adjudicate(reviewer, experiment.owner_id, experiment.run_id)
    if not in_scope:
        raise PermissionDenied(
            "out_of_scope", f"{experiment.handle} belongs to a Worker outside {reviewer.handle}'s review scope."
        )
    if subcategory not in Subcategory.values:
        raise ApplicationError("invalid_subcategory", f"subcategory must be one of {Subcategory.values}.")
    finding = IntegrityFinding.objects.filter(experiment=experiment, subcategory=subcategory).first()
    if finding is None:
        raise Conflict(
            "not_checked",
            f"{experiment.handle} has no {subcategory} finding yet (its checks have not run); adjudicate it later.",
        )
    return finding_adjudicate(
        finding=finding,
        adjudication=adjudication,
        actor=reviewer.handle,
        rationale=rationale,
        observation=observation if observation is not None and observation != finding.observation else None,
    )


def _reviewer_may_adjudicate(reviewer: ResearchNode, node_id: int | None, run_id: int) -> bool:
    """Whether ``reviewer`` is an active Reviewer of ``run_id`` with node ``node_id`` on its review scope
    (raises for a node that is not an active Reviewer)."""
    reviewer = ResearchNode.objects.get(pk=reviewer.pk)  # its status now, not when the caller read it
    if reviewer.kind != NodeKind.REVIEWER:
        raise PermissionDenied("not_a_reviewer", f"{reviewer.handle} is not a Reviewer; only Reviewers adjudicate.")
    if reviewer.status != NodeStatus.ACTIVE:
        raise Conflict("node_not_active", f"{reviewer.handle} is {reviewer.status}; it adjudicates no more.")
    return (
        run_id == reviewer.run_id
        and ResearchEdge.objects.filter(downstream=reviewer, kind=EdgeKind.REVIEW_SCOPE, upstream_id=node_id).exists()
    )


def reviewer_adjudicate_report(
    *,
    reviewer: ResearchNode,
    node: ResearchNode,
    subcategory: str,
    adjudication: str,
    rationale: str,
    observation: str | None = None,
) -> IntegrityFinding:
    """A Reviewer's judgement of a report's finding on its author's node (a false claim in a Worker's
    summary): the rules of :func:`reviewer_adjudicate`, with the author on the Reviewer's review
    scope in place of the experiment's owner. The Main Agent is on no Reviewer's scope: its claims'
    findings are the operator's (the dashboard's review queue)."""
    if not _reviewer_may_adjudicate(reviewer, node.pk, node.run_id):
        raise PermissionDenied("out_of_scope", f"{node.handle} is outside {reviewer.handle}'s review scope.")
    if subcategory not in Subcategory.values:
        raise ApplicationError("invalid_subcategory", f"subcategory must be one of {Subcategory.values}.")
    finding = IntegrityFinding.objects.filter(node=node, subcategory=subcategory).first()
    if finding is None:
        raise Conflict(
            "not_checked",
            f"{node.handle}'s reports have no {subcategory} finding (not judged yet, or nothing to judge).",
        )
    return finding_adjudicate(
        finding=finding,
        adjudication=adjudication,
        actor=reviewer.handle,
        rationale=rationale,
        observation=observation if observation is not None and observation != finding.observation else None,
    )


# --------------------------------------------------------------------------- shared data and evaluators


def _touched_by_entry(entry: Any) -> list[Experiment]:
    """Experiments that trained on ``entry``, and those that continued from their weights."""
    direct = list(Experiment.objects.filter(pk__in=DataUsage.objects.filter(entry=entry).values("experiment_id")))
    outputs = [e.output_checkpoint_id for e in direct if e.output_checkpoint_id]
    descendant_ids = {cid for out in outputs for cid, _ in checkpoint_descendants(out)} | set(outputs)
    downstream = Experiment.objects.filter(input_checkpoint_id__in=descendant_ids)
    found = {e.pk: e for e in [*direct, *downstream]}
    return [found[k] for k in sorted(found)]


def integrity_flag_shared(
    *,
    actor: str,
    reason: str,
    entry_handle: str | None = None,
    benchmark: Any = None,
    source: IntegrityFinding | None = None,
) -> list[Experiment]:
    """A violation in shared data or in an evaluator: flag every submission it touched, and their runs.

    ``entry_handle``: a datapool entry found contaminated or tampered; every experiment that trained
    on it (and every experiment continuing from those weights) gets its data-provenance finding
    set to EXECUTED / EXPLICIT_VIOLATION. ``benchmark``: an evaluator found unsound; every experiment
    evaluated by it gets its harness finding set to EXECUTED / EVAL_INVALIDATING. Each affected run
    is flagged. Returns the experiments whose finding changed.
    """
    if (entry_handle is None) == (benchmark is None):
        raise ApplicationError("invalid_scope", "Name exactly one of a datapool entry or a benchmark.")
    if not reason.strip():
        raise ApplicationError("reason_required", "Flagging shared data or an evaluator needs a reason.")
    if entry_handle is not None:
        entry = DataEntry.objects.filter(handle=entry_handle).first()
        if entry is None:
            raise ApplicationError("data_not_found", f"No datapool entry {entry_handle!r}.", status=404)
        touched = _touched_by_entry(entry)
        codes = set((source.evidence or {}).get("codes", [])) if source is not None else set()
        if source is not None and "data_hash_mismatch" not in codes:
            # Overlap with sealed items is contamination for that benchmark only; changed bytes are
            # wrong for everyone.
            benchmark_id = source.experiment.run.benchmark_id if source.experiment is not None else None
            touched = [e for e in touched if e.run.benchmark_id == benchmark_id]
        subcategory, adjudication, what = Subcategory.DATA_PROVENANCE, Adjudication.EXPLICIT_VIOLATION, entry.handle
    else:
        touched = list(
            Experiment.objects.filter(pk__in=Evaluation.objects.filter(benchmark=benchmark).values("experiment_id"))
        )
        subcategory, adjudication, what = Subcategory.HARNESS_VERIFIER, Adjudication.EVAL_INVALIDATING, str(benchmark)
    changed: list[Experiment] = []
    runs: set[int] = set()
    for experiment in touched:
        with transaction.atomic():
            locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
            existing = IntegrityFinding.objects.filter(experiment=locked, subcategory=subcategory).first()
            runs.add(locked.run_id)
            if (
                existing is not None
                and existing.observation == Observation.EXECUTED
                and existing.adjudication in (VIOLATING_ADJUDICATIONS)
            ):
                continue
            evidence = dict(existing.evidence) if existing is not None else {}
            shared = list(evidence.get("shared_violations", []))
            shared.append(
                {
                    "scope": what,
                    "reason": reason[:2000],
                    "actor": actor,
                    "source": f"{source.experiment.handle}/{source.subcategory}"
                    if source is not None and source.experiment is not None
                    else None,
                }
            )
            evidence["shared_violations"] = shared
            evidence["manual_observation"] = {
                "observation": Observation.EXECUTED,
                "actor": actor,
                "rationale": f"shared {what}: {reason}"[:2000],
            }
            _finding_write(
                experiment=locked,
                subcategory=subcategory,
                observation=Observation.EXECUTED,
                adjudication=adjudication,
                evidence=evidence,
                decided_by=actor[:200],
                rationale=f"touched {what}, found in violation: {reason}"[:4000],
                actor=actor[:200],
            )
            experiment_integrity_recompute(experiment=locked, actor=actor[:200])
            changed.append(locked)
    for run in Run.objects.filter(pk__in=runs, flagged=False):
        run_flag(run=run, actor=actor, reason=f"shared {what} in violation: {reason}")
    return changed


def run_flag(*, run: Run, actor: str, reason: str) -> Run:
    """Flag a run: a violation in shared data or an evaluator touched its submissions (recorded as an event)."""
    with transaction.atomic():
        # Conditional update: concurrent flaggers write once.
        updated = Run.objects.filter(pk=run.pk, flagged=False).update(flagged=True)
        if updated:
            event_append(
                run=run,
                type="run.flagged",
                actor=actor[:200],
                role="system",
                arguments={"reason": reason[:2000]},
                result_ref=f"run:{run.uuid}",
            )
            # On commit: the run page shows the flag once it is committed, never a rolled-back one.
            publish_on_commit(run_group(run.uuid), LiveEvent.RUN_UPDATED, run_live_get(run))
    run.flagged = True
    return run


# --------------------------------------------------------------------------- hooks


def integrity_on_experiment_finished(*, experiment: Experiment) -> None:
    """The pipeline's hook: call it in the transaction that ends an experiment.

    The full checks are enqueued on commit (queue ``default``), so they run on committed rows and
    never inside the job's transaction. Idempotent: a second call re-runs the same checks.
    """
    experiment_id = experiment.pk
    # On commit: the task must see the experiment's final status and evaluation rows.
    transaction.on_commit(lambda: _send_check(experiment_id=experiment_id))


def integrity_on_report(
    *, run: Run, node: ResearchNode | None = None, handles: list[str] | None = None, text: str = ""
) -> None:
    """Hook for reports: a Worker finalized (``node``) or the Main Agent revised a claim (``handles`` cited,
    ``text`` the claim).

    On commit: the author's reports are judged on its node (:func:`integrity_check_reports`), and the
    reporting checks (repeated-run selection, failure disclosure) re-run on every experiment the
    report speaks about — the author's own and every one it cites or names, whoever ran it (a
    successor Worker re-stating a sibling's best-of-N is checked), and those that evaluated a
    checkpoint it cites. A report may flag an accepted experiment.
    """
    by_checkpoint = checks.evaluations_by_checkpoint(run)
    if node is not None:
        author = node.handle
        named, checkpoints = handles_in(node.summary or "")
        cited = set(named) | {str(h) for h in node.summary_experiments or []}
        owned = Q(owner=node)
    else:
        author = "main"
        named, checkpoints = handles_in(text)
        cited = {str(h) for h in handles or []} | set(named)
        owned = Q(pk__in=[])
    for checkpoint in {*checkpoints, *cited}:
        cited |= set(by_checkpoint.get(checkpoint, ()))
    experiments = Experiment.objects.filter(run=run, status__in=EXPERIMENT_TERMINAL_STATES).filter(
        owned | Q(handle__in=sorted(cited))
    )
    ids = list(experiments.values_list("pk", flat=True))
    for experiment_id in ids:
        # Bound per id (the default argument), and sent on commit like the experiment hook.
        transaction.on_commit(lambda pk=experiment_id: _send_check(experiment_id=pk, reporting_only=True))
    run_id = run.pk
    transaction.on_commit(lambda: _send_report_check(run_id=run_id, author=author))


def _send_report_check(*, run_id: int, author: str) -> None:
    """Ask a worker to judge one author's reports (``workers.data``'s task, sent by name)."""
    celery_app.send_task(TaskName.INTEGRITY_REPORTS, kwargs={"run_id": run_id, "author": author})


def integrity_check_author(*, run_id: int, author: str) -> list[IntegrityFinding]:
    """The task body: one author's reports judged on its node; a missing run is logged."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        logger.warning("report check: run %s does not exist", run_id)
        return []
    return integrity_check_reports(run=run, authors=[author])


def _send_check(*, experiment_id: int, reporting_only: bool = False) -> None:
    """Ask a worker to run the checks (``workers.data``'s task, sent by name: apps never import workers)."""
    celery_app.send_task(
        TaskName.INTEGRITY_CHECK, kwargs={"experiment_id": experiment_id, "reporting_only": reporting_only}
    )


def integrity_check_experiment(*, experiment_id: int, reporting_only: bool = False) -> list[IntegrityFinding]:
    """The task body: the experiment's checks (all, or the reporting three); a missing row is logged."""
    experiment = Experiment.objects.filter(pk=experiment_id).first()
    if experiment is None:
        logger.warning("integrity check: experiment %s does not exist", experiment_id)
        return []
    return integrity_run_checks(experiment=experiment, subcategories=checks.REPORTING if reporting_only else None)


def sealed_withholding_record(
    *, run: Run, node: ResearchNode, actor: str, role: str, tool: str, arguments: Any, withheld: list[Any]
) -> BlockedAttempt:
    """Record a read whose answer withheld sealed items (``apps.integrity.screen``).

    A withheld read is a denied read of sealed material (DESIGN.md, "Roles and what each may see"):
    a test-set-access ``BlockedAttempt`` (evidence for the reader's next submission, as every
    denied sealed read is) and an ``access.withheld`` event. The event, which the reader sees among
    its own events, names only the withheld places; the sealed sample ids stay on the
    BlockedAttempt, which Reviewers and people read. ``withheld``: ``screen.Withheld`` parts.
    """
    places = [part.public() for part in withheld]
    with transaction.atomic():
        attempt = BlockedAttempt.objects.create(
            run=run,
            node=node,
            subcategory=Subcategory.TEST_SET_ACCESS,
            tool=tool[:100],
            reason=f"withheld from the answer: {len(places)} part(s) matching sealed items",
            request={
                "arguments": storable(arguments),  # escaped: a hostile string must not lose the record
                "withheld": [{k: v for k, v in p.items() if k != "reason"} for p in places],
                "evidence": {"sample_ids": sorted({i for part in withheld for i in part.sample_ids})},
            },
        )
        event_append(
            run=run,
            type="access.withheld",
            actor=actor,
            role=role,
            tool=tool[:100],
            arguments={"request": storable(arguments), "withheld": places},
            result_ref=f"blocked_attempt:{attempt.pk}",
        )
    return attempt
