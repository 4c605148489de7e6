"""Who hears about a job's outcome: a small registry the job engine calls, filled at app start.

The job engine (apps.jobs.services) knows no caller: the experiment pipeline and the run's
health check sit above it (apps.flows) and register here from their AppConfig.ready, so jobs
imports nothing of the apps that enqueue jobs. Two moments, both inside the transaction that
records the job's transition (so a retry never sees the transition without its consequence):

- ``on_transition``: after every recorded transition of a job (claimed, succeeded, failed,
  cancelled, lost once its retry is decided). The pipeline advances the job's experiment here.
- ``on_finished``: when a job reaches any terminal status, once its ``resource_seconds`` are
  set and before its transition is recorded. The run lifecycle charges the run's accelerator
  budget here.
- ``on_ended``: after a job succeeded or failed (not cancelled or lost). The run's health check
  counts its recent failures here.

Handlers run in registration order; registering the same function twice is a no-op, so a second
``ready()`` (tests that reload apps) does not call it twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from apps.jobs.models import Job


class JobHook(Protocol):
    __module__: str
    __qualname__: str

    def __call__(self, *, job: Job) -> None: ...


_ON_TRANSITION: list[JobHook] = []
_ON_FINISHED: list[JobHook] = []
_ON_ENDED: list[JobHook] = []


def _register(hooks: list[JobHook], hook: JobHook) -> JobHook:
    if hook not in hooks:
        hooks.append(hook)
    return hook


def on_transition(hook: JobHook) -> JobHook:
    """Call ``hook(job=job)`` after each recorded transition of a job, inside its transaction."""
    return _register(_ON_TRANSITION, hook)


def on_finished(hook: JobHook) -> JobHook:
    """Call ``hook(job=job)`` when a job reaches a terminal status (its time counted), inside its transaction."""
    return _register(_ON_FINISHED, hook)


def on_ended(hook: JobHook) -> JobHook:
    """Call ``hook(job=job)`` after a job succeeded or failed, inside its transaction."""
    return _register(_ON_ENDED, hook)


def registered() -> dict[str, list[str]]:
    """The handlers registered now, by moment, as dotted names (for tests and diagnostics)."""
    return {
        moment: [f"{hook.__module__}.{hook.__qualname__}" for hook in hooks]
        for moment, hooks in (
            ("on_transition", _ON_TRANSITION),
            ("on_finished", _ON_FINISHED),
            ("on_ended", _ON_ENDED),
        )
    }


def transitioned(job: Job) -> None:
    for hook in list(_ON_TRANSITION):
        hook(job=job)


def finished(job: Job) -> None:
    for hook in list(_ON_FINISHED):
        hook(job=job)


def ended(job: Job) -> None:
    for hook in list(_ON_ENDED):
        hook(job=job)
