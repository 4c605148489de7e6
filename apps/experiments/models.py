"""The experiment graph, checkpoints, evaluations and the tamper-evident event log."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from apps.benchmarks.models import Split
from apps.core.models import BaseModel, UUIDModel
from apps.experiments.choices import EvaluationStatus, ExperimentKind, ExperimentStatus, IntegrityStatus


class Checkpoint(UUIDModel):
    """A model checkpoint with a sha256 manifest of every file; lineage follows ``parent``."""

    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    handle = models.CharField(max_length=64, unique=True)  # ckpt_0004, or minibench/arithmetic/theta0
    uri = models.CharField(max_length=1000)
    manifest = models.JSONField()  # relative path -> sha256 of weights, config and tokenizer files
    manifest_sha256 = models.CharField(max_length=64)
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="children")
    producing_job = models.OneToOneField(
        "jobs.Job", on_delete=models.PROTECT, null=True, blank=True, related_name="output_checkpoint"
    )
    is_base = models.BooleanField(default=False)  # θ0 of some benchmark
    is_reference = models.BooleanField(default=False)  # the sealed "instruct" reference
    # A registered model's family, chat template sha256 and EOS handling (apps.ml.base_models).
    model_profile = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(is_base=True, parent__isnull=False), name="base_has_no_parent"),
            models.CheckConstraint(condition=~Q(parent=F("id")), name="checkpoint_no_self_parent"),
        ]

    def __str__(self) -> str:
        return self.handle


class Experiment(UUIDModel):
    """z = (θ_in, a, θ_out, e): one submission that passed review, owned by exactly one Worker."""

    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, related_name="experiments")
    handle = models.CharField(max_length=32)  # exp_0001, per run
    owner = models.ForeignKey("research.ResearchNode", on_delete=models.PROTECT, related_name="experiments")
    kind = models.CharField(max_length=16, choices=ExperimentKind.choices)
    status = models.CharField(max_length=16, choices=ExperimentStatus.choices, default=ExperimentStatus.QUEUED)
    input_checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="consumers")
    output_checkpoint = models.OneToOneField(
        Checkpoint, on_delete=models.PROTECT, null=True, blank=True, related_name="experiment"
    )
    action = models.JSONField()  # the validated recipe: data, hyper-parameters, template handling
    integrity_status = models.CharField(max_length=16, choices=IntegrityStatus.choices, default=IntegrityStatus.PENDING)
    claim = models.TextField(blank=True)
    feedback_score = models.FloatField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    parents = models.ManyToManyField(
        "self",
        through="ExperimentEdge",
        through_fields=("child", "parent"),
        symmetrical=False,
        related_name="children",
        blank=True,
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "handle"], name="experiment_handle_unique_per_run"),
            models.UniqueConstraint(fields=["owner", "idempotency_key"], name="experiment_idempotency_unique"),
            models.CheckConstraint(condition=Q(kind__in=ExperimentKind.values), name="experiment_kind_valid"),
            models.CheckConstraint(condition=Q(status__in=ExperimentStatus.values), name="experiment_status_valid"),
            models.CheckConstraint(
                condition=Q(integrity_status__in=IntegrityStatus.values), name="experiment_integrity_valid"
            ),
            models.CheckConstraint(
                condition=Q(feedback_score__isnull=True) | (Q(feedback_score__gte=0) & Q(feedback_score__lte=1)),
                name="experiment_score_0_1",
            ),
        ]

    def __str__(self) -> str:
        return self.handle


class MetricPoint(models.Model):
    """One value an agent logged on its experiment at a step (``experiment_log_metrics``). Append-only.

    Agent-reported: a Worker's own measurement (a data statistic, a check it ran), never an
    evaluation — scores come only from the sealed evaluator (:class:`Evaluation`). A key logs
    one value per step, so a retried call changes nothing and a logged value is never replaced.
    """

    id = models.BigAutoField(primary_key=True)
    # No FOREIGN KEY constraint (db_constraint=False, as Event's chain and run): see Event.
    experiment = models.ForeignKey(
        Experiment, on_delete=models.PROTECT, related_name="metric_points", db_constraint=False
    )
    key = models.CharField(max_length=100)
    step = models.BigIntegerField()
    value = models.FloatField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # Also the index every read uses: (experiment, key) ordered by step.
            models.UniqueConstraint(fields=["experiment", "key", "step"], name="metric_point_one_value_per_step"),
        ]

    def __str__(self) -> str:
        return f"{self.key}@{self.step}={self.value}"


class ExperimentEdge(BaseModel):
    """Experiment graph edge: ``child`` continues ``parent`` (several parents = a merge)."""

    parent = models.ForeignKey(Experiment, on_delete=models.PROTECT, related_name="child_edges")
    child = models.ForeignKey(Experiment, on_delete=models.PROTECT, related_name="parent_edges")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["parent", "child"], name="experiment_edge_unique"),
            models.CheckConstraint(condition=~Q(parent=F("child")), name="experiment_edge_no_self_loop"),
        ]
        indexes = [models.Index(fields=["child", "parent"], name="experiment_edge_child_idx")]


class IntegrityStatusChange(BaseModel):
    """Every change of an experiment's integrity status, with who made it and why (append-only).

    The database refuses an ``Experiment.integrity_status`` change that is not the one the newest
    row here describes, written in the same transaction (migration 0008, ``status_needs_history``).
    """

    experiment = models.ForeignKey(Experiment, on_delete=models.PROTECT, related_name="integrity_changes")
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16, choices=IntegrityStatus.choices)
    actor = models.CharField(max_length=200)
    reason = models.TextField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(actor=""), name="integrity_change_has_actor"),
            models.CheckConstraint(condition=~Q(reason=""), name="integrity_change_has_reason"),
        ]


class Evaluation(UUIDModel):
    """An aggregate score of a checkpoint on a sealed split, with the hashes it verified."""

    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, null=True, blank=True, related_name="evaluations")
    experiment = models.ForeignKey(
        Experiment, on_delete=models.PROTECT, null=True, blank=True, related_name="evaluations"
    )
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="evaluations")
    benchmark = models.ForeignKey("benchmarks.Benchmark", on_delete=models.PROTECT, related_name="evaluations")
    job = models.OneToOneField("jobs.Job", on_delete=models.PROTECT, null=True, blank=True, related_name="evaluation")
    split = models.CharField(max_length=16, choices=Split.choices)
    status = models.CharField(max_length=16, choices=EvaluationStatus.choices, default=EvaluationStatus.OK)
    refusal_reason = models.TextField(blank=True)
    score = models.FloatField(null=True, blank=True)
    correct = models.PositiveIntegerField(default=0)
    sample_count = models.PositiveIntegerField(default=0)
    evaluator_sha256 = models.CharField(max_length=64, blank=True)
    settings_sha256 = models.CharField(max_length=64, blank=True)
    data_sha256 = models.CharField(max_length=64, blank=True)
    backend = models.CharField(max_length=16, default="hf")  # the engine: hf, vllm, vllm-external
    # What ran it: engine, weight_provenance (verified | trusted | unknown), server, startup_seconds,
    # and seeds (run seeds, the succeeded and failed ones, per-seed scores, mean, bootstrap CI).
    inference = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(split__in=Split.values), name="evaluation_split_valid"),
            models.CheckConstraint(
                condition=Q(score__isnull=True) | (Q(score__gte=0) & Q(score__lte=1)), name="evaluation_score_0_1"
            ),
            models.CheckConstraint(
                condition=~Q(status=EvaluationStatus.OK) | Q(score__isnull=False), name="evaluation_ok_has_score"
            ),
            models.CheckConstraint(condition=Q(correct__lte=F("sample_count")), name="evaluation_correct_lte_n"),
        ]


class EvaluationSample(BaseModel):
    """A per-sample result. Sealed: only Reviewers (and evaluation workers) may read these rows."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.PROTECT, related_name="samples")
    sample_id = models.CharField(max_length=100)
    output = models.TextField()
    correct = models.BooleanField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["evaluation", "sample_id"], name="eval_sample_unique")]


class EventChain(BaseModel):
    """The head of one hash chain (one per run, plus ``global``). Locked to append, so chains never fork."""

    key = models.CharField(max_length=64, unique=True)
    head_seq = models.PositiveBigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default="0" * 64)


class EventQuerySet(models.QuerySet["Event"]):
    def sealed(self) -> EventQuerySet:
        """Only events already sealed into their chain: the rows any reader may be shown.

        An unsealed row (committed a moment before the sealer reached it) has no ``seq`` and no
        ``hash`` yet; shown, it would sort first (NULLS FIRST on ``-seq``), page wrongly on
        ``after_seq`` and answer ``seq: null``. It becomes visible, with its final place, once sealed.
        """
        return self.filter(seq__isnull=False)


class Event(models.Model):
    """An append-only, hash-chained record of one state change or tool call.

    Written in two steps so appends never serialise on a lock held through a commit: the row is
    inserted *unsealed* (``hash`` empty) with the caller's transaction, then a sealer assigns
    ``seq``, ``prev_hash`` and ``hash = sha256(prev_hash:seq:content_sha256)`` in batches under
    the chain lock. The database refuses every other UPDATE, any change of content, a
    second sealing, and every DELETE.
    """

    # The parents carry no FOREIGN KEY constraint: each insert's check locked its parent row (FOR
    # KEY SHARE, written to the WAL), and every append of a run locked the same run and chain rows:
    # about 0.1 ms of an agent's 2.3 ms append (docs/benchmarks.md). What they guarded holds without
    # them: runs, chains and experiments are never deleted (the database refuses it), and every
    # insert takes its parent's id from the database (rsiweb_event_append finds or makes the chain).
    chain = models.ForeignKey(EventChain, on_delete=models.PROTECT, related_name="events", db_constraint=False)
    seq = models.PositiveBigIntegerField(null=True, blank=True)  # set when sealed
    run = models.ForeignKey(
        "research.Run", on_delete=models.PROTECT, null=True, blank=True, related_name="events", db_constraint=False
    )
    created_at = models.DateTimeField()
    type = models.CharField(max_length=100)  # dotted: experiment.created, tool.called, ...
    actor = models.CharField(max_length=200)  # worker_0002, user:alice, system
    role = models.CharField(max_length=32)
    tool = models.CharField(max_length=100, blank=True)
    arguments = models.JSONField(default=dict)  # secrets redacted before they get here
    result_ref = models.CharField(max_length=200, blank=True)  # "experiment:<uuid>" etc.
    content_sha256 = models.CharField(max_length=64)  # sha256 of the canonical JSON of the content
    prev_hash = models.CharField(max_length=64, blank=True, default="")
    hash = models.CharField(max_length=64, blank=True, default="")

    objects = EventQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["chain", "seq"], name="event_chain_seq_unique")]
        indexes = [
            models.Index(fields=["run", "seq"], name="event_run_seq_idx"),
            models.Index(fields=["chain", "id"], condition=models.Q(hash=""), name="event_unsealed_idx"),
        ]
