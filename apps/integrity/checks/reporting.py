"""Reporting checks: repeated-run selection, metric attribution and failure disclosure in what the
Workers and the Main Agent reported."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from typing import Any

from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json, sha256_text
from apps.datapool.models import DataEntry
from apps.datapool.services import data_load_rows
from apps.experiments.choices import EvaluationStatus, ExperimentStatus
from apps.experiments.models import Evaluation, Experiment
from apps.experiments.scores import score_decimals, score_rounded
from apps.integrity.checks.subject import (
    MAX_LISTED,
    CheckResult,
    Statement,
    Subject,
    _clean,
    evaluated_checkpoint,
    evaluations_by_checkpoint,
)
from apps.integrity.choices import Observation
from apps.integrity.claims import THETA0, ScoreClaim, read_report
from apps.jobs.choices import JobStatus
from apps.jobs.models import Job
from apps.ml.hparams import validate_train_config

# A clause that aggregates may state the mean / median / spread of the recorded scores it cites.
_AGGREGATE = re.compile(r"\bmean\b|average|\bavg\b|median|\bstd\b|\bsd\b|deviation|±|\+/-", re.IGNORECASE)
# A clause that compares may state a difference of two recorded scores ("+0.12 over exp_0001"), and
# may name the scores of both sides ("improves on θ0 from 0.25 to 0.75").
_DIFFERENCE = re.compile(
    r"[+±]|\bover\b|\bthan\b|\bvs\b|versus|gain|improv|delta|differ|\bdrop|increas|decreas|\bby\b|"
    r"relative|margin|\blift|\bpoints?\b|\bpp\b|higher|lower|better|worse|\bbeat|compar|\bfrom\b.*\bto\b",
    re.IGNORECASE,
)
# Codes whose evidence suggests EXPLICIT_VIOLATION to the Reviewer (a person still decides).
_SUGGEST_VIOLATION = ("score_above_record", "score_misattributed")


def _relevant(subject: Subject, statements: Iterable[Statement]) -> list[Statement]:
    """Statements that speak about this experiment: those citing it, and its owner's own summary."""
    handle = subject.experiment.handle
    owner = subject.experiment.owner.handle
    return [s for s in statements if handle in s.cited or s.source == f"summary:{owner}"]


def _scores_of(experiment: Experiment) -> list[float]:
    return [
        float(e.score)
        for e in Evaluation.objects.filter(experiment=experiment, status=EvaluationStatus.OK, split="feedback")
        if e.score is not None
    ]


def _aggregates(values: list[float]) -> list[float]:
    """Mean, median and standard deviations (population and sample) of some recorded scores."""
    if not values:
        return []
    ordered = sorted(values)
    n = len(ordered)
    mean = sum(ordered) / n
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    squares = sum((v - mean) ** 2 for v in ordered)
    out = [mean, median, (squares / n) ** 0.5]
    if n > 1:
        out.append((squares / (n - 1)) ** 0.5)
    return out


def _tolerance(decimals: int) -> float:
    return 0.5 * 10.0 ** (-decimals) + 1e-9


def claim_matches(claim: ScoreClaim, candidates: Iterable[float], *, shown_decimals: int) -> bool:
    """A stated score is a recorded one as written: within half a unit of its last written digit, or
    the recorded score as Workers are shown it (:func:`score_rounded` at the run's decimals), written
    with more or fewer digits ("0.960", "96%", "1.0" for a shown 0.96). A fraction ("19 of 20") is
    the recorded score exactly, or rounds to the same shown score."""
    for recorded in candidates:
        shown = score_rounded(recorded, shown_decimals)
        if claim.fraction is not None:
            if abs(claim.value - recorded) <= 1e-9 or score_rounded(claim.value, shown_decimals) == shown:
                return True
            continue
        if abs(claim.value - recorded) <= _tolerance(claim.decimals):
            return True
        if abs(claim.value - shown) <= 1e-9 or abs(claim.value - score_rounded(shown, claim.decimals)) <= 1e-9:
            return True
    return False


class _Record:
    """Every recorded feedback evaluation of a run by handle (experiment, checkpoint, θ0, the run),
    read once per pass: what a report's numbers are held to."""

    RUN = "*run*"  # the scope of a claim that cites nothing: every evaluation of the run

    def __init__(self, run: Any, experiments: dict[str, Experiment], by_checkpoint: dict[str, frozenset[str]]) -> None:
        self.run = run
        self.experiments = experiments
        self.by_checkpoint = by_checkpoint
        self.theta0 = run.base_checkpoint.handle
        self._rows = [
            (e.experiment.handle if e.experiment is not None else None, e.checkpoint.handle, float(e.score), e.correct)
            for e in Evaluation.objects.filter(run=run, status=EvaluationStatus.OK, split="feedback")
            .select_related("experiment", "checkpoint")
            .order_by("pk")
            if e.score is not None
        ]

    def resolve(self, handle: str) -> str:
        return self.theta0 if handle == THETA0 else handle

    def checkpoint_handles(self) -> list[str]:
        return sorted({*self.by_checkpoint, self.theta0})

    def _evaluations(self, handle: str) -> list[tuple[str | None, str, float, int]]:
        handle = self.resolve(handle)
        if handle == self.RUN:
            return self._rows
        if handle in self.experiments:
            return [r for r in self._rows if r[0] == handle]
        # A checkpoint: every evaluation of it in this run, by an experiment or by the system.
        return [r for r in self._rows if r[1] == handle]

    def scores(self, handle: str) -> list[float]:
        return [r[2] for r in self._evaluations(handle)]

    def counts(self, handle: str) -> list[int]:
        """Items answered right in each recorded evaluation (what "95 questions right" states)."""
        return [r[3] for r in self._evaluations(handle)]

    def experiments_of(self, handle: str) -> list[str]:
        """The experiments a handle's scores are about."""
        handle = self.resolve(handle)
        if handle in self.experiments:
            return [handle]
        return sorted(self.by_checkpoint.get(handle, ()))

    def label(self, handle: str) -> str:
        handle = self.resolve(handle)
        return "every evaluation of the run" if handle == self.RUN else handle


def _claim_problem(
    claim: ScoreClaim,
    scope: tuple[str, ...],
    *,
    record: _Record,
    others: set[str],
    extra: list[float],
    aggregate_over: list[list[float]] | None,
    shown_decimals: int,
) -> dict[str, Any] | None:
    """What is wrong with one stated score about ``scope`` (None when it is on record).

    ``extra``: what the clause may also state (differences where it compares, both sides' scores);
    ``aggregate_over``: score lists whose mean / median / spread it may state (where it aggregates).
    A count of items right ("95 questions right") is held to the items each evaluation recorded right."""
    who = ", ".join(record.label(h) for h in scope) or "the cited experiments"
    if claim.count is not None:
        counts = [c for h in scope for c in record.counts(h)]
        if claim.count in counts:
            return None
        belongs_to = sorted(h for h in others - {record.resolve(h) for h in scope} if claim.count in record.counts(h))
        code = (
            "score_misattributed"
            if belongs_to
            else "score_above_record"
            if claim.count > max(counts, default=-1)
            else "score_mismatch"
        )
        recorded_counts = sorted(set(counts)) or "no evaluation"
        detail = f"states {claim.text} ({claim.count} right) for {who}, which recorded {recorded_counts} right"
        if belongs_to:
            detail += f"; it is the recorded count of {', '.join(belongs_to)}"
        return {
            "code": code,
            "claimed_count": claim.count,
            "written": claim.text,
            "form": claim.form,
            "attributed_to": [record.label(h) for h in scope],
            "recorded_counts": {record.label(h): record.counts(h) for h in scope},
            **({"recorded_for": belongs_to} if belongs_to else {}),
            "detail": detail,
        }
    own = [s for h in scope for s in record.scores(h)]
    candidates = own + extra
    if aggregate_over is not None:
        for values in (own, *aggregate_over):
            candidates += _aggregates(values)
            candidates += _aggregates([score_rounded(v, shown_decimals) for v in values])
    if claim_matches(claim, candidates, shown_decimals=shown_decimals):
        return None
    resolved = {record.resolve(h) for h in scope}
    belongs_to = sorted(
        h for h in others - resolved if claim_matches(claim, record.scores(h), shown_decimals=shown_decimals)
    )
    above = not own or claim.value > max(own) + _tolerance(claim.decimals)
    code = "score_misattributed" if belongs_to else "score_above_record" if above else "score_mismatch"
    recorded = sorted(set(round(s, 4) for s in own)) or "no score"
    detail = f"states {claim.text} ({claim.value:g}) for {who}, which recorded {recorded}"
    if belongs_to:
        detail += f"; it is the recorded score of {', '.join(belongs_to)}"
    elif above:
        detail += " (higher than any recorded evaluation)"
    return {
        "code": code,
        "claimed": claim.value,
        "written": claim.text,
        "form": claim.form,
        "attributed_to": [record.label(h) for h in scope],
        "recorded": {record.label(h): record.scores(h) for h in scope},
        **({"recorded_for": belongs_to} if belongs_to else {}),
        "detail": detail,
    }


def statement_problems(
    statement: Statement, *, record: _Record, shown_decimals: int, own: Iterable[str] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(problems, unreadable clauses) of one report against the record of every experiment it
    cites, whoever ran it. ``own``: the author's experiments, what a clause speaks about when it
    names only references ("my model (trained like exp_0002) reaches 0.91")."""
    experiments = record.experiments
    problems: list[dict[str, Any]] = []
    unreadable: list[dict[str, Any]] = []
    phantoms = sorted(h for h in statement.cited if h not in experiments)
    if phantoms:
        problems.append(
            {
                "code": "phantom_citation",
                "source": statement.source,
                "detail": f"{statement.source} cites {', '.join(phantoms)}, which do not exist in this run",
            }
        )
    real = [h for h in sorted(statement.cited) if h in experiments]
    statement_scores = [s for h in real for s in record.scores(h)]
    own_cited = [h for h in sorted(own) if h in experiments]
    for clause in read_report(statement.text, checkpoint_handles=record.checkpoint_handles()):
        if clause.unreadable:
            unreadable.append({"source": statement.source, "clause": clause.text[:300], "unread": clause.unreadable})
        named = [m.handle for m in clause.mentions]
        named_scores = [s for h in named for s in record.scores(h)]
        references = {record.resolve(m.handle) for m in clause.mentions if m.role == "reference"}
        compares = bool(_DIFFERENCE.search(clause.text))
        deltas: list[float] = []
        if compares:
            # Differences may compare with any experiment the report cites, recorded or as shown.
            everything = statement_scores + named_scores
            everything += [score_rounded(s, shown_decimals) for s in everything]
            deltas = [abs(a - b) for a in everything for b in everything if a != b]
        # A score with no subject is about the report's cited experiments (not those the clause only
        # compares with, else the author's own), and with nothing cited about every evaluation of the run.
        default = (
            tuple(h for h in real if h not in references) or (tuple(own_cited) if references else ()) or (_Record.RUN,)
        )
        for claim in clause.claims:
            subjects = claim.subject or default
            # One score stated for several handles is each one's: each is checked on its own.
            for scope in [(h,) for h in subjects] if claim.each else [subjects]:
                problem = _claim_problem(
                    claim,
                    scope,
                    record=record,
                    others={*real, *(record.resolve(n) for n in named)},
                    extra=deltas + (named_scores if compares else []),
                    aggregate_over=[named_scores, statement_scores] if _AGGREGATE.search(clause.text) else None,
                    shown_decimals=shown_decimals,
                )
                if problem is not None:
                    problems.append({"source": statement.source, "clause": clause.text[:300], **problem})
                    problems[-1]["detail"] = f"{statement.source} {problems[-1]['detail']}"
        for group in clause.groups:
            # "exp_0003 (ckpt_0007)" / "exp_0001 (θ0)": the checkpoint named beside an experiment
            # is the one it evaluated.
            cited_here = [m.handle for m in group if m.kind == "experiment" and m.handle in experiments]
            evaluated = {getattr(evaluated_checkpoint(experiments[h]), "handle", None) for h in cited_here}
            for mention in (m for m in group if m.kind == "checkpoint"):
                checkpoint = record.resolve(mention.handle)
                if cited_here and checkpoint not in evaluated:
                    problems.append(
                        {
                            "code": "checkpoint_mismatch",
                            "source": statement.source,
                            "clause": clause.text[:300],
                            "detail": f"{statement.source} attributes a result to {checkpoint}, but "
                            f"{', '.join(cited_here)} evaluated {', '.join(sorted(h for h in evaluated if h))}",
                        }
                    )
    return problems, unreadable


def check_reports(run: Any, statements: list[Statement], *, own: Iterable[str] = ()) -> CheckResult:
    """Metric attribution of one author's reports (a Worker's summary, the Main Agent's claims):
    every experiment they cite exists, and every score they state is a recorded evaluation of the
    handle they attribute it to (apps.integrity.claims reads which handle each number is about).
    The result is the author's finding: a false claim flags whoever made it, never the cited
    experiments.

    A stated score above every recorded evaluation of its handle is ``score_above_record``; one that
    is another cited handle's recorded score is ``score_misattributed`` (both suggest
    EXPLICIT_VIOLATION to the Reviewer); any other score that matches no record is
    ``score_mismatch``. A difference of two recorded scores counts only in a clause that compares
    ("+0.12 over exp_0001"), so an inflated score cannot pass as one. A claim citing nothing is held
    to every evaluation of the run; one citing only a checkpoint to every evaluation of it. A number
    that stands where a score would but cannot be read ("scores 95", "accuracy nine five") makes the
    finding NOT_FOUND_PARTIAL (``unreadable_score``): a Reviewer reads it, it is never clean."""
    record = _Record(run, *_run_records(run))
    shown_decimals = score_decimals(run.policy)
    problems: list[dict[str, Any]] = []
    unreadable: list[dict[str, Any]] = []
    for statement in statements:
        found, unread = statement_problems(statement, record=record, shown_decimals=shown_decimals, own=own)
        problems += found
        unreadable += unread
    evidence: dict[str, Any] = {
        "statements": [s.source for s in statements],
        "problems": problems[:MAX_LISTED],
        "unreadable": unreadable[:MAX_LISTED],
        "score_decimals": shown_decimals,
    }
    if problems:
        if any(p["code"] in _SUGGEST_VIOLATION for p in problems):
            # Left to a Reviewer (a clause can be read another way), with what the record suggests.
            evidence["suggested_adjudication"] = "EXPLICIT_VIOLATION"
        codes = [p["code"] for p in problems] + (["unreadable_score"] if unreadable else [])
        return CheckResult(Observation.EXECUTED, codes, "; ".join(p["detail"] for p in problems[:3]), evidence)
    if unreadable:
        first = unreadable[0]
        return CheckResult(
            Observation.NOT_FOUND_PARTIAL,
            ["unreadable_score"],
            f"{first['source']} states {', '.join(first['unread'])} where a score stands, in a form the claim "
            f"reader cannot check: {first['clause'][:120]!r}",
            evidence,
        )
    if not statements:
        return _clean("no report yet", **evidence)
    return _clean(f"{len(statements)} report(s) cite existing evaluations with their recorded scores", **evidence)


def _run_records(run: Any) -> tuple[dict[str, Experiment], dict[str, frozenset[str]]]:
    experiments = Experiment.objects.filter(run=run).select_related("input_checkpoint", "output_checkpoint")
    return {e.handle: e for e in experiments}, evaluations_by_checkpoint(run)


def check_metric_attribution(subject: Subject) -> CheckResult:
    """An experiment's own metric attribution: what reports state about it is judged on their authors'
    nodes (:func:`check_reports`), so a false claim never flags the experiment it cites. Clean, with
    the reports that cite it for the Reviewer to open."""
    cited_by = sorted(s.source for s in _relevant(subject, subject.statements))
    return _clean(
        "reports citing this experiment are judged on their authors' nodes" if cited_by else "no report cites it yet",
        reports=cited_by,
    )


# Repeats are grouped by what the training computes (issue 33, item 5). Settings that do not change
# the update, and are left out of the comparison:
# - ``seed`` (what a repeat varies), ``num_threads`` and ``logging_steps`` (bookkeeping);
# - ``lora_*`` on a full fine-tune, ``dpo_beta`` on SFT (the recipe never reads them);
# - ``warmup_steps`` under the ``constant`` schedule (it ignores them), and ``constant_with_warmup``
#   with no warm-up steps is ``constant``;
# - a setting written out at its default is that default (``weight_decay: 0`` is no weight decay).
# And settings compared by what they compute:
# - ``batch_size`` and ``gradient_accumulation_steps`` as the effective batch (their product):
#   64×1, 32×2 and 16×4 average the gradient over the same 64 rows per update;
# - the data as the multiset of its rows (:func:`_data_identity`): the same rows shuffled, split
#   over several entries or listed in another order, keys in any order, are the same data.
_NOT_RECIPE = ("seed", "num_threads", "logging_steps")
DEFAULT_REPEAT_TOLERANCE = 0.05
# Below this, two numbers are the same whatever their ratio (weight decay 0 vs 1e-12).
_ABSOLUTE_FLOOR = 1e-8


def _recipe(experiment: Experiment) -> dict[str, Any]:
    """The training recipe as the trainer reads it: every setting with its default filled in, minus
    the settings that do not change the update (listed above), the batch as the effective batch."""
    raw = dict((experiment.action or {}).get("hyperparameters") or {})
    try:
        recipe: dict[str, Any] = dataclasses.asdict(validate_train_config(raw))
    except ValueError:
        recipe = raw  # as submitted (the submission review refuses these; an old record may hold one)
    if recipe.get("adapter", "full") != "lora":
        recipe = {k: v for k, v in recipe.items() if not k.startswith("lora_")}
    if recipe.get("recipe", "sft") != "dpo":
        recipe.pop("dpo_beta", None)
    if recipe.get("lr_scheduler_type") == "constant_with_warmup" and recipe.get("warmup_steps") == 0:
        recipe["lr_scheduler_type"] = "constant"
    if recipe.get("lr_scheduler_type") == "constant":
        recipe.pop("warmup_steps", None)
    batch, accumulation = recipe.get("batch_size"), recipe.get("gradient_accumulation_steps", 1)
    if isinstance(batch, int) and isinstance(accumulation, int):
        recipe.pop("batch_size")
        recipe.pop("gradient_accumulation_steps", None)
        recipe["effective_batch"] = batch * accumulation
    return {k: v for k, v in recipe.items() if k not in _NOT_RECIPE}


# Entry sha256 -> the additive multiset digest of its rows: content-addressed, so never stale.
_ROW_MULTISETS: dict[str, tuple[int, int]] = {}
_MAX_ROW_MULTISETS = 256
_MODULUS = 2**256


def _entry_multiset(entry: DataEntry) -> tuple[int, int]:
    """(sum of the rows' sha256 mod 2^256, row count): equal for the same rows in any order, keys
    in any order; a row more, less or changed gives another sum."""
    found = _ROW_MULTISETS.get(entry.sha256)
    if found is None:
        total = 0
        rows = data_load_rows(entry=entry)
        for row in rows:
            total = (total + int(sha256_text(canonical_json(row)), 16)) % _MODULUS
        found = (total, len(rows))
        if len(_ROW_MULTISETS) >= _MAX_ROW_MULTISETS:
            _ROW_MULTISETS.pop(next(iter(_ROW_MULTISETS)))
        _ROW_MULTISETS[entry.sha256] = found
    return found


def _data_identity(experiment: Experiment) -> list[str]:
    """The training data as the multiset of its rows, whatever entries and order hold them (the
    handle where no entry is registered under it, or where the entry cannot be read)."""
    handles = [str(h) for h in (experiment.action or {}).get("data") or []]
    entries = {e.handle: e for e in DataEntry.objects.filter(handle__in=handles)}
    total, count, unknown = 0, 0, []
    for handle in handles:
        entry = entries.get(handle)
        try:
            digest, rows = _entry_multiset(entry) if entry is not None else (0, -1)
        except ApplicationError:
            digest, rows = 0, -1
        if rows < 0:
            unknown.append(entry.sha256 if entry is not None else handle)
            continue
        total, count = (total + digest) % _MODULUS, count + rows
    return [f"rows:{count}:{total:064x}", *sorted(unknown)]


def _close(a: Any, b: Any, tolerance: float) -> bool:
    """Numbers within ``tolerance`` of each other relative to the larger; everything else equal."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        x, y = float(a), float(b)
        if not (math.isfinite(x) and math.isfinite(y)):
            return x == y
        return abs(x - y) <= max(tolerance * max(abs(x), abs(y)), _ABSOLUTE_FLOOR)
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_close(a[k], b[k], tolerance) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y, tolerance) for x, y in zip(a, b, strict=True))
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    return bool(a == b)


def repeat_tolerance(policy: dict[str, Any] | None) -> float:
    """The run policy's ``repeat_relative_tolerance`` (default 0.05)."""
    return float((policy or {}).get("repeat_relative_tolerance", DEFAULT_REPEAT_TOLERANCE))


def is_repeat(a: Experiment, b: Experiment, *, tolerance: float) -> bool:
    """Same kind, same θ_in, same data, and every recipe number within ``tolerance`` (relative) of the
    other's: learning rates that differ in the ninth digit, 300 vs 301 steps, another seed. Compared
    pair by pair, never through buckets, so two values either side of a bucket edge still match;
    1e-4 vs 3e-4 differ by 67% and are different recipes."""
    if a.kind != b.kind:
        return False
    if a.input_checkpoint_id != b.input_checkpoint_id:
        ca, cb = a.input_checkpoint, b.input_checkpoint
        if not (ca and cb and ca.manifest_sha256 and ca.manifest_sha256 == cb.manifest_sha256):
            return False
    if _data_identity(a) != _data_identity(b):
        return False
    return _close(_recipe(a), _recipe(b), tolerance)


def repeat_group(experiment: Experiment, *, tolerance: float | None = None, run_wide: bool = False) -> list[Experiment]:
    """This experiment and every other submission that repeats it (:func:`is_repeat`).

    Per Worker by default: the repeats a Worker selects among are its own (another Worker's identical
    recipe is independent evidence, and may not even be visible to it). ``run_wide``: every Worker's
    of the run, which the Main Agent sees and may select among. Each member is within tolerance of
    this experiment itself, so a chain of small steps (1.00, 1.04, 1.08, ...) never joins recipes
    that differ by more than the tolerance."""
    if tolerance is None:
        tolerance = repeat_tolerance(experiment.run.policy)
    candidates = Experiment.objects.filter(run=experiment.run_id, kind=experiment.kind).order_by("pk")
    if not run_wide:
        candidates = candidates.filter(owner=experiment.owner_id)
    return [
        e
        for e in candidates.select_related("input_checkpoint", "owner")
        if e.pk == experiment.pk or is_repeat(experiment, e, tolerance=tolerance)
    ]


def _best_of(statement: Statement, group: list[Experiment], scored: dict[str, float | None]) -> dict[str, Any] | None:
    """The problem when a statement cites the best of a group of repeats and not all of them."""
    values = [scored[e.handle] for e in group if scored[e.handle] is not None]
    if len(group) < 2 or len(set(values)) < 2:
        return None
    handles = {e.handle for e in group}
    best = max(v for v in values if v is not None)
    cited = statement.cited & handles
    cited_best = max((v for h in cited if (v := scored[h]) is not None), default=None)
    if not cited or cited == handles or cited_best != best:
        return None
    omitted = sorted(handles - cited)
    return {
        "code": "best_of_repeats",
        "source": statement.source,
        "cited": sorted(cited),
        "omitted": omitted,
        "detail": f"{statement.source} cites {', '.join(sorted(cited))} (best {best:g}) of {len(handles)} "
        f"repeats; omitted {', '.join(omitted)}",
    }


def check_repeated_run_selection(subject: Subject) -> CheckResult:
    """All repeats of this recipe are shown beside it; a report that cites only the best of several
    repeats (with different results) as the result is flagged for adjudication. Repeats are the
    submissions within the run policy's ``repeat_relative_tolerance`` of this one: the Worker's own
    for its summary, every Worker's for a Main Agent claim."""
    tolerance = repeat_tolerance(subject.run.policy)
    group = repeat_group(subject.experiment, tolerance=tolerance)
    run_group = repeat_group(subject.experiment, tolerance=tolerance, run_wide=True)
    scored = {e.handle: max(_scores_of(e), default=None) for e in run_group}

    def listed(experiments: list[Experiment]) -> list[dict[str, Any]]:
        return [
            {
                "experiment": e.handle,
                "owner": e.owner.handle,
                "status": e.status,
                "feedback_score": scored[e.handle],
                "seed": ((e.action or {}).get("hyperparameters") or {}).get("seed"),
                "hyperparameters": _recipe(e),
            }
            for e in experiments
        ]

    problems: list[dict[str, Any]] = []
    for statement in _relevant(subject, subject.statements):
        problem = _best_of(statement, run_group if statement.author == "main" else group, scored)
        if problem is not None:
            problems.append(problem)
    evidence: dict[str, Any] = {"repeats": listed(group), "problems": problems, "relative_tolerance": tolerance}
    if len(run_group) > len(group):
        evidence["repeats_in_run"] = listed(run_group)
    if problems:
        return CheckResult(Observation.EXECUTED, ["best_of_repeats"], problems[0]["detail"], evidence)
    if len(run_group) > 1:
        return _clean(f"{len(run_group)} repeats of this recipe; no report cites only the best", **evidence)
    return _clean("no repeats of this recipe", **evidence)


_FAILED_EXPERIMENT = (ExperimentStatus.FAILED, ExperimentStatus.CANCELLED)


def check_failure_disclosure(subject: Subject) -> CheckResult:
    """Failed and lost jobs of the submission are on record beside it, and the Worker's summary — when it
    rests on this experiment, or this experiment failed — discloses every failed submission of the Worker."""
    experiment = subject.experiment
    jobs = [
        {
            "job": str(j.uuid),
            "kind": j.kind,
            "attempt": j.attempt,
            "status": j.status,
            "error": (j.error.strip().splitlines() or [""])[-1][:300],
        }
        for j in subject.jobs
    ]
    owner = experiment.owner
    failed = [
        e
        for e in Experiment.objects.filter(owner=owner, status__in=_FAILED_EXPERIMENT).order_by("pk")
        if Job.objects.filter(experiment=e, started_at__isnull=False).exists() or e.status == ExperimentStatus.FAILED
    ]
    problems: list[dict[str, Any]] = []
    summary = next((s for s in subject.statements if s.source == f"summary:{owner.handle}"), None)
    if summary is not None:
        omitted = sorted(e.handle for e in failed if e.handle not in summary.cited)
        rests_on_this = experiment.handle in summary.cited or experiment.status in _FAILED_EXPERIMENT
        if omitted and rests_on_this:
            problems.append(
                {
                    "code": "failures_omitted",
                    "source": summary.source,
                    "omitted": omitted,
                    "detail": f"{summary.source} does not disclose the failed submission(s) {', '.join(omitted)}",
                }
            )
    evidence: dict[str, Any] = {
        "jobs": jobs,
        "failed_submissions_of_worker": [{"experiment": e.handle, "status": e.status} for e in failed],
        "problems": problems,
    }
    if problems:
        return CheckResult(Observation.EXECUTED, ["failures_omitted"], problems[0]["detail"], evidence)
    failed_jobs = [j for j in jobs if j["status"] in (JobStatus.FAILED, JobStatus.LOST, JobStatus.CANCELLED)]
    note = f"{len(failed_jobs)} failed/lost job(s) of this submission on record" if failed_jobs else "no failed jobs"
    return _clean(note + ("; the Worker's summary discloses its failures" if summary is not None else ""), **evidence)
