"""Building task environments: a job on the gpu queue applies RSI-Craft's steps and records each.

    environment_build_create(source=..., base_dir=..., strong_dir=..., config=...)  -> queued build + job
    environment_build_execute(build=..., log=..., should_stop=...)                  -> runs the steps
    agent_sft_enqueue(base_checkpoint=..., datasets=..., hyperparameters=...)      -> agent_sft job

Every decision is an event (``dojo.decision``, global chain) carrying the step's numbers, written
in the same transaction as the task's `TaskEnvironment` row, so a task is either fully recorded
or not at all; a re-delivered job skips the tasks already recorded.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import transaction

from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json, sha256_text, sha256_tree
from apps.datapool.models import DataEntry, DataFormat
from apps.dojo.choices import BuildStatus, EnvironmentStatus
from apps.dojo.models import EnvironmentBuild, TaskEnvironment
from apps.dojo.registry import task_sources
from apps.experiments.events import event_append
from apps.experiments.models import Checkpoint
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.jobs.services import job_enqueue
from apps.ml.agent_sft_config import agent_sft_config
from apps.ml.craft_config import craft_config

SYSTEM = "system"
BUILD_TIME_LIMIT_SECONDS = 4 * 3600


def _model_ref(path: Path, what: str) -> dict[str, str]:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ApplicationError(
            "invalid_model", f"{what} model {str(path)!r} is not a checkpoint folder (no config.json)"
        )
    # The content hash, so a build names exactly the weights its numbers came from.
    return {"path": str(path.resolve()), "sha256": sha256_text(canonical_json(sha256_tree(path)))}


def environment_build_create(
    *, source: str, base_dir: Path, strong_dir: Path, config: dict[str, Any] | None = None, enqueue: bool = True
) -> EnvironmentBuild:
    """Validate a build request (source, models, thresholds) and queue it as a gpu job.

    Bad input is a 400 before any row is written. ``enqueue=False`` records the build without a
    job, for ``dojo_build --inline`` (an operator host without workers).
    """
    try:
        craft = craft_config(config)
    except (TypeError, ValueError) as exc:
        raise ApplicationError("invalid_dojo_config", str(exc)) from exc
    sources = task_sources(source, seed=craft.seed)  # raises a 400 for a bad spec
    base, strong = _model_ref(base_dir, "base"), _model_ref(strong_dir, "strong")
    with transaction.atomic():
        build = EnvironmentBuild(source=source, config=craft.as_dict(), base_model=base, strong_model=strong)
        build.full_clean()
        build.save(force_insert=True)
        if enqueue:
            job = job_enqueue(
                kind=JobKind.DOJO_BUILD,
                spec={"build": str(build.uuid)},
                seed=craft.seed,
                time_limit_seconds=BUILD_TIME_LIMIT_SECONDS,
            )
            build.job = job
            build.save(update_fields=["job", "updated_at"])
        event_append(
            type="dojo.build_created",
            actor=SYSTEM,
            role=SYSTEM,
            arguments={"build": str(build.uuid), "source": source, "tasks": [s.name for s in sources],
                       "config": build.config, "base": base, "strong": strong},
            result_ref=f"dojo_build:{build.uuid}",
        )  # fmt: skip
    return build


def _set_status(build: EnvironmentBuild, status: str, **fields: Any) -> None:
    # Conditional: a finished build is never reopened by a re-delivered message.
    EnvironmentBuild.objects.filter(pk=build.pk).exclude(status=BuildStatus.SUCCEEDED).update(status=status, **fields)
    build.refresh_from_db()


def environment_build_fail(*, build: EnvironmentBuild, error: str) -> None:
    _set_status(build, BuildStatus.FAILED, error=error[:5000])


def _record(build: EnvironmentBuild, candidate: Any, decisions: list[Any], scores: dict[str, float | None],
            seconds: float) -> TaskEnvironment:  # fmt: skip
    rejected = next((d for d in decisions if not d.kept), None)
    with transaction.atomic():
        env = TaskEnvironment(
            build=build,
            name=candidate.name,
            source=candidate.source,
            subset=candidate.subset,
            contract=candidate.contract,
            sample_ids=candidate.sample_ids,
            sample_ids_sha256=_ids_sha(candidate.sample_ids),
            status=EnvironmentStatus.REJECTED if rejected else EnvironmentStatus.KEPT,
            reason=rejected.reason if rejected else "",
            rejected_at=rejected.step if rejected else "",
            decisions=[d.as_dict() for d in decisions],
            base_score=scores.get("base"),
            strong_score=scores.get("strong"),
            seconds=round(seconds, 3),
        )
        env.full_clean(exclude=["build"])
        env.save(force_insert=True)
        for decision in decisions:
            event_append(
                type="dojo.decision",
                actor=SYSTEM,
                role=SYSTEM,
                arguments={"build": str(build.uuid), **decision.as_dict()},
                result_ref=f"dojo_env:{env.uuid}",
            )
    return env


def _ids_sha(ids: list[str]) -> str:
    from apps.ml.craft import ids_sha256  # noqa: PLC0415 - torch; the worker has it loaded already

    return ids_sha256(ids)


def environment_build_execute(
    *,
    build: EnvironmentBuild,
    log: Callable[[str], None] = lambda _text: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> EnvironmentBuild:
    """Run every RSI-Craft step on every task of the build's source; record each decision.

    Order per task: subset split, size, reliability (K strong-model evaluations), mutation check
    (on the strong outputs), discriminability (base vs strong). A task stops at its first
    rejection: later steps would spend compute on a task already out.
    """
    from apps.ml import craft  # noqa: PLC0415 - torch/transformers take seconds to import

    config = craft_config(build.config)
    _set_status(build, BuildStatus.RUNNING)
    done = set(TaskEnvironment.objects.filter(build=build).values_list("name", flat=True))
    runners: dict[str, Any] = {}

    def runner(which: str) -> Any:
        # Loaded on first use: a build whose tasks all fail the size filter loads no model.
        if which not in runners:
            runners[which] = craft.ModelRunner(Path(getattr(build, f"{which}_model")["path"]))
        return runners[which]

    for source in task_sources(build.source, seed=config.seed):
        split, candidates = craft.split_subsets(source.name, source.subsets, source.items)
        if len(candidates) > 1:
            log(f"{source.name}: split into {[c.name for c in candidates]}")
        for candidate in candidates:
            if candidate.name in done:
                continue
            if should_stop():
                return build
            started = time.monotonic()
            decisions = [split] if candidate is candidates[0] else []
            scores: dict[str, float | None] = {}
            decision, kept = craft.size_filter(candidate, config)
            decisions.append(decision)
            if kept is not None:
                decision, outputs = craft.reliability(kept, runner("strong"), config)
                decisions.append(decision)
                strong = sum(decision.numbers["scores"]) / len(decision.numbers["scores"])
                scores["strong"] = strong
                if decision.kept:
                    decision = craft.mutation_check(kept, outputs, config)
                    decisions.append(decision)
                if decision.kept:
                    base = scores["base"] = craft.base_score(kept, runner("base"), config)
                    decision = craft.discriminability(kept, base=base, strong=strong, config=config)
                    decisions.append(decision)
                candidate = kept
            env = _record(build, candidate, decisions, scores, time.monotonic() - started)
            log(f"{env.name}: {env.status}{' (' + env.reason + ')' if env.reason else ''} in {env.seconds:.1f}s")
    return _finish(build)


def _finish(build: EnvironmentBuild) -> EnvironmentBuild:
    envs = list(TaskEnvironment.objects.filter(build=build))
    rejected: dict[str, int] = {}
    for env in envs:
        if env.status == EnvironmentStatus.REJECTED:
            rejected[env.reason] = rejected.get(env.reason, 0) + 1
    summary = {
        "tasks": len(envs),
        "kept": sum(1 for e in envs if e.status == EnvironmentStatus.KEPT),
        "rejected": rejected,
        "seconds_per_task": {e.name: e.seconds for e in envs},
    }
    with transaction.atomic():
        _set_status(build, BuildStatus.SUCCEEDED, summary=summary)
        event_append(
            type="dojo.build_finished",
            actor=SYSTEM,
            role=SYSTEM,
            arguments={"build": str(build.uuid), **summary},
            result_ref=f"dojo_build:{build.uuid}",
        )
    return build


AGENT_SFT_TIME_LIMIT_SECONDS = 12 * 3600


def agent_sft_enqueue(
    *, base_checkpoint: Checkpoint, datasets: list[DataEntry], hyperparameters: dict[str, Any] | None = None
) -> Job:
    """Queue an agent_sft job: fine-tune a chat checkpoint on trajectory datasets (gpu queue).

    The recipe is checked now (a 400 naming the setting); the datasets are pinned by sha256 so the
    worker trains on exactly the registered bytes. The output checkpoint's parent is the base and
    its producing job names the datasets: its lineage to the trajectories is a query.
    """
    if not datasets:
        raise ApplicationError("no_trajectories", "agent_sft needs at least one trajectory dataset.")
    wrong = [f"{e.handle} ({e.format})" for e in datasets if e.format != DataFormat.CHAT]
    if wrong:
        raise ApplicationError(
            "not_trajectories",
            f"agent_sft trains on chat entries (exported trajectories: manage.py export_trajectories), not {wrong}.",
        )
    try:
        config = agent_sft_config(hyperparameters)
    except ValueError as exc:
        raise ApplicationError("invalid_agent_sft_config", str(exc)) from exc
    spec = {
        "base_checkpoint": str(base_checkpoint.uuid),
        "data": [{"uuid": str(e.uuid), "handle": e.handle, "uri": e.uri, "sha256": e.sha256} for e in datasets],
        "hyperparameters": dataclasses.asdict(config),
    }
    with transaction.atomic():
        job = job_enqueue(kind=JobKind.AGENT_SFT, spec=spec, seed=config.seed,
                          time_limit_seconds=AGENT_SFT_TIME_LIMIT_SECONDS)  # fmt: skip
        event_append(type="dojo.agent_sft_queued", actor=SYSTEM, role=SYSTEM,
                     arguments={"job": str(job.uuid), **spec}, result_ref=f"job:{job.uuid}")  # fmt: skip
    return job
