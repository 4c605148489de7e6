"""Agent-evaluation suites: agent configurations x base models x tasks, each cell a research run.

    suite_create(name=..., agents=[...], tasks=[...], base_models=[...], train_tasks=[...], budget={...},
                 seeds=[...])
        validates everything, checks the training and evaluation task sets disjoint, and creates
        the suite with one ``created`` run per cell (through ``run_launch``, so a cell is an
        ordinary run with the suite's budget); ``seeds`` repeats every cell once per run seed
    ablation_suite_create(run=..., seeds=[...])
        the paper's ablation of a run: ``ABLATION_AGENTS`` on its benchmark and θ0 at its budget,
        one cell per seed (the comparison page's one click, bench/ablation.py)
    suite_launch(suite=...)       starts the first ``max_concurrent`` cells and the advance clock
    suite_advance(suite_id=..., tick=...)
        one tick of the clock (a Celery task on the agents queue, ``TaskName.SUITE_ADVANCE``):
        starts queued cells as running ones end, and finishes the suite when every run ended

The disjointness check (``task_overlap``) compares the evaluation benchmarks' sealed items with
the training tasks' items by task name, item id and content: the submission review's matching
(``apps.integrity.overlap.sealed_scanner``: canonical text, n-grams, near duplicates, the salient
numbers and answer) on the items, and the same matching on their sentence forms (numbers and
``{slot}`` placeholders masked, :func:`sentence_form`), so that a training task generated from an
evaluation item's template with other numbers (or other names) overlaps too. Any overlap refuses
the suite with the overlapping names and counts, and nothing is written.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import benchmark_resolve, benchmark_sealed_items
from apps.core.errors import ApplicationError, Conflict, NotFound
from apps.core.queues import Queue, TaskName
from apps.dojo.agents import ABLATION_AGENTS, FULL_UNDER, agent_resolve
from apps.dojo.choices import CellStatus, EnvironmentStatus, SuiteStatus
from apps.dojo.models import AgentSuite, SuiteCell, TaskEnvironment
from apps.dojo.registry import task_sources
from apps.experiments.events import event_append
from apps.experiments.models import Checkpoint
from apps.flows.runs import base_checkpoint_default, run_launch, run_start
from apps.integrity.canonical import canonical_text, canonical_tokens, is_number
from apps.integrity.contamination import ContaminationScanner
from apps.integrity.overlap import sealed_scanner
from apps.ml.hparams import LR_SCHEDULERS
from apps.research.agent_config import DEFAULT_PROFILE
from apps.research.choices import RUN_TERMINAL_STATES, AgentMode, RunStatus
from apps.research.models import Run
from rsiweb import env
from rsiweb.celery import app

SYSTEM = "system"
MAX_CELLS = 200
MAX_SEEDS = 20
# The run_launch arguments a suite's budget may set, with their types; every cell gets the same.
BUDGET_KEYS: dict[str, type] = {
    "wall_seconds": int,
    "accelerator_seconds": int,
    "llm_tokens": int,
    "parallel": int,
    "max_workers": int,
    "screen_steps": int,
    "train_steps": int,
    "learning_rate": float,
    "lr_scheduler_type": str,
    "batch_size": int,
    "seed": int,
    "reviewer": bool,
    "gate": bool,
}
# The budget keys whose value is one of a fixed set of names.
BUDGET_CHOICES: dict[str, tuple[str, ...]] = {"lr_scheduler_type": LR_SCHEDULERS}
# The budget keys that become the heuristic policy's settings (run_launch passes them on).
HEURISTIC_BUDGET_KEYS = ("screen_steps", "train_steps", "learning_rate", "lr_scheduler_type", "batch_size")
BUDGET_MAX = 2_000_000_000  # the run's budget columns are 32-bit
DEFAULT_BUDGET: dict[str, Any] = {"wall_seconds": 1800, "accelerator_seconds": 1800, "parallel": 2, "max_workers": 3}


def advance_seconds() -> float:
    """Seconds between two ticks of a suite's advance clock."""
    return env.number("RSI_SUITE_ADVANCE_SECONDS", 5.0)


def _bad(code: str, message: str, **detail: Any) -> ApplicationError:
    return ApplicationError(code, message, **detail)


# --------------------------------------------------------------------------- validation


def _budget(raw: dict[str, Any] | None) -> dict[str, Any]:
    if raw is not None and not isinstance(raw, dict):
        raise _bad("invalid_budget", "budget is an object of run_launch arguments.")
    unknown = sorted(set(raw or {}) - set(BUDGET_KEYS))
    if unknown:
        raise _bad("invalid_budget", f"Unknown budget keys {unknown}; known: {sorted(BUDGET_KEYS)}.")
    budget = dict(DEFAULT_BUDGET)
    for key, value in (raw or {}).items():
        kind = BUDGET_KEYS[key]
        if kind is bool:
            if not isinstance(value, bool):
                raise _bad("invalid_budget", f"budget.{key} is true or false, not {value!r}.")
        elif key in BUDGET_CHOICES:
            if value not in BUDGET_CHOICES[key]:
                raise _bad("invalid_budget", f"budget.{key} is one of {', '.join(BUDGET_CHOICES[key])}, not {value!r}.")
        elif isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
            raise _bad("invalid_budget", f"budget.{key} is a {kind.__name__}, not {value!r}.")
        elif not math.isfinite(value) or value < 0 or (value == 0 and key not in ("llm_tokens", "seed")):
            raise _bad("invalid_budget", f"budget.{key} must be a positive number, not {value!r}.")
        elif value > BUDGET_MAX:
            raise _bad("invalid_budget", f"budget.{key} is at most {BUDGET_MAX}, not {value!r}.")
        budget[key] = kind(value)
    return budget


def _seeds(raw: Any, budget: dict[str, Any]) -> list[int]:
    """The suite's run seeds; none given: the budget's one seed (or none at all, as before seeds)."""
    if raw is None:
        return []
    whole = isinstance(raw, list) and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= BUDGET_MAX
                                          for v in raw)  # fmt: skip
    if not whole or not raw or len(raw) > MAX_SEEDS:
        raise _bad("invalid_seeds", f"seeds is a list of 1 to {MAX_SEEDS} whole numbers from 0 to {BUDGET_MAX}.")
    if len(set(raw)) != len(raw):
        raise _bad("invalid_seeds", "seeds names one seed twice.")
    if "seed" in budget:
        raise _bad("invalid_seeds", "Give the run seed either as budget.seed or as seeds, not both.")
    return list(raw)


def _checkpoint(reference: str) -> Checkpoint:
    try:
        found = Checkpoint.objects.filter(uuid=uuid.UUID(str(reference))).first()
    except ValueError:
        found = Checkpoint.objects.filter(handle=str(reference)).first()
    if found is None:
        raise NotFound("checkpoint_not_found", f"No checkpoint {reference!r} (a uuid or a handle).")
    if not found.is_base:
        raise _bad("not_a_base_checkpoint", f"{found.handle} is not a registered θ0 checkpoint.")
    return found


def _names(values: Any, what: str) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) and v.strip() for v in values):
        raise _bad(f"invalid_{what}", f"{what} is a list of non-empty strings.")
    if len(set(values)) != len(values):
        raise _bad(f"invalid_{what}", f"{what} names one of its entries twice.")
    return [v.strip() for v in values]


# --------------------------------------------------------------------------- the disjointness check


@dataclass(frozen=True)
class TaskItems:
    """One side of the disjointness check: a task's names, its items' ids and prompts, and its items."""

    ref: str
    names: frozenset[str]
    ids: frozenset[str]
    prompts: frozenset[str]
    rows: tuple[dict[str, Any], ...] = ()
    benchmark: Benchmark | None = None


def _items(ref: str, names: set[str], rows: list[dict[str, Any]], benchmark: Benchmark | None = None) -> TaskItems:
    return TaskItems(
        ref=ref,
        names=frozenset(n.lower() for n in names if n),
        ids=frozenset(str(r["id"]) for r in rows if "id" in r),
        prompts=frozenset(canonical_text(str(r.get("prompt", ""))) for r in rows if str(r.get("prompt", "")).strip()),
        rows=tuple(
            {"id": str(r.get("id", "")), "prompt": str(r.get("prompt", "")), "answer": str(r.get("answer", ""))}
            for r in rows
        ),  # fmt: skip
        benchmark=benchmark,
    )


def benchmark_items(benchmark: Benchmark) -> TaskItems:
    return _items(
        f"benchmark:{benchmark.name}",
        {benchmark.name, benchmark.task},
        benchmark_sealed_items(benchmark=benchmark),
        benchmark,
    )


_SLOT = re.compile(r"\{[^{}\s]{0,40}\}")
_NUMBER_MARK = "qnumberq"
# Two sentence forms are one template at this Jaccard similarity of their word pairs (numbers
# masked): lower than an item's near-duplicate bar (0.75), so that other names or objects in the
# same sentence ("Mia has N stamps" / "Tom has N stamps") still match.
FORM_THRESHOLD = 0.55


def sentence_form(prompt: str) -> str:
    """A prompt's sentence form: its canonical words with every number and ``{slot}`` masked."""
    tokens = canonical_tokens(_SLOT.sub(" 0 ", prompt))
    return " ".join(_NUMBER_MARK if is_number(t) else t for t in tokens)


def _content_overlap(sealed: TaskItems, trained: TaskItems) -> tuple[set[str], set[str], list[list[str]]]:
    """(train item ids matching sealed items, those whose sentence form matches one, [train id, sealed id] pairs)."""
    if sealed.benchmark is None or not trained.rows:
        return set(), set(), []
    rows = [{"prompt": r["prompt"], "answer": r["answer"]} for r in trained.rows]
    instances = sealed_scanner(benchmark=sealed.benchmark).scan(rows)
    template = str((sealed.benchmark.settings or {}).get("prompt_template", ""))
    forms = ContaminationScanner(
        [{"id": r["id"], "prompt": sentence_form(r["prompt"])} for r in sealed.rows],
        layers=("exact", "near_dup"),
        threshold=FORM_THRESHOLD,
        templates=[template] if template else [],
    ).scan([{"prompt": sentence_form(r["prompt"])} for r in trained.rows])
    pairs = sorted({(trained.rows[m.row_index]["id"], m.sample_id) for m in [*instances, *forms]})
    return (
        {trained.rows[m.row_index]["id"] for m in instances},
        {trained.rows[m.row_index]["id"] for m in forms},
        [list(pair) for pair in pairs],
    )


def train_task_items(ref: str) -> TaskItems:
    """A training task: ``env:<uuid>`` (a kept dojo environment), a registry spec, or a benchmark."""
    kind, _, arg = ref.partition(":")
    if kind == "env":
        try:
            environment = TaskEnvironment.objects.filter(uuid=uuid.UUID(arg)).first()
        except ValueError:
            environment = None
        if environment is None:
            raise NotFound("train_task_not_found", f"No task environment {arg!r} (env:<uuid>).")
        if environment.status != EnvironmentStatus.KEPT:
            raise _bad(
                "train_task_rejected", f"Task environment {environment.name} was rejected ({environment.reason})."
            )
        keep = {str(i) for i in environment.sample_ids}
        rows = [
            r
            for source in task_sources(environment.build.source, seed=int(environment.build.config.get("seed", 0)))
            for r in source.items
            if str(r["id"]) in keep and r["subset"] == environment.subset
        ]
        return _items(ref, {environment.name, environment.source}, rows)
    if kind in ("minibench-variants", "folder"):
        sources = task_sources(ref)
        return _items(ref, {s.name for s in sources}, [r for s in sources for r in s.items])
    benchmark = benchmark_resolve(ref)
    items = benchmark_items(benchmark)
    return TaskItems(ref, items.names, items.ids, items.prompts, items.rows)


def task_overlap(*, tasks: list[Benchmark], train_tasks: list[str]) -> dict[str, Any]:
    """Compare every evaluation task with every training task; the report lists each overlap."""
    evaluated = [benchmark_items(b) for b in tasks]
    trained = [train_task_items(ref) for ref in train_tasks]
    overlaps = []
    for e in evaluated:
        for t in trained:
            names = sorted(e.names & t.names)
            ids = sorted(e.ids & t.ids)
            prompts = e.prompts & t.prompts
            items, forms, pairs = _content_overlap(e, t)
            if names or ids or prompts or items or forms:
                overlaps.append({"task": e.ref, "train_task": t.ref, "names": names, "ids": len(ids),
                                 "id_examples": ids[:5], "prompts": len(prompts), "items": len(items),
                                 "templates": len(forms), "item_examples": pairs[:5]})  # fmt: skip
    return {
        "compared": {"tasks": [e.ref for e in evaluated], "train_tasks": [t.ref for t in trained]},
        "by": ["task name", "item id", "canonical prompt text", "item content", "sentence form"],
        "items": {"tasks": sum(len(e.ids) for e in evaluated), "train_tasks": sum(len(t.ids) for t in trained)},
        "overlaps": overlaps,
    }


# --------------------------------------------------------------------------- services


def suite_create(
    *,
    name: str,
    agents: list[str],
    tasks: list[str],
    base_models: list[str] | None = None,
    train_tasks: list[str] | None = None,
    budget: dict[str, Any] | None = None,
    seeds: list[int] | None = None,
    max_concurrent: int = 2,
    llm_profile: str = DEFAULT_PROFILE,
    created_by: Any = None,
    actor: str = SYSTEM,
) -> AgentSuite:
    """Create a suite and one ``created`` run per (agent, base model, task, seed) cell; nothing on a refusal."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise _bad("invalid_name", "name is a non-empty string of at most 200 characters.")
    agents = _names(agents, "agents")
    if not agents:
        raise _bad("invalid_agents", "A suite needs at least one agent configuration.")
    configs = [agent_resolve(a, llm_profile=llm_profile) for a in agents]
    task_refs = _names(tasks, "tasks")
    if not task_refs:
        raise _bad("invalid_tasks", "A suite needs at least one evaluation task (a benchmark name or uuid).")
    benchmarks = [benchmark_resolve(t) for t in task_refs]
    if len({b.pk for b in benchmarks}) != len(benchmarks):
        raise _bad("invalid_tasks", "tasks names one benchmark twice.")
    bases = [_checkpoint(b) for b in _names(base_models, "base_models")] if base_models else [base_checkpoint_default()]
    if len({b.pk for b in bases}) != len(bases):
        raise _bad("invalid_base_models", "base_models names one checkpoint twice.")
    train_refs = _names(train_tasks or [], "train_tasks")
    budget = _budget(budget)
    seed_list = _seeds(seeds, budget)
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or not 1 <= max_concurrent <= 32:
        raise _bad("invalid_max_concurrent", "max_concurrent is a whole number from 1 to 32.")
    cells = len(configs) * len(bases) * len(benchmarks) * max(1, len(seed_list))
    if cells > MAX_CELLS:
        raise _bad("too_many_cells", f"{cells} cells; a suite has at most {MAX_CELLS}.")
    overlap = task_overlap(tasks=benchmarks, train_tasks=train_refs)
    if overlap["overlaps"]:
        described = "; ".join(
            f"{o['task']} vs {o['train_task']}: names {o['names'] or 'none'}, {o['ids']} shared item ids, "
            f"{o['prompts']} shared prompts, {o['items']} training items matching sealed items, "
            f"{o['templates']} on a sealed item's sentence form (training item, sealed item: {o['item_examples']})"
            for o in overlap["overlaps"]
        )
        raise _bad(
            "suite_task_overlap",
            f"The evaluation tasks overlap the training tasks ({described}). Evaluate on tasks the agents "
            "were not trained on, or drop the overlapping training task.",
            overlaps=overlap["overlaps"],
        )
    with transaction.atomic():
        suite = AgentSuite(name=name.strip(), agents=agents, budget=budget, max_concurrent=max_concurrent,
                           train_tasks=train_refs, overlap=overlap, seeds=seed_list, created_by=created_by)  # fmt: skip
        suite.full_clean()
        suite.save()
        position = 0
        for benchmark in benchmarks:
            for base in bases:
                for seed in seed_list or [budget.get("seed", 0)]:
                    for config in configs:
                        label = f"{config.name} x {base.handle} x {benchmark.name}"
                        run = run_launch(
                            benchmark=benchmark,
                            policy=config.policy,
                            llm_profile=llm_profile,
                            base_checkpoint=base,
                            name=f"{suite.name}: {label}" + (f" seed {seed}" if seed_list else ""),
                            wall_seconds=budget["wall_seconds"],
                            accelerator_seconds=budget["accelerator_seconds"],
                            llm_tokens=budget.get("llm_tokens", 0),
                            parallel=budget["parallel"],
                            max_workers=budget["max_workers"],
                            reviewer=config.run.get("reviewer", budget.get("reviewer", True)),
                            serial_workers=config.run.get("serial_workers", False),
                            search_policy=config.search_policy,
                            gate=budget.get("gate", False),
                            seed=seed,
                            **{k: budget[k] for k in HEURISTIC_BUDGET_KEYS if k in budget},
                            heuristic=config.heuristic,
                            actor=actor,
                            created_by=created_by,
                            start=False,
                        )  # fmt: skip
                        SuiteCell.objects.create(suite=suite, position=position, agent=config.name, seed=seed,
                                                 base_checkpoint=base, benchmark=benchmark, run=run)  # fmt: skip
                        position += 1
        event_append(type="dojo.suite_created", actor=actor, role="human" if created_by else SYSTEM,
                     arguments={"suite": str(suite.uuid), "name": suite.name, "agents": agents,
                                "tasks": [b.name for b in benchmarks], "base_models": [b.handle for b in bases],
                                "budget": budget, "seeds": seed_list, "cells": position, "overlap": overlap},
                     result_ref=f"suite:{suite.uuid}")  # fmt: skip
    return suite


def run_budget(run: Run) -> dict[str, Any]:
    """A run's budget as a suite's (the run_launch arguments it was started with), seed left out."""
    policy = run.policy or {}
    heuristic = policy.get("heuristic") or {}
    budget: dict[str, Any] = {
        "wall_seconds": run.budget_wall_seconds,
        "accelerator_seconds": run.budget_accelerator_seconds,
        "llm_tokens": run.budget_llm_tokens,
        # A serial run's one Worker at a time is its switch, not its budget.
        "parallel": DEFAULT_BUDGET["parallel"] if policy.get("serial_workers") else run.max_parallel_workers,
        "gate": bool(policy.get("training_gate", False)),
    }
    for key in ("max_workers", *HEURISTIC_BUDGET_KEYS):
        if key in heuristic:
            budget[key] = heuristic[key]
    return budget


def ablation_suite_create(*, run: Run, seeds: list[int], max_concurrent: int = 1, created_by: Any = None,
                          actor: str = SYSTEM, search_policies: tuple[str, ...] = ()) -> AgentSuite:  # fmt: skip
    """The paper's ablation of ``run``: full, serial Workers and no Reviewer at its budget, per seed;
    ``search_policies`` adds the full system under each of those search policies (``uct``: the
    ``heuristic-uct`` configuration) as arms of their own.

    Every arm gets the run's benchmark, θ0 and budget (parallel Workers included: the serial arm
    runs one at a time, which is its point); only the heuristic policy is ablated here.
    """
    if run.agent_mode != AgentMode.HEURISTIC:
        raise _bad(
            "ablation_needs_heuristic",
            f"The ablation suite runs the heuristic policy; this run used {run.agent_mode}. "
            "Start an LLM ablation with suite_create and llm agent configurations.",
        )
    return suite_create(
        name=f"ablation of {run.name}"[:200],
        agents=list(ABLATION_AGENTS) + [FULL_UNDER[p] for p in search_policies if p in FULL_UNDER],
        tasks=[str(run.benchmark.uuid)],
        base_models=[str(run.base_checkpoint.uuid)],
        budget=run_budget(run),
        seeds=seeds,
        max_concurrent=max_concurrent,
        created_by=created_by,
        actor=actor,
    )


def cell_status(run_status: str) -> str:
    if run_status == RunStatus.CREATED:
        return CellStatus.QUEUED
    if run_status in RUN_TERMINAL_STATES:
        return CellStatus.ENDED
    return CellStatus.RUNNING


def _send_tick(suite_id: int, tick: int, countdown: float = 0.0) -> None:
    app.send_task(TaskName.SUITE_ADVANCE, kwargs={"suite_id": suite_id, "tick": tick}, queue=Queue.AGENTS,
                  countdown=max(0.0, countdown) or None)  # fmt: skip


def _fill(suite: AgentSuite, *, actor: str) -> list[Run]:
    """Start queued cells while fewer than ``max_concurrent`` of the suite's runs are active."""
    cells = list(suite.cells.select_related("run").order_by("position"))
    active = sum(1 for c in cells if cell_status(c.run.status) == CellStatus.RUNNING)
    started = []
    for cell in cells:
        if active >= suite.max_concurrent:
            break
        if cell.run.status != RunStatus.CREATED:
            continue
        try:
            started.append(run_start(run=cell.run, actor=actor))
        except Conflict:
            continue  # changed under us (an operator stopped it): not ours to start
        active += 1
    return started


def suite_launch(*, suite: AgentSuite, actor: str = SYSTEM) -> AgentSuite:
    """Start a created suite: its first cells' runs, and the advance clock (on commit)."""
    with transaction.atomic():
        locked = AgentSuite.objects.select_for_update().get(pk=suite.pk)
        if locked.status != SuiteStatus.CREATED:
            raise Conflict("suite_not_created", f"Suite {locked.uuid} is {locked.status}; only a created suite starts.")
        locked.status = SuiteStatus.RUNNING
        locked.started_at = timezone.now()
        locked.save(update_fields=["status", "started_at", "updated_at"])
        started = _fill(locked, actor=actor)
        event_append(type="dojo.suite_launched", actor=actor, role=SYSTEM,
                     arguments={"suite": str(locked.uuid), "started": [str(r.uuid) for r in started]},
                     result_ref=f"suite:{locked.uuid}")  # fmt: skip
        tick = locked.advance_tick
        transaction.on_commit(lambda: _send_tick(locked.pk, tick))
    return locked


def suite_advance_once(*, suite: AgentSuite, actor: str = SYSTEM) -> AgentSuite:
    """Start queued cells into free slots; finish the suite when every cell's run has ended."""
    with transaction.atomic():
        locked = AgentSuite.objects.select_for_update().get(pk=suite.pk)
        if locked.status != SuiteStatus.RUNNING:
            return locked
        _fill(locked, actor=actor)
        statuses = list(locked.cells.values_list("run__status", flat=True))
        if statuses and all(s in RUN_TERMINAL_STATES for s in statuses):
            locked.status = SuiteStatus.FINISHED
            locked.finished_at = timezone.now()
            locked.save(update_fields=["status", "finished_at", "updated_at"])
            counts = {s: statuses.count(s) for s in sorted(set(statuses))}
            event_append(type="dojo.suite_finished", actor=actor, role=SYSTEM,
                         arguments={"suite": str(locked.uuid), "runs": counts},
                         result_ref=f"suite:{locked.uuid}")  # fmt: skip
    return locked


def suite_advance(*, suite_id: int, tick: int) -> None:
    """One tick of the suite's clock; a duplicated tick message does nothing (numbered ticks)."""
    taken = AgentSuite.objects.filter(pk=suite_id, advance_tick=tick).update(
        advance_tick=F("advance_tick") + 1, advanced_at=timezone.now()
    )
    if taken != 1:
        return
    try:
        suite_advance_once(suite=AgentSuite.objects.get(pk=suite_id))
    finally:
        # The next tick goes out even when this one failed (a database blip): the clock never stops
        # while the suite runs.
        if AgentSuite.objects.filter(pk=suite_id, status=SuiteStatus.RUNNING).exists():
            _send_tick(suite_id, tick + 1, advance_seconds())


def suites_resume() -> int:
    """Re-send the clock of every running suite (an agents worker starting: a tick may be lost)."""
    resent = 0
    for pk, tick in AgentSuite.objects.filter(status=SuiteStatus.RUNNING).values_list("pk", "advance_tick"):
        _send_tick(pk, tick)
        resent += 1
    return resent
