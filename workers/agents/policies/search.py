"""The Main Agent's search policy: a named, swappable part (issue 32), apart from the operators.

The operators (continue, verify, branch, revise: what a Worker is asked to do) live in the Main
heuristic; this module decides *where* to spend: which line of the research DAG to expand, and
which of the follow-ups the Worker cap and the budget can take. It sees only evidence an agent
learns through its tools (scores, training curves, review reports, the quota), never a profile,
dataset or seed.

Two policies, selected per run (``Run.search_policy``, ``start_run --search-policy``):

- ``greedy``: expand the best-scoring line; rank follow-ups by expected gain per share of what is
  left (no exploration bonus). The behaviour the heuristic always had, with its ties and cap now
  broken by value instead of by the order the follow-ups were written in.
- ``uct``: UCB1 over the lines (mean score plus ``c·sqrt(ln N / n)``, N results in the run, n the
  line's own results and follow-ups), with stagnation detection: a line whose last follow-up did not
  improve it by ``STAGNATION_EPSILON`` is not expanded again, and its uncertainty counts for
  branching instead. Follow-ups are ranked with the uncertainty as an exploration bonus.

Both rank follow-ups with the same explicit rule (:func:`follow_up_value`): ``value = (gain +
explore · uncertainty) / share``, where ``share`` is the larger of the accelerator and wall seconds
it costs over what is left of each; a follow-up that cannot finish before either runs out is worth
0. A review's diagnosis weighs by the evidence it cites (:func:`diagnosis_weight`); one that the
measured training curve contradicts is discounted, and the record says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

SEARCH_POLICIES = ("greedy", "uct")
DEFAULT_SEARCH_POLICY = "greedy"
# A loss that fell by this fraction over the last half of a training is still "falling steeply":
# more of the same training is the first explanation of wrong answers, not the data.
STEEP_LOSS_DROP = 0.15
# A follow-up that improved its line by less than this is stagnation (feedback-score units).
STAGNATION_EPSILON = 0.01
UCT_C = 0.5
KIND_ORDER = ("revise", "continue", "verify", "branch")


# --- evidence ------------------------------------------------------------------------------------


def loss_drop(points: list[dict[str, Any]]) -> float | None:
    """The relative fall of the training loss over the last half of a curve (``training_curve_read``
    points); None when the curve has fewer than four loss points."""
    losses = [float(p["metrics"]["loss"]) for p in points if "loss" in (p.get("metrics") or {})]
    if len(losses) < 4:
        return None
    mid = losses[len(losses) // 2 - 1 : len(losses) // 2 + 1]
    tail = losses[-max(1, len(losses) // 8) :]
    start, end = sum(mid) / len(mid), sum(tail) / len(tail)
    if start <= 0:
        return 0.0
    return round(max(0.0, (start - end) / start), 4)


_CITED_RE = re.compile(r"(\d+) of (\d+) wrong feedback outputs")


@dataclass(frozen=True)
class Weighed:
    """A review diagnosis as weighed: 0..1, and why (goes into the decision record)."""

    weight: float
    note: str


def diagnosis_weight(report: dict[str, Any], kind: str, curve_drop: float | None) -> Weighed:
    """How much a review's ``kind`` diagnosis (``content`` | ``run_on``) counts.

    By the evidence it cites: the per-sample counts it names (``k of n wrong feedback outputs``),
    ``n / (n + 10)`` of full weight (no counts: a quarter). A ``content`` reading ("too little training
    or wrong labels") is discounted to a quarter when the measured loss was still falling steeply at
    the end of the training: too little training then explains the errors without the data.
    """
    lines = [*report.get("findings", []), *report.get("supported_findings", []), *report.get("uncertainties", [])]
    cited = [(int(k), int(n)) for line in lines for k, n in _CITED_RE.findall(str(line))]
    samples = sum(n for _, n in cited)
    weight = samples / (samples + 10) if samples else 0.25
    note = (f"cites {samples} per-sample outputs" if samples else "cites no per-sample evidence") + \
        f": weight {weight:.2f}"  # fmt: skip
    if kind == "content" and curve_drop is not None and curve_drop >= STEEP_LOSS_DROP:
        weight *= 0.25
        note += (f"; discounted to {weight:.2f}: contradicted by the measured curve — the loss still fell "
                 f"{curve_drop:.0%} over the last half of the best training, so too little training explains "
                 "the wrong answers before the data does")  # fmt: skip
    return Weighed(round(weight, 3), note)


@dataclass
class Budget:
    """What is left, and what one follow-up has cost so far (measured on this run's Workers)."""

    accel_left: float
    wall_left: float
    accel_per_line: float
    wall_per_line: float

    @classmethod
    def from_quota(cls, quota: dict[str, Any], *, lines_spawned: int, line_walls: list[float]) -> Budget:
        accel = quota.get("accelerator_seconds") or {}
        wall = quota.get("wall_clock_seconds") or {}
        used = float(accel.get("used", 0.0))
        elapsed = float(wall.get("elapsed", 0.0))
        return cls(
            accel_left=float(accel.get("left", 0.0)),
            wall_left=float(wall.get("left", 0.0)),
            accel_per_line=used / lines_spawned if lines_spawned and used > 0 else 0.0,
            wall_per_line=(sum(line_walls) / len(line_walls)) if line_walls else elapsed,
        )


@dataclass
class FollowUp:
    """One follow-up the Main Agent could start: its operator and the evidence for its value."""

    kind: str  # continue | verify | branch | revise
    direction: str  # the Worker direction it becomes
    subject: str | None  # the line (Worker handle) it builds on
    gain: float  # expected feedback-score gain
    uncertainty: float  # how far that estimate may be off (same units)
    cost_scale: float = 1.0  # its cost relative to an average line so far
    mandatory: bool = False  # integrity first: a protocol violation's revise takes the first free slot
    why: str = ""
    spec: dict[str, Any] = field(default_factory=dict)  # what _follow_up needs (search, rationale)
    value: float = 0.0
    explain: str = ""


def follow_up_value(item: FollowUp, budget: Budget, explore: float) -> tuple[float, str]:
    """``(gain + explore · uncertainty) / share``; 0 when it cannot finish within what is left."""
    accel = budget.accel_per_line * item.cost_scale
    wall = budget.wall_per_line * item.cost_scale
    shares = [accel / budget.accel_left if budget.accel_left > 0 else math.inf,
              wall / budget.wall_left if budget.wall_left > 0 else math.inf]  # fmt: skip
    share = max(shares)
    text = (f"gain {item.gain:.3f} ± {item.uncertainty:.3f}, cost ~{accel:.0f} accelerator-s / {wall:.0f} wall-s "
            f"of {budget.accel_left:.0f} / {budget.wall_left:.0f} left")  # fmt: skip
    if share > 1:
        return 0.0, text + ": cannot finish before the budget ends, value 0"
    value = (item.gain + explore * item.uncertainty) / max(share, 0.05)
    return round(value, 4), text + f" (share {share:.2f}): value {value:.3f}"


# --- the lines of the DAG ------------------------------------------------------------------------


@dataclass
class Line:
    """A Worker with a result, as the search policy sees it."""

    handle: str
    score: float
    children: int = 0  # follow-ups spawned from it
    stagnant: bool = False


def lines_of(workers: dict[str, dict[str, Any]]) -> list[Line]:
    """The Main's Worker records as lines: scored Workers, their follow-up counts and stagnation.

    A line is stagnant when a finished follow-up of it (a continuation or replicate) did not beat it
    by ``STAGNATION_EPSILON``; so is that follow-up (the same line, continued without gain). A
    follow-up that beat it is its own live line from then on.
    """
    scored = {h: w["best"]["score"] for h, w in workers.items()
              if w.get("best") and w["best"].get("score") is not None}  # fmt: skip
    lines = {h: Line(h, float(s)) for h, s in scored.items()}
    for handle, worker in workers.items():
        parent = worker.get("parent")
        if parent in lines:
            lines[parent].children += 1
            if handle in scored and worker.get("status") != "active" and \
                    scored[handle] < scored[parent] + STAGNATION_EPSILON:  # fmt: skip
                lines[parent].stagnant = True
                lines[handle].stagnant = True
    return sorted(lines.values(), key=lambda line: (-line.score, line.handle))


# --- the policies -----------------------------------------------------------------------------------


class GreedyPolicy:
    name = "greedy"
    explore = 0.0

    def choose_line(self, lines: list[Line]) -> tuple[Line | None, str]:
        """The line to build on next, and why (the decision record's "why this node")."""
        if not lines:
            return None, "no line has a result yet"
        top = lines[0]
        return top, f"why this node [greedy]: {top.handle} has the best feedback score ({top.score:.3f})"

    def rank(self, items: list[FollowUp], budget: Budget) -> list[FollowUp]:
        """The follow-ups by value, highest first (mandatory ones ahead); each gets its explanation."""
        for item in items:
            item.value, item.explain = follow_up_value(item, budget, self.explore)
        return sorted(items, key=lambda i: (not i.mandatory, -i.value, KIND_ORDER.index(i.kind), i.direction))


class UCTPolicy(GreedyPolicy):
    name = "uct"
    explore = UCT_C

    def choose_line(self, lines: list[Line]) -> tuple[Line | None, str]:
        live = [line for line in lines if not line.stagnant]
        if not live:
            stalled = ", ".join(line.handle for line in lines) or "none"
            return None, f"why this node [uct]: every line is stagnant ({stalled}); explore a new branch instead"
        total = sum(1 + line.children for line in lines)
        top = max(live, key=lambda line: (self.ucb(line, total), -len(line.handle), line.handle))
        bonus = self.ucb(top, total) - top.score
        skipped = [line.handle for line in lines if line.stagnant]
        text = (f"why this node [uct]: {top.handle} has the highest upper confidence bound "
                f"{top.score:.3f} + {bonus:.3f} ({1 + top.children} of {total} visits)")  # fmt: skip
        if skipped:
            text += f"; stagnant, not expanded: {', '.join(skipped)}"
        return top, text

    def ucb(self, line: Line, total: int) -> float:
        return line.score + UCT_C * math.sqrt(math.log(max(total, 1) + 1) / (1 + line.children))


def search_policy(name: str | None) -> GreedyPolicy:
    """The named policy (``greedy`` when none is named); a ValueError for an unknown name."""
    policies: dict[str, type[GreedyPolicy]] = {"greedy": GreedyPolicy, "uct": UCTPolicy}
    chosen = policies.get(name or DEFAULT_SEARCH_POLICY)
    if chosen is None:
        raise ValueError(f"no search policy {name!r} (one of {', '.join(SEARCH_POLICIES)})")
    return chosen()


def size_next_job(
    *,
    planned_steps: int,
    last_steps: int,
    last_hardware: dict[str, Any] | None,
    accelerator_left_seconds: float,
    batch_size: int,
) -> tuple[dict[str, int], str]:
    """How big the next training of a line may be, from its last job's hardware (issue 37).

    ``last_hardware`` is the ``summary`` of the ``job_hardware`` tool for the line's last training.
    Its runtime per step predicts the next job's runtime: steps are cut so it takes at most a
    third of the accelerator time left (never under 10). Its memory decides the batch: halved
    after an out-of-memory failure or a peak above 90 % of a device's memory. Returns the recipe
    changes (empty: as planned) and the reason, for the decision record.
    """
    if not last_hardware:
        return {}, "no hardware evidence for the last job: as planned"
    changes: dict[str, int] = {}
    reasons = []
    runtime = last_hardware.get("runtime_seconds")
    if runtime and last_steps > 0 and accelerator_left_seconds > 0:
        per_step = float(runtime) / last_steps
        allowed = int(accelerator_left_seconds / 3 / per_step)
        if planned_steps * per_step > accelerator_left_seconds / 3:
            changes["max_steps"] = max(10, allowed)
            reasons.append(f"{per_step:.2f} s/step last time: {changes['max_steps']} steps fit a third of the "
                           f"{accelerator_left_seconds:.0f} s left")  # fmt: skip
    gpus = last_hardware.get("gpus") or []
    tight = any(g.get("memory_total_mib") and g["memory_mib"] > 0.9 * g["memory_total_mib"] for g in gpus)
    if last_hardware.get("oom") or tight:
        changes["batch_size"] = max(1, batch_size // 2)
        reasons.append("the last job ran out of memory" if last_hardware.get("oom") else
                       "the last job peaked above 90 % of a device's memory")  # fmt: skip
        reasons[-1] += f": batch {batch_size} -> {changes['batch_size']}"
    return changes, "; ".join(reasons) or "the last job's runtime and memory leave room: as planned"
