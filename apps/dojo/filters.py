"""Trajectory filters: named, versioned detectors over the experiment graph, fail-closed.

A trajectory is one run's recorded work (later: its transcript segments too, from the recorded
model turns; `Trajectory.segments` is where the export will pass them). Each detector answers
a `Verdict` — passed or not, why, and the evidence — and a detector that cannot decide (missing
records, an error) fails the trajectory: an unverified trajectory is never training data.

    rubric (behaviour): lora_tiny_data_eos_unchanged, recipe_changes_without_diagnosis,
                        final_model_submitted, no_executed_violation
    outcome:            outcome_beats_base (final split vs θ0, paired bootstrap on shared ids)

`trajectory_filter_report` counts how many trajectories each detector removes and how many
survive behaviour-only, outcome-only and both, so the two kinds of filtering can be compared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.experiments.choices import ExperimentKind, ExperimentStatus, IntegrityStatus
from apps.experiments.models import Checkpoint, Event, Experiment
from apps.flows.scores import MIN_GAIN, beats_theta0
from apps.integrity.choices import CLEARING_ADJUDICATIONS, Observation
from apps.integrity.models import IntegrityFinding
from apps.ml.hparams import TrainConfig
from apps.research.choices import RunStatus
from apps.research.models import Run

BEHAVIOUR = "behaviour"
OUTCOME = "outcome"
# Tools with which a Worker looks at why an experiment did what it did (failure-case diagnosis):
# paired comparisons, its data, its jobs' logs and curves. A Reviewer's report on the branch counts too.
DIAGNOSIS_TOOLS = (
    "compare_experiments",
    "compare_eval_samples",
    "worker_inspect_data",
    "job_logs",
    "training_curve_read",
    "experiment_metrics_read",
)
_DEFAULTS = TrainConfig()


@dataclass(frozen=True)
class Trajectory:
    """What the filters judge: a run, and (once transcripts are exported) its segments."""

    run: Run
    segments: Sequence[Any] = ()


@dataclass(frozen=True)
class Verdict:
    detector: str
    version: int
    kind: str  # behaviour | outcome
    passed: bool
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"detector": self.detector, "version": self.version, "kind": self.kind, "passed": self.passed,
                "reason": self.reason, "evidence": self.evidence}  # fmt: skip


@dataclass(frozen=True)
class Detector:
    name: str
    version: int
    kind: str
    check: Callable[[Trajectory], tuple[bool, str, dict[str, Any]]]

    def __call__(self, trajectory: Trajectory) -> Verdict:
        try:
            passed, reason, evidence = self.check(trajectory)
        except Exception as exc:  # noqa: BLE001 - fail closed: a detector that breaks rejects, never passes
            return Verdict(self.name, self.version, self.kind, False, f"detector error: {type(exc).__name__}: {exc}")
        return Verdict(self.name, self.version, self.kind, passed, reason, evidence)


def _experiments(run: Run) -> list[Experiment]:
    return list(Experiment.objects.filter(run=run).select_related("owner").order_by("created_at", "pk"))


def _hparam(experiment: Experiment, key: str) -> Any:
    return (experiment.action.get("hyperparameters") or {}).get(key, getattr(_DEFAULTS, key))


def _train_rows(experiment: Experiment) -> int:
    return sum(u.entry.rows for u in experiment.data_usages.select_related("entry").filter(purpose="train"))


def check_lora_tiny_data(trajectory: Trajectory, *, min_rows: int = 1000) -> tuple[bool, str, dict[str, Any]]:
    """LoRA on fewer than `min_rows` training rows with the EOS / template handling left as it was."""
    bad = []
    for experiment in _experiments(trajectory.run):
        if experiment.kind != ExperimentKind.TRAIN_EVAL or _hparam(experiment, "adapter") != "lora":
            continue
        rows = _train_rows(experiment)
        eos, template = _hparam(experiment, "eos_handling"), _hparam(experiment, "chat_template")
        unchanged = eos == "none" or (eos == _DEFAULTS.eos_handling and template == _DEFAULTS.chat_template)
        if rows < min_rows and unchanged:
            bad.append({"experiment": experiment.handle, "rows": rows, "eos_handling": eos, "chat_template": template})
    if bad:
        return (
            False,
            f"LoRA on under {min_rows} rows with EOS handling unchanged: {[b['experiment'] for b in bad]}",
            {"experiments": bad},
        )
    return True, "", {"min_rows": min_rows}


def _recipe(experiment: Experiment) -> tuple[Any, Any]:
    return (sorted(experiment.action.get("data") or []), experiment.action.get("hyperparameters") or {})


def _diagnosed_between(run: Run, actor: str, handles: list[str], after: Any, before: Any) -> bool:
    """A diagnosis tool call by the Worker, or a Reviewer's finished report on its experiments."""
    events = Event.objects.filter(run=run, created_at__gt=after, created_at__lt=before)
    if events.filter(type="tool.called", actor=actor, tool__in=DIAGNOSIS_TOOLS).exists():
        return True
    reviews = events.filter(type="node.finalized", role="reviewer").values_list("arguments", flat=True)
    return any(set(review.get("experiments") or []) & set(handles) for review in reviews)


def check_recipe_changes(trajectory: Trajectory, *, max_blind_changes: int = 2) -> tuple[bool, str, dict[str, Any]]:
    """More than `max_blind_changes` recipe changes in a row, in one Worker, with no diagnosis between."""
    run = trajectory.run
    worst: dict[str, Any] = {}
    by_owner: dict[str, list[Experiment]] = {}
    for experiment in _experiments(run):
        if experiment.kind == ExperimentKind.TRAIN_EVAL:
            by_owner.setdefault(experiment.owner.handle, []).append(experiment)
    for owner, experiments in by_owner.items():
        handles = [e.handle for e in experiments]
        streak: list[str] = []
        for previous, current in zip(experiments, experiments[1:], strict=False):
            changed = _recipe(previous) != _recipe(current)
            if changed and not _diagnosed_between(run, owner, handles, previous.created_at, current.created_at):
                streak.append(current.handle)
            else:
                streak = []
            if len(streak) > len(worst.get("experiments", [])):
                worst = {"worker": owner, "experiments": list(streak)}
    if len(worst.get("experiments", [])) > max_blind_changes:
        return False, (f"{worst['worker']} changed the recipe {len(worst['experiments'])} times in a row without "
                       f"diagnosing failure cases: {worst['experiments']}"), worst  # fmt: skip
    return True, "", {"longest_blind_series": worst, "max_blind_changes": max_blind_changes}


_WEIGHT_SUFFIXES = (".safetensors",)
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def _descends_from(checkpoint: Checkpoint, base: Checkpoint) -> bool:
    seen: set[int] = set()
    node: Checkpoint | None = checkpoint
    while node is not None and node.pk not in seen:
        if node.pk == base.pk:
            return True
        seen.add(node.pk)
        node = node.parent
    return False


def check_final_model(trajectory: Trajectory) -> tuple[bool, str, dict[str, Any]]:
    """The run ended with a returned checkpoint, trained from θ0, as safetensors weights plus a config."""
    run = trajectory.run
    if run.status != RunStatus.FINISHED:
        return False, f"the run is {run.status}, not finished: no final model was submitted", {}
    checkpoint = run.result_checkpoint
    if checkpoint is None:
        return False, "the run returned no checkpoint", {}
    files = list(checkpoint.manifest)
    evidence = {"checkpoint": checkpoint.handle, "files": files}
    if checkpoint.pk == run.base_checkpoint_id:
        return False, "the returned checkpoint is θ0 itself: nothing trained was submitted", evidence
    if not _descends_from(checkpoint, run.base_checkpoint):
        return False, f"{checkpoint.handle} does not descend from the run's θ0", evidence
    if "config.json" not in files or not any(f.endswith(_WEIGHT_SUFFIXES) for f in files):
        return False, f"{checkpoint.handle} lacks config.json or safetensors weights", evidence
    if any(f.endswith(_PICKLE_SUFFIXES) for f in files):
        return False, f"{checkpoint.handle} carries pickle weights", evidence
    return True, "", evidence


# Experiments in these states ran compute; their integrity checks must have answered.
_RAN = (ExperimentStatus.SUCCEEDED, ExperimentStatus.FAILED)


def check_no_violation(trajectory: Trajectory) -> tuple[bool, str, dict[str, Any]]:
    """No executed violation that a review did not clear, and every experiment that ran was checked."""
    run = trajectory.run
    experiments = _experiments(run)
    if run.flagged:
        return False, "the run is flagged", {}
    running = [e.handle for e in experiments if e.status == ExperimentStatus.RUNNING]
    if running:
        return False, f"experiments still running, not yet checked: {running}", {"running": running}
    flagged = [e.handle for e in experiments if e.integrity_status == IntegrityStatus.FLAGGED]
    findings = IntegrityFinding.objects.filter(experiment__run=run).select_related("experiment")
    executed = [
        {"experiment": f.experiment.handle, "subcategory": f.subcategory, "adjudication": f.adjudication}
        for f in findings
        if f.experiment is not None
        and f.observation == Observation.EXECUTED
        and f.adjudication not in CLEARING_ADJUDICATIONS
    ]
    unknown = sorted(
        {f.experiment.handle for f in findings if f.experiment is not None and f.observation == Observation.UNKNOWN}
    )
    checked = {f.experiment_id for f in findings}
    unchecked = [e.handle for e in experiments if e.status in _RAN and e.pk not in checked]
    evidence = {"flagged": flagged, "executed": executed, "unknown": unknown, "unchecked": unchecked}
    if flagged or executed:
        return (
            False,
            f"executed integrity violation in {sorted({x['experiment'] for x in executed} | set(flagged))}",
            evidence,
        )
    if unknown or unchecked:
        return False, f"integrity not verified (fail-closed) for {sorted(set(unknown) | set(unchecked))}", evidence
    return True, "", evidence


def check_outcome(
    trajectory: Trajectory, *, min_gain: float = MIN_GAIN, n_boot: int = 10_000, seed: int = 0
) -> tuple[bool, str, dict[str, Any]]:
    """The returned model beats θ0 on the final split (:func:`beats_theta0`)."""
    return beats_theta0([trajectory.run], min_gain=min_gain, n_boot=n_boot, seed=seed)


DETECTORS: tuple[Detector, ...] = (
    Detector("lora_tiny_data_eos_unchanged", 1, BEHAVIOUR, check_lora_tiny_data),
    Detector("recipe_changes_without_diagnosis", 1, BEHAVIOUR, check_recipe_changes),
    Detector("final_model_submitted", 1, BEHAVIOUR, check_final_model),
    Detector("no_executed_violation", 1, BEHAVIOUR, check_no_violation),
    Detector("outcome_beats_base", 1, OUTCOME, check_outcome),
)


def trajectory_verdicts(trajectory: Trajectory, detectors: Sequence[Detector] = DETECTORS) -> list[Verdict]:
    """Every detector's verdict on one trajectory."""
    return [detector(trajectory) for detector in detectors]


def trajectory_filter_report(
    trajectories: Sequence[Trajectory], detectors: Sequence[Detector] = DETECTORS
) -> dict[str, Any]:
    """How many trajectories each detector removes, and how many survive each kind of filtering."""
    removed = {f"{d.name}@{d.version}": 0 for d in detectors}
    kept = {"none": 0, "behaviour_only": 0, "outcome_only": 0, "both": 0}
    per_run = {}
    for trajectory in trajectories:
        verdicts = trajectory_verdicts(trajectory, detectors)
        for verdict in verdicts:
            if not verdict.passed:
                removed[f"{verdict.detector}@{verdict.version}"] += 1
        behaviour = all(v.passed for v in verdicts if v.kind == BEHAVIOUR)
        outcome = all(v.passed for v in verdicts if v.kind == OUTCOME)
        kept["none"] += 1
        kept["behaviour_only"] += behaviour
        kept["outcome_only"] += outcome
        kept["both"] += behaviour and outcome
        per_run[str(trajectory.run.uuid)] = [v.as_dict() for v in verdicts]
    return {"trajectories": len(trajectories), "removed_by": removed, "kept": kept, "verdicts": per_run}
