"""Who may see what (DESIGN.md, "Roles and what each may see") — the one place scoping lives.

Every tool handler and every read endpoint gets its querysets from here, never by filtering in
the view. The rules:

- **Worker**: its own experiments and those of its designated predecessors (context in-edges,
  followed transitively up the context chain); aggregate feedback scores only, rounded to
  ``run.policy["score_decimals"]``; never per-sample rows, references, the final split or the
  private history of other Workers.
- **Reviewer**: everything its scope owns (the Workers on its review-scope in-edges): their
  experiments, per-sample rows, training data, configs, checkpoint provenance — never reference
  answers (the database holds none: they stay in the sealed folder).
- **Main Agent**: summaries, aggregate scores and redacted reports of its run; no per-sample rows.
- **People** (viewer / operator / admin): everything, through the read endpoints.

A denied read of sealed material raises :class:`SealedAccessDenied`; the API layer records it
(an ``access.denied`` event and a test-set-access BlockedAttempt) *after* the request's
transaction has rolled back, so the evidence survives the refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, QuerySet

from apps.benchmarks.models import Split
from apps.core.errors import PermissionDenied
from apps.core.jsonsafe import storable
from apps.core.people import is_person
from apps.datapool.models import AGENT_FORMATS, DataEntry
from apps.experiments.events import event_append
from apps.experiments.models import Checkpoint, Evaluation, Event, Experiment
from apps.experiments.scores import score_decimals, score_rounded
from apps.expos.registry import Role, ToolContext
from apps.integrity.choices import Subcategory
from apps.integrity.models import BlockedAttempt
from apps.jobs.models import Job
from apps.research.choices import EdgeKind
from apps.research.models import ResearchEdge, ResearchNode, Run
from apps.reviews.models import ReviewReport


@dataclass(frozen=True)
class HumanCaller:
    """A signed-in person (viewer, operator or admin). Sees everything the read endpoints offer."""

    user: Any
    role: str = "human"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


Caller = ToolContext | HumanCaller


def is_agent(caller: Caller) -> bool:
    return isinstance(caller, ToolContext)


class SealedAccessDenied(PermissionDenied):
    """A read of sealed material (per-sample rows, the final split, references) was refused."""

    def __init__(self, caller: Caller, *, what: str, tool: str = "", request: dict[str, Any] | None = None) -> None:
        super().__init__(
            "sealed",
            f"{what} is sealed for the {caller.role} role; this refused attempt has been recorded.",
            what=what,
        )
        self.caller = caller
        self.what = what
        self.tool = tool
        self.request_args = request or {}


def sealed_denial_record(exc: SealedAccessDenied) -> None:
    """Record a refused sealed read as evidence (test-set access). Call outside the failed transaction."""
    caller = exc.caller
    if not isinstance(caller, ToolContext):
        return
    with transaction.atomic():
        BlockedAttempt.objects.create(
            run=caller.run,
            node=caller.node,
            subcategory=Subcategory.TEST_SET_ACCESS,
            tool=exc.tool[:100],
            reason=f"denied read: {exc.what}",
            request=storable(exc.request_args),  # escaped: a hostile string must not lose the record
        )
        event_append(
            run=caller.run,
            type="access.denied",
            actor=caller.actor,
            role=caller.role,
            tool=exc.tool[:100],
            arguments={"what": exc.what, "request": exc.request_args},
            result_ref=f"node:{caller.node.uuid}",
        )


# --- the research DAG seen from one node ---------------------------------------------------------

_CONTEXT_CHAIN_SQL = """
WITH RECURSIVE chain(id) AS (
    SELECT CAST(%s AS BIGINT)
    UNION
    SELECT e.upstream_id FROM research_researchedge e JOIN chain ON e.downstream_id = chain.id
    WHERE e.kind = %s
)
SELECT id FROM chain
"""


def context_node_ids(node: ResearchNode) -> set[int]:
    """The Worker and its designated predecessors, transitively up the context chain (one query)."""
    with connection.cursor() as cursor:
        cursor.execute(_CONTEXT_CHAIN_SQL, [node.pk, EdgeKind.CONTEXT.value])
        return {row[0] for row in cursor.fetchall()}


def review_scope_node_ids(reviewer: ResearchNode) -> set[int]:
    """The Workers a Reviewer judges: its review-scope in-edges."""
    return set(
        ResearchEdge.objects.filter(downstream=reviewer, kind=EdgeKind.REVIEW_SCOPE).values_list(
            "upstream_id", flat=True
        )
    )


def owner_node_ids(caller: Caller) -> set[int] | None:
    """Node ids whose experiments ``caller`` may read; None means every node of its scope (run or all)."""
    if not isinstance(caller, ToolContext) or caller.role == Role.MAIN:
        return None
    cache_key = "owner_node_ids"
    if cache_key not in caller.extra:
        if caller.role == Role.WORKER:
            caller.extra[cache_key] = context_node_ids(caller.node)
        else:
            caller.extra[cache_key] = review_scope_node_ids(caller.node)
    return caller.extra[cache_key]


def in_review_scope(caller: Caller, node: ResearchNode) -> bool:
    ids = owner_node_ids(caller)
    return isinstance(caller, ToolContext) and caller.role == Role.REVIEWER and ids is not None and node.pk in ids


# --- querysets -------------------------------------------------------------------------------------


def visible_runs(caller: Caller) -> QuerySet[Run]:
    runs = Run.objects.all()
    if isinstance(caller, ToolContext):
        return runs.filter(pk=caller.run.pk)
    return runs


def visible_nodes(caller: Caller) -> QuerySet[ResearchNode]:
    nodes = ResearchNode.objects.all()
    if not isinstance(caller, ToolContext):
        return nodes
    nodes = nodes.filter(run=caller.run)
    ids = owner_node_ids(caller)
    if ids is None:
        return nodes
    return nodes.filter(Q(pk__in=ids) | Q(pk=caller.node.pk))


def visible_experiments(caller: Caller) -> QuerySet[Experiment]:
    experiments = Experiment.objects.all()
    if not isinstance(caller, ToolContext):
        return experiments
    experiments = experiments.filter(run=caller.run)
    ids = owner_node_ids(caller)
    return experiments if ids is None else experiments.filter(owner_id__in=ids)


def visible_evaluations(caller: Caller) -> QuerySet[Evaluation]:
    """Agents see evaluations of the experiments they see; Main and Workers the feedback split only."""
    evaluations = Evaluation.objects.all()
    if not isinstance(caller, ToolContext):
        return evaluations
    evaluations = evaluations.filter(run=caller.run, experiment__isnull=False)
    if caller.role != Role.REVIEWER:
        evaluations = evaluations.filter(split=Split.FEEDBACK)
    ids = owner_node_ids(caller)
    return evaluations if ids is None else evaluations.filter(experiment__owner_id__in=ids)


def evaluation_read_check(caller: Caller, evaluation: Evaluation, *, tool: str = "") -> None:
    """Refuse (and have recorded) an agent's read of an evaluation it may not see.

    The final split and evaluations outside the caller's experiments are sealed material for
    Workers and the Main Agent: a refusal, not a silent 404, so the attempt is evidence.
    """
    if not isinstance(caller, ToolContext):
        return
    if visible_evaluations(caller).filter(pk=evaluation.pk).exists():
        return
    what = f"evaluation {evaluation.uuid} ({evaluation.split} split)"
    raise SealedAccessDenied(caller, what=what, tool=tool, request={"evaluation": str(evaluation.uuid)})


def can_read_samples(caller: Caller, evaluation: Evaluation) -> bool:
    """Per-sample rows: people and Reviewers whose scope owns the evaluated experiment; nobody else."""
    if not isinstance(caller, ToolContext):
        return True
    if caller.role != Role.REVIEWER or evaluation.run_id != caller.run.pk or evaluation.experiment_id is None:
        return False
    ids = owner_node_ids(caller) or set()
    return Experiment.objects.filter(pk=evaluation.experiment_id, owner_id__in=ids).exists()


def samples_read_check(caller: Caller, evaluation: Evaluation, *, tool: str = "") -> None:
    if not can_read_samples(caller, evaluation):
        raise SealedAccessDenied(
            caller,
            what=f"per-sample rows of evaluation {evaluation.uuid}",
            tool=tool,
            request={"evaluation": str(evaluation.uuid)},
        )


def visible_checkpoints(caller: Caller) -> QuerySet[Checkpoint]:
    """Agents: θ0 of their run and the checkpoints of experiments they see; never the reference."""
    checkpoints = Checkpoint.objects.all()
    if not isinstance(caller, ToolContext):
        return checkpoints
    experiments = visible_experiments(caller)
    return checkpoints.filter(
        Q(pk=caller.run.base_checkpoint_id)
        | Q(pk__in=experiments.filter(output_checkpoint__isnull=False).values("output_checkpoint_id"))
        | Q(pk__in=experiments.values("input_checkpoint_id"))
    ).exclude(is_reference=True)


def visible_datapool(caller: Caller) -> QuerySet[DataEntry]:
    """The datapool is shared across runs and open to every role (DESIGN.md), except that agents
    never see exported agent trajectories (format chat): those train agent models, not θ0."""
    entries = DataEntry.objects.all()
    if isinstance(caller, ToolContext):
        return entries.filter(format__in=AGENT_FORMATS)
    return entries


def visible_reports(caller: Caller) -> QuerySet[ReviewReport]:
    """Main: its run's reports (served redacted); a Reviewer: its own; Workers: none."""
    reports = ReviewReport.objects.all()
    if not isinstance(caller, ToolContext):
        return reports
    reports = reports.filter(run=caller.run)
    if caller.role == Role.MAIN:
        return reports
    if caller.role == Role.REVIEWER:
        return reports.filter(reviewer=caller.node)
    return reports.none()


def visible_jobs(caller: Caller) -> QuerySet[Job]:
    jobs = Job.objects.all()
    if not isinstance(caller, ToolContext):
        return jobs
    if caller.role == Role.MAIN:
        return jobs.filter(run=caller.run)
    return jobs.filter(run=caller.run, experiment__in=visible_experiments(caller))


def visible_events(caller: Caller) -> QuerySet[Event]:
    """Main: its run's events; Workers and Reviewers: events whose actor is a node they see.

    Sealed events only, for every caller (EventQuerySet.sealed says why).
    """
    events = Event.objects.sealed()
    if not isinstance(caller, ToolContext):
        return events
    events = events.filter(run=caller.run)
    if caller.role == Role.MAIN:
        return events
    handles = list(visible_nodes(caller).values_list("handle", flat=True))
    return events.filter(actor__in=handles)


# --- shaping what is returned ----------------------------------------------------------------------


def score_for(caller: Caller, value: float | None) -> float | None:
    """Scores for agents are rounded as the run policy says, so the feedback split cannot be mined."""
    if value is None or not isinstance(caller, ToolContext):
        return value
    return score_rounded(float(value), score_decimals(caller.run.policy))


def event_arguments_for(caller: Caller, event: Event) -> dict[str, Any]:
    """Reviewer events may quote sealed instances; the Main Agent sees that they happened, not what."""
    if isinstance(caller, ToolContext) and caller.role == Role.MAIN and event.role == Role.REVIEWER:
        return {"redacted": True}
    return event.arguments if isinstance(event.arguments, dict) else {"value": event.arguments}


# --- transcripts -----------------------------------------------------------------------------------


def transcript_read_check(caller: Caller, node: ResearchNode) -> None:
    """Who may read a node's transcript (apps.research.transcripts): the visibility rules, applied.

    A Reviewer reads the transcripts of the Workers in its review scope (what they were shown is
    Worker-visible by construction) and its own; operators and admins read every transcript. Workers
    and the Main Agent read none: a Reviewer's transcript holds sealed prompts and model outputs, and
    another Worker's is its private history. A transcript is never served to a plain viewer either.
    """
    if isinstance(caller, HumanCaller):
        user = caller.user
        if is_person(user) and (user.is_superuser or user.groups.filter(name__in=("operator", "admin")).exists()):
            return
        raise PermissionDenied("forbidden_role", "Transcripts are shown to operators and admins.")
    if caller.role == Role.REVIEWER and node.run_id == caller.run.pk:
        if node.pk == caller.node.pk or (node.kind == "worker" and in_review_scope(caller, node)):
            return
        raise PermissionDenied(
            "out_of_scope", f"{node.handle} is not in your review scope; you may read the transcripts of "
            "the Workers you review.")  # fmt: skip
    raise PermissionDenied(
        "forbidden_role", f"Transcripts are read by Reviewers (of the Workers in their scope) and operators, "
        f"not by the {caller.role} role.")  # fmt: skip
