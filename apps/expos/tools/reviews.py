"""Review management tools: a Reviewer inspects, reports on and finalizes its scope; the Main Agent
reads the reports, redacted (DESIGN.md "ExpOS tools")."""

from __future__ import annotations

from typing import Any

from apps.core.errors import NotFound, PermissionDenied
from apps.experiments.models import Evaluation, Experiment
from apps.experiments.selectors import metric_summary
from apps.expos.payloads import job_brief, node_payload, run_node, scope_handles
from apps.expos.registry import Category, Role, ToolContext, tool
from apps.expos.schemas import (
    EXPERIMENT,
    EXPERIMENT_BRIEF,
    JOB,
    MAX_TEXT,
    NODE,
    REPORT,
    REVIEWER,
    TIMESTAMP,
    UUID,
    WORKER,
    alternatives,
    array,
    closed,
    enum,
    free_object,
    integer,
    nullable,
    number,
    string,
    text,
)
from apps.expos.selectors import experiment_brief
from apps.expos.visibility import visible_experiments
from apps.flows.reports import report_payload
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.models import IntegrityFinding
from apps.integrity.services import reviewer_adjudicate, reviewer_adjudicate_report
from apps.jobs.models import Job
from apps.research.choices import EdgeKind, NodeKind, NodeStatus
from apps.research.models import ResearchEdge, ResearchNode
from apps.reviews.models import ReviewReport
from apps.reviews.services import LIST_FIELDS, review_finalize, review_submit

REVIEWER_ROLE = {Role.REVIEWER}


def _scope_experiment(ctx: ToolContext, handle: str) -> Experiment:
    experiment = (
        visible_experiments(ctx)
        .select_related("owner", "input_checkpoint", "output_checkpoint__parent")
        .filter(handle=handle)
        .first()
    )
    if experiment is not None:
        return experiment
    if Experiment.objects.filter(run=ctx.run, handle=handle).exists():
        raise PermissionDenied("out_of_scope", f"{handle} belongs to a Worker outside this Reviewer's scope.")
    raise NotFound("unknown_experiment", f"No experiment {handle} in this run.")


_EVALUATION = closed(
    {
        "uuid": UUID,
        "split": string(16),
        "status": string(16),
        "score": nullable(number(0, 1)),
        "correct": integer(),
        "sample_count": integer(),
        "evaluator_sha256": string(64),
        "settings_sha256": string(64),
        "data_sha256": string(64),
        "backend": string(16),
        "refusal_reason": string(MAX_TEXT),
        "created_at": TIMESTAMP,
    }
)
_DATA = closed(
    {
        "handle": string(32),
        "name": string(200),
        "sha256": string(64),
        "rows": integer(),
        "format": string(8),
        "source_kind": string(16),
        "teacher": string(200),
        "purpose": string(16),
    }
)


_FINDING = {
    "subcategory": string(32),
    "observation": string(24),
    "adjudication": string(40),
    "rationale": string(MAX_TEXT),
    "decided_by": string(200),
    "evidence": free_object(),
}


def _finding_payload(finding: IntegrityFinding) -> dict[str, Any]:
    return {
        "subcategory": finding.subcategory,
        "observation": finding.observation,
        "adjudication": finding.adjudication,
        "rationale": finding.rationale,
        "decided_by": finding.decided_by,
        "evidence": finding.evidence if isinstance(finding.evidence, dict) else {"value": finding.evidence},
    }


def scope_report_findings(reviewer: ResearchNode) -> list[dict[str, Any]]:
    """What the reports of the Workers on ``reviewer``'s scope were judged to state, on their nodes."""
    scope = ResearchEdge.objects.filter(downstream=reviewer, kind=EdgeKind.REVIEW_SCOPE).values("upstream_id")
    findings = (
        IntegrityFinding.objects.filter(node__run=reviewer.run_id, node_id__in=scope, experiment__isnull=True)
        .select_related("node")
        .order_by("node__handle", "subcategory")
    )
    return [{"node": f.node.handle, **_finding_payload(f)} for f in findings if f.node is not None]


@tool(
    "state_get_current_reviewer",
    category=Category.REVIEW,
    roles=REVIEWER_ROLE,
    description="The calling Reviewer: its question (task), status and ETag (send it as If-Match to "
    "reviewer_finalize), the Workers of its scope, their experiments, how many reports it has submitted, "
    "and report_findings: what the checks found in those Workers' own reports (a summary claiming more than "
    "the record, judged on the Worker's node), with their evidence; judge one with an observation naming "
    "the Worker (node) in reviewer_submit_review.",
    output_schema=closed(
        {
            "reviewer": NODE,
            "scope": array(string(32), max_items=1000),
            "experiments": array(EXPERIMENT_BRIEF, max_items=10_000),
            "reports": integer(0),
            "report_findings": array(closed({"node": string(32), **_FINDING}), max_items=10_000),
        }
    ),
)
def state_get_current_reviewer(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    experiments = visible_experiments(ctx).select_related("owner").order_by("pk")
    ctx.etag_node = ctx.node
    return {
        "reviewer": node_payload(ctx.node),
        "scope": scope_handles(ctx.node),
        "experiments": [experiment_brief(ctx, e) for e in experiments],
        "reports": ReviewReport.objects.filter(reviewer=ctx.node).count(),
        "report_findings": scope_report_findings(ctx.node),
    }


@tool(
    "reviewer_inspect_experiment",
    category=Category.REVIEW,
    roles=REVIEWER_ROLE,
    description="Inspect one experiment of your scope: its work order (action, input checkpoint, parents, "
    "claim), result record (status, exact scores, evaluations with hashes), artifact tree (checkpoint "
    "manifest, training data), jobs, integrity findings and status history.",
    input_schema=closed({"experiment": EXPERIMENT}),
    output_schema=closed(
        {
            "work_order": closed(
                {
                    "handle": string(32),
                    "uuid": UUID,
                    "owner": string(32),
                    "kind": string(16),
                    "claim": string(MAX_TEXT),
                    "action": free_object(),
                    "input_checkpoint": string(64),
                    "parents": array(string(32), max_items=10_000),
                    "created_at": TIMESTAMP,
                }
            ),
            "result": closed(
                {
                    "status": string(16),
                    "integrity_status": string(16),
                    "feedback_score": nullable(number(0, 1)),
                    "evaluations": array(_EVALUATION, max_items=10_000),
                }
            ),
            "artifacts": closed(
                {
                    "output_checkpoint": nullable(
                        closed(
                            {
                                "handle": string(64),
                                "parent": nullable(string(64)),
                                "manifest_sha256": string(64),
                                "manifest": {"type": "object", "additionalProperties": {"type": "string"}},
                            }
                        )
                    ),
                    "data": array(_DATA, max_items=10_000),
                }
            ),
            "jobs": array(JOB, max_items=10_000),
            "findings": array(closed(_FINDING), max_items=100),
            "integrity_history": array(
                closed(
                    {
                        "from": string(16),
                        "to": string(16),
                        "actor": string(200),
                        "reason": string(MAX_TEXT),
                        "at": TIMESTAMP,
                    }
                ),
                max_items=10_000,
            ),
            # What the Worker logged itself (experiment_log_metrics): claims, not evaluations.
            "agent_metrics": array(
                closed({"key": string(100), "points": integer(), "first_step": integer(), "last_step": integer()}),
                max_items=100_000,
            ),
        }
    ),
    errors=("unknown_experiment", "out_of_scope"),
)
def reviewer_inspect_experiment(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    experiment = _scope_experiment(ctx, args["experiment"])
    evaluations = Evaluation.objects.filter(experiment=experiment).order_by("created_at", "pk")
    checkpoint = experiment.output_checkpoint
    usages = experiment.data_usages.select_related("entry").order_by("pk")
    jobs = Job.objects.filter(experiment=experiment).select_related("experiment").order_by("created_at", "pk")
    ctx.result_ref = f"experiment:{experiment.uuid}"
    return {
        "work_order": {
            "handle": experiment.handle,
            "uuid": str(experiment.uuid),
            "owner": experiment.owner.handle,
            "kind": experiment.kind,
            "claim": experiment.claim,
            "action": experiment.action if isinstance(experiment.action, dict) else {"value": experiment.action},
            "input_checkpoint": experiment.input_checkpoint.handle,
            "parents": sorted(experiment.parents.values_list("handle", flat=True)),
            "created_at": experiment.created_at.isoformat(),
        },
        "result": {
            "status": experiment.status,
            "integrity_status": experiment.integrity_status,
            "feedback_score": experiment.feedback_score,
            "evaluations": [
                {
                    "uuid": str(e.uuid),
                    "split": e.split,
                    "status": e.status,
                    "score": e.score,
                    "correct": e.correct,
                    "sample_count": e.sample_count,
                    "evaluator_sha256": e.evaluator_sha256,
                    "settings_sha256": e.settings_sha256,
                    "data_sha256": e.data_sha256,
                    "backend": e.backend,
                    "refusal_reason": e.refusal_reason,
                    "created_at": e.created_at.isoformat(),
                }
                for e in evaluations
            ],
        },
        "artifacts": {
            "output_checkpoint": None
            if checkpoint is None
            else {
                "handle": checkpoint.handle,
                "parent": checkpoint.parent.handle if checkpoint.parent_id else None,
                "manifest_sha256": checkpoint.manifest_sha256,
                "manifest": {str(k): str(v) for k, v in (checkpoint.manifest or {}).items()},
            },
            "data": [
                {
                    "handle": u.entry.handle,
                    "name": u.entry.name,
                    "sha256": u.entry.sha256,
                    "rows": u.entry.rows,
                    "format": u.entry.format,
                    "source_kind": u.entry.source_kind,
                    "teacher": u.entry.teacher,
                    "purpose": u.purpose,
                }
                for u in usages
            ],
        },
        "jobs": [job_brief(j) for j in jobs],
        "findings": [_finding_payload(f) for f in experiment.findings.order_by("subcategory")],
        "integrity_history": [
            {
                "from": c.from_status,
                "to": c.to_status,
                "actor": c.actor,
                "reason": c.reason,
                "at": c.created_at.isoformat(),
            }
            for c in experiment.integrity_changes.order_by("created_at", "pk")
        ],
        "agent_metrics": metric_summary(experiment_id=experiment.pk),
    }


_FINDING_LIST = array(text(MAX_TEXT), max_items=100)
_OBSERVATION = closed(
    {
        "experiment": EXPERIMENT,
        # Or the Worker whose reports (its summary) the observation judges: its finding on its node.
        "node": WORKER,
        "subcategory": enum(*Subcategory.values),
        "observation": enum(*Observation.values),
        "note": string(MAX_TEXT),
        "evidence": closed(
            {
                "sample_ids": array(string(100), max_items=1000),
                "spans": array(string(2000), max_items=1000),
                "detail": string(MAX_TEXT),
            },
            optional=("sample_ids", "spans", "detail"),
        ),
        # With an adjudication the observation is also a judgement of the stored finding
        # (apps.integrity.services.reviewer_adjudicate); the rationale is then required.
        "adjudication": enum(*Adjudication.values),
        "rationale": text(MAX_TEXT),
    },
    optional=("experiment", "node", "note", "evidence", "adjudication", "rationale"),
)
_OBSERVATION.update(
    alternatives(
        {"required": ["experiment"], "not": {"required": ["node"]}},
        {"required": ["node"], "not": {"required": ["experiment"]}},
        code="invalid_observation",
        message="An observation names one experiment (experiment) or one Worker whose reports it judges (node).",
    )
)
# What each adjudication left on the finding: an experiment's, with its integrity status after it,
# or a Worker's reports' (node).
_ADJUDICATED = closed(
    {
        "experiment": string(32),
        "node": string(32),
        "subcategory": string(32),
        "observation": string(24),
        "adjudication": string(40),
        "decided_by": string(200),
        "integrity_status": string(16),
    },
    optional=("experiment", "node", "integrity_status"),
)
_SUBMITTED_REPORT = {
    **REPORT,
    "properties": {**REPORT["properties"], "adjudications": array(_ADJUDICATED, max_items=500)},
    "required": [*REPORT["required"], "adjudications"],
}


@tool(
    "reviewer_submit_review",
    category=Category.REVIEW,
    roles=REVIEWER_ROLE,
    description="Submit a structured report on experiments of your scope: supported findings, uncertainties, "
    "protocol violations, regressions, missing comparisons, recommendations, and per-experiment integrity "
    "observations (with sample ids / spans as evidence). An observation with an adjudication (and its "
    "rationale) judges that experiment's stored integrity finding; one naming a Worker of your scope (node) "
    "instead of an experiment judges the finding on that Worker's own reports (state_get_current_reviewer "
    "lists them); the answer lists what each left.",
    input_schema=closed(
        {
            "summary": text(MAX_TEXT),
            "experiments": array(EXPERIMENT, max_items=200, unique=True),
            **{name: _FINDING_LIST for name in LIST_FIELDS},
            "observations": array(_OBSERVATION, max_items=500),
        },
        optional=("experiments", *LIST_FIELDS, "observations"),
    ),
    output_schema=_SUBMITTED_REPORT,
    idempotent_create=True,
    errors=(
        "out_of_scope",
        "node_not_active",
        "not_checked",
        "rationale_required",
        "unknown_not_clearable",
        "violation_needs_execution",
    ),
)
def reviewer_submit_review(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    observations = [
        {
            **{k: o[k] for k in ("experiment", "node") if k in o},
            "subcategory": o["subcategory"],
            "observation": o["observation"],
            "note": o.get("note", ""),
            "evidence": o.get("evidence", {}),
            **{k: o[k] for k in ("adjudication", "rationale") if k in o},
        }
        for o in args.get("observations", [])
    ]
    # The report (which checks the scope of every experiment it names) and the adjudications it
    # carries commit together: the tool call is one transaction.
    report = review_submit(
        reviewer=ctx.node,
        summary=args["summary"],
        experiments=args.get("experiments", []),
        observations=observations,
        findings={name: args.get(name, []) for name in LIST_FIELDS},
    )
    experiments = {e.handle: e for e in report.experiments.all()}
    named = [o["node"] for o in observations if "node" in o]  # review_submit checked they are of its scope
    authors = {n.handle: n for n in ResearchNode.objects.filter(run=ctx.run, handle__in=named)}
    adjudicated: list[dict[str, Any]] = []
    for o in observations:
        if "adjudication" not in o:
            continue
        if "node" in o:
            judged = reviewer_adjudicate_report(
                reviewer=ctx.node,
                node=authors[o["node"]],
                subcategory=o["subcategory"],
                adjudication=o["adjudication"],
                rationale=o.get("rationale") or o["note"],
                observation=o["observation"],
            )
            adjudicated.append(
                {
                    "node": o["node"],
                    "subcategory": judged.subcategory,
                    "observation": judged.observation,
                    "adjudication": judged.adjudication,
                    "decided_by": judged.decided_by,
                }
            )
            continue
        experiment = experiments[o["experiment"]]
        finding = reviewer_adjudicate(
            reviewer=ctx.node,
            experiment=experiment,
            subcategory=o["subcategory"],
            adjudication=o["adjudication"],
            rationale=o.get("rationale") or o["note"],
            observation=o["observation"],
        )
        experiment.refresh_from_db(fields=["integrity_status"])
        adjudicated.append(
            {
                "experiment": experiment.handle,
                "subcategory": finding.subcategory,
                "observation": finding.observation,
                "adjudication": finding.adjudication,
                "decided_by": finding.decided_by,
                "integrity_status": experiment.integrity_status,
            }
        )
    ctx.result_ref = f"report:{report.uuid}"
    return {**report_payload(report, redacted=False), "adjudications": adjudicated}


@tool(
    "reviewer_finalize",
    category=Category.REVIEW,
    roles=REVIEWER_ROLE,
    description="Finalize this Reviewer after at least one report; the reports become final and the Main Agent "
    "is woken to read them. Send If-Match with your ETag to refuse a stale write (412).",
    input_schema=closed({"summary": string(MAX_TEXT)}, optional=("summary",)),
    output_schema=NODE,
    errors=("no_report", "node_not_active", "precondition_failed"),
    etag_node=lambda ctx, args: ctx.node,
)
def reviewer_finalize(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    node = review_finalize(reviewer=ctx.node, summary=args.get("summary", ""), actor=ctx.actor)
    ctx.result_ref = f"node:{node.uuid}"
    ctx.etag_node = node
    return node_payload(node)


@tool(
    "inspect_reviewer_report",
    category=Category.REVIEW,
    roles={Role.MAIN, Role.REVIEWER},
    description="A Reviewer's status and reports. The Main Agent gets them redacted (no sealed instances, "
    "sample ids or outputs); a Reviewer reads its own in full.",
    input_schema=closed({"reviewer": REVIEWER}),
    output_schema=closed(
        {"reviewer": string(32), "status": enum(*NodeStatus.values), "reports": array(REPORT, max_items=10_000)}
    ),
    errors=("unknown_reviewer", "not_your_report"),
)
def inspect_reviewer_report(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    if ctx.role == Role.REVIEWER:
        if args["reviewer"] != ctx.node.handle:
            raise PermissionDenied("not_your_report", "A Reviewer reads its own reports; the Main Agent reads all.")
        reviewer = ctx.node
    else:
        reviewer = run_node(ctx, args["reviewer"], kind=NodeKind.REVIEWER)
    reports = (
        ReviewReport.objects.filter(reviewer=reviewer)
        .select_related("reviewer", "run__benchmark")
        .prefetch_related("experiments")
        .order_by("created_at", "pk")
    )
    redacted = ctx.role == Role.MAIN
    return {
        "reviewer": reviewer.handle,
        "status": reviewer.status,
        "reports": [report_payload(r, redacted=redacted) for r in reports],
    }
