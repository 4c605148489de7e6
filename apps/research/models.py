"""Runs and the research DAG: Workers and Reviewers grown by the Main Agent (DESIGN.md)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from apps.core.models import BaseModel, UUIDModel
from apps.research.agent_config import DEFAULT_SEARCH_POLICY, SEARCH_POLICIES
from apps.research.choices import (
    AgentLoopStatus,
    AgentMode,
    CandidateStatus,
    DecisionKind,
    EdgeKind,
    NodeKind,
    NodeStatus,
    PredictionVerdict,
    RunStatus,
    Trigger,
)


def default_policy() -> dict:
    """A new run's policy; docs/run-policy.md describes every key and its default."""
    return {
        "allowed_teachers": [],
        "training_gate": False,
        # Feedback-evaluation quotas (the submission review refuses past the tightest one): per
        # Worker lineage (a Worker, its predecessors and successors share one allowance), per input
        # checkpoint across all Workers, and per run.
        "feedback_evals_per_worker": 20,
        "feedback_evals_per_checkpoint": 40,
        "feedback_evals_per_run": 200,
        "score_decimals": 2,
        # Distinct sealed items allowed in the training data of the evaluated weights (the
        # submission's and its lineage's back to θ0); below 1, a share of the sealed items.
        "contamination_tolerance": 0,
        # Repeated-run selection: two trainings of one Worker from the same θ_in on the same data are
        # repeats when every recipe number is within this fraction of the other (seeds ignored).
        "repeat_relative_tolerance": 0.05,
        # Teacher detection (apps.integrity.teacher): the share of a dataset's telling rows (the
        # candidate teacher's wrong answers and decoding artefacts) copied exactly from that
        # teacher above which undeclared data is reported for adjudication.
        "teacher_agreement_threshold": 0.5,
        # ... and the share of the sampled rows whose prompt is in no catalog set (off-catalog
        # prompts) copied exactly, above which it is reported too (measured: docs/benchmarks.md).
        "teacher_sample_agreement_threshold": 0.95,
        # The contamination layers a run requires (one that did not run leaves data provenance
        # UNKNOWN and holds submissions) and those it runs when it can (a status in the evidence).
        # apps/integrity/overlap.py DEFAULT_LAYERS; docs/benchmarks.md "Contamination layers".
        "contamination_layers": {
            "required": ["exact", "ngram", "near_dup", "salient", "embedding"],
            "optional": ["llm_judge"],
        },
        "contamination_embedding_threshold": 0.70,
        # Run-level health: when this many of the run's last `job_failure_window` ended jobs
        # failed, the run says so (page, event) and wakes the Main Agent with the failures.
        "job_failure_window": 4,
        "job_failure_threshold": 3,
        # Data an agent uploads (worker_add_data content): the most rows and bytes of one upload.
        "upload_max_rows": 200_000,
        "upload_max_bytes": 64 * 1024 * 1024,
        # Accelerators: the most one job may ask for (worker_submit's train.accelerators), and the
        # most the run's running jobs hold together (the scheduler waits beyond it).
        "accelerators_per_job": 1,
        "accelerators_per_run": 8,
    }


class Run(UUIDModel):
    """One research run: improve θ0 toward one benchmark's capability within a budget."""

    name = models.CharField(max_length=200)
    benchmark = models.ForeignKey("benchmarks.Benchmark", on_delete=models.PROTECT, related_name="runs")
    base_checkpoint = models.ForeignKey("experiments.Checkpoint", on_delete=models.PROTECT, related_name="+")
    target_capability = models.TextField()
    agent_mode = models.CharField(max_length=16, choices=AgentMode.choices, default=AgentMode.HEURISTIC)
    # The Main Agent's search policy over the research DAG (agent_config.SEARCH_POLICIES, issue 32).
    search_policy = models.CharField(
        max_length=16, choices=[(n, n) for n in SEARCH_POLICIES], default=DEFAULT_SEARCH_POLICY
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.CREATED)
    budget_wall_seconds = models.PositiveIntegerField()
    budget_accelerator_seconds = models.PositiveIntegerField()
    budget_llm_tokens = models.PositiveBigIntegerField()
    max_parallel_workers = models.PositiveSmallIntegerField(default=2)
    # Accelerator-seconds set aside at start for the final evaluation, so it always runs.
    reserved_final_seconds = models.PositiveIntegerField(default=0)
    used_accelerator_seconds = models.FloatField(default=0)
    used_llm_tokens = models.PositiveBigIntegerField(default=0)
    policy = models.JSONField(default=default_policy)
    prompt_hashes = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result_checkpoint = models.ForeignKey(
        "experiments.Checkpoint", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    flagged = models.BooleanField(default=False)
    # People's labels on the runs list (run_label): free tags to filter by, and a star.
    tags = models.JSONField(default=list, blank=True)
    starred = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(max_parallel_workers__gte=1), name="run_parallel_gte_1"),
            models.CheckConstraint(condition=Q(used_accelerator_seconds__gte=0), name="run_used_accel_gte_0"),
            models.CheckConstraint(
                condition=Q(reserved_final_seconds__lte=F("budget_accelerator_seconds")),
                name="run_reserve_within_budget",
            ),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
            models.CheckConstraint(condition=Q(search_policy__in=SEARCH_POLICIES), name="run_search_policy_valid"),
        ]

    def __str__(self) -> str:
        return self.name


class RunStatusChange(BaseModel):
    """History of a run's status: who changed it, from what, why."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="status_changes")
    from_status = models.CharField(max_length=16, choices=RunStatus.choices, blank=True)
    to_status = models.CharField(max_length=16, choices=RunStatus.choices)
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True)


class ResearchNode(UUIDModel):
    """A node of the research DAG: the Main Agent, a Worker (a hypothesis) or a Reviewer (a scope)."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="nodes")
    kind = models.CharField(max_length=16, choices=NodeKind.choices)
    handle = models.CharField(max_length=32)  # worker_0003, reviewer_0001, main
    task = models.TextField(blank=True)  # Worker: hypothesis / task; Reviewer: question
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.ACTIVE)
    summary = models.TextField(blank=True)
    summary_experiments = models.JSONField(default=list, blank=True)  # cited experiment handles
    created_by_decision = models.ForeignKey(
        "research.Decision", on_delete=models.PROTECT, null=True, blank=True, related_name="spawned_nodes"
    )
    finalized_at = models.DateTimeField(null=True, blank=True)
    # Bumped on every change so clients can send If-Match and get 412 on a lost update.
    version = models.PositiveIntegerField(default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "handle"], name="node_handle_unique_per_run"),
            models.UniqueConstraint(fields=["run"], condition=Q(kind=NodeKind.MAIN), name="one_main_per_run"),
            models.CheckConstraint(condition=Q(kind__in=NodeKind.values), name="node_kind_valid"),
            models.CheckConstraint(condition=Q(status__in=NodeStatus.values), name="node_status_valid"),
        ]

    def __str__(self) -> str:
        return self.handle


class ResearchEdge(BaseModel):
    """An edge of the research DAG; cycles are refused by the service under a run lock."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="edges")
    upstream = models.ForeignKey(ResearchNode, on_delete=models.PROTECT, related_name="downstream_edges")
    downstream = models.ForeignKey(ResearchNode, on_delete=models.PROTECT, related_name="upstream_edges")
    kind = models.CharField(max_length=16, choices=EdgeKind.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["upstream", "downstream"], name="research_edge_unique"),
            models.CheckConstraint(condition=~Q(upstream=F("downstream")), name="research_edge_no_self_loop"),
            models.CheckConstraint(condition=Q(kind__in=EdgeKind.values), name="research_edge_kind_valid"),
        ]


class Decision(UUIDModel):
    """An orchestration decision of the Main Agent, with its trigger and rationale (append-only)."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="decisions")
    kind = models.CharField(max_length=16, choices=DecisionKind.choices)
    trigger = models.CharField(max_length=32, choices=Trigger.choices)
    rationale = models.TextField()
    subject = models.ForeignKey(ResearchNode, on_delete=models.PROTECT, null=True, blank=True, related_name="decisions")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=DecisionKind.values), name="decision_kind_valid"),
            models.CheckConstraint(condition=Q(trigger__in=Trigger.values), name="decision_trigger_valid"),
        ]


class OptimizerClaim(BaseModel):
    """A research claim of the Main Agent; each revision is a new row (revision history)."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="claims")
    key = models.CharField(max_length=100)
    revision = models.PositiveIntegerField()
    text = models.TextField()
    evidence = models.JSONField(default=list, blank=True)  # experiment / report handles

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key", "revision"], name="claim_revision_unique"),
            models.CheckConstraint(condition=Q(revision__gte=1), name="claim_revision_gte_1"),
        ]


class Guidance(UUIDModel):
    """Human guidance, pending until a Main Agent planning step applies it."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="guidance")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    text = models.TextField()
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_decision = models.ForeignKey(
        Decision, on_delete=models.PROTECT, null=True, blank=True, related_name="applied_guidance"
    )
    applied_note = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(applied_decision__isnull=True) | Q(applied_at__isnull=False),
                name="guidance_decision_needs_applied_at",
            ),
        ]


class Prediction(UUIDModel):
    """An outcome predicted before a branch runs, bound to it, and reconciled afterwards."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="predictions")
    text = models.TextField()
    metric = models.CharField(max_length=100, default="feedback_score")
    expected_value = models.FloatField(null=True, blank=True)
    worker = models.ForeignKey(
        ResearchNode, on_delete=models.PROTECT, null=True, blank=True, related_name="predictions"
    )
    verdict = models.CharField(max_length=16, choices=PredictionVerdict.choices, default=PredictionVerdict.OPEN)
    observed_value = models.FloatField(null=True, blank=True)
    reconciliation = models.TextField(blank=True)
    reconciled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(verdict=PredictionVerdict.OPEN) | Q(reconciled_at__isnull=False),
                name="prediction_verdict_needs_reconciled_at",
            ),
        ]


class Candidate(UUIDModel):
    """A proposed direction or intervention, open to every agent of the run."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="candidates")
    proposer = models.ForeignKey(ResearchNode, on_delete=models.PROTECT, related_name="candidates")
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=CandidateStatus.choices, default=CandidateStatus.OPEN)


class LLMUsage(BaseModel):
    """Tokens and cost of one model call, per node; summed against the run's token budget."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="llm_usage")
    node = models.ForeignKey(ResearchNode, on_delete=models.PROTECT, related_name="llm_usage")
    model = models.CharField(max_length=200)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)


class AgentLoop(UUIDModel):
    """The step cursor of one agent (DESIGN.md "Agents"): a Celery task runs one step, then re-enqueues.

    Everything a step needs to resume lives on this row, so a restarted stack continues from the
    database. ``journal`` holds the current step's tool calls and model turns with their answers
    as they happen: a step re-run after a crash replays them instead of re-asking, and re-sends only
    the one call that was in flight, with the same Idempotency-Key (node, step, call index).
    """

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="agent_loops")
    node = models.OneToOneField(ResearchNode, on_delete=models.PROTECT, related_name="agent_loop")
    policy = models.CharField(max_length=16, choices=AgentMode.choices)
    status = models.CharField(max_length=16, choices=AgentLoopStatus.choices, default=AgentLoopStatus.SCHEDULED)
    step = models.PositiveIntegerField(default=0)  # steps completed: the cursor
    stop_requested = models.BooleanField(default=False)
    # Triggers not yet handled by a step (the Main Agent's wake-ups), each {"id", "trigger", ...}.
    inbox = models.JSONField(default=list, blank=True)
    # The policy's memory between steps: heuristic state, or the LLM transcript and its summary.
    state = models.JSONField(default=dict, blank=True)
    journal = models.JSONField(default=list, blank=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)  # when the next step may run
    claimed_by = models.CharField(max_length=200, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    # The running step's process beats here (LoopConfig.heartbeat_seconds); a beat older than
    # stale_seconds means the process died (the OOM killer takes a pool child alone) and the step
    # is re-run from its journal.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    failures = models.PositiveSmallIntegerField(default=0)  # consecutive failed attempts of this step
    # The run supervisor's tick number and time (Main loop only): a tick message is honoured once,
    # and a supervisor that has not ticked for a while is restarted by the next agent step.
    supervisor_tick = models.PositiveIntegerField(default=0)
    supervised_at = models.DateTimeField(null=True, blank=True)
    # The supervisor's own bookkeeping (what it has announced or reconciled), apart from ``state``,
    # which the Main loop's steps rewrite.
    supervisor_state = models.JSONField(default=dict, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=AgentLoopStatus.values), name="agent_loop_status_valid"),
            models.CheckConstraint(condition=Q(policy__in=AgentMode.values), name="agent_loop_policy_valid"),
            models.CheckConstraint(
                condition=~Q(status=AgentLoopStatus.RUNNING) | Q(claimed_at__isnull=False),
                name="agent_loop_running_is_claimed",
            ),
        ]
        indexes = [models.Index(fields=["run", "status"], name="agent_loop_run_status_idx")]

    def __str__(self) -> str:
        return f"loop:{self.node_id}@{self.step}"


class TranscriptBlob(models.Model):
    """One JSON value of a transcript (a message, a tool list, a request), stored once by its sha256.

    Content-addressed: the key is ``sha256(canonical_json(value))``, so a message repeated in every
    later request of a conversation is stored once. Append-only (migration 0009's triggers).
    """

    sha256 = models.CharField(max_length=64, primary_key=True)
    value = models.JSONField()
    size = models.PositiveIntegerField()  # bytes of the canonical JSON
    created_at = models.DateTimeField(auto_now_add=True)


class TranscriptTurn(UUIDModel):
    """One model turn of one agent: what it was asked, what it answered, and the tools' answers.

    ``request`` names a blob ``{"messages": [message sha256...], "tools": sha256}``; ``response`` the
    assistant message (OpenAI chat form, ``tool_calls`` included); ``tool_messages`` the ``tool``
    messages that answered it; ``calls`` the REST calls behind them (name, arguments, status,
    answer), which a replay plays back. ``source`` says who produced the turn: the LLM, the
    heuristic policy (its tool calls written as assistant tool calls) or an external harness (the
    tool-call side the server saw). ``segment`` grows at each context compaction; a compacting turn
    carries the ``summary`` that replaced the older messages. Append-only (migration 0009).
    """

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="transcript_turns")
    node = models.ForeignKey(ResearchNode, on_delete=models.PROTECT, related_name="transcript_turns")
    seq = models.PositiveIntegerField()  # 1, 2, ... per node
    step = models.PositiveIntegerField()  # the agent loop's step (harness turns: 0)
    index = models.PositiveIntegerField(default=0)  # the call index within the step
    source = models.CharField(max_length=16)  # llm | heuristic | harness
    segment = models.PositiveIntegerField(default=0)
    summary = models.TextField(blank=True)  # the compaction summary this turn started with
    request = models.CharField(max_length=64)  # TranscriptBlob sha256
    response = models.CharField(max_length=64)
    tool_messages = models.CharField(max_length=64)
    calls = models.CharField(max_length=64)
    inbox = models.JSONField(default=list, blank=True)  # the triggers this step saw (for replays)
    model = models.CharField(max_length=200, blank=True)
    finish_reason = models.CharField(max_length=32, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    attempts = models.PositiveSmallIntegerField(default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "seq"], name="transcript_turn_seq_unique"),
            models.UniqueConstraint(fields=["node", "step", "index"], name="transcript_turn_step_unique"),
            models.CheckConstraint(
                condition=Q(source__in=["llm", "heuristic", "harness"]), name="transcript_turn_source_valid"
            ),  # fmt: skip
        ]


class Note(UUIDModel):
    """One version of a person's markdown note on a run, or on one experiment of it (issue 36).

    Append-only: editing a note adds the next version (apps.research.notes.note_add); the page
    shows the newest, the history and the export keep them all.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="notes")
    experiment = models.ForeignKey(
        "experiments.Experiment", on_delete=models.CASCADE, null=True, blank=True, related_name="notes"
    )
    version = models.PositiveIntegerField()
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    text = models.TextField()

    class Meta:
        constraints = [
            # One version number per subject: two people saving at once cannot both be version N.
            models.UniqueConstraint(
                fields=["run", "version"], condition=Q(experiment__isnull=True), name="note_run_version_unique"
            ),
            models.UniqueConstraint(
                fields=["experiment", "version"],
                condition=Q(experiment__isnull=False),
                name="note_experiment_version_unique",
            ),
            models.CheckConstraint(condition=Q(version__gte=1), name="note_version_positive"),
        ]
