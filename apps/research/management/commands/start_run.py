"""Start a research run on a benchmark: ``manage.py start_run --benchmark minibench/arithmetic``.

The agents run as Celery tasks on the ``agents`` queue (start the workers: ``./dev workers`` or
``manage.py demo``); this command creates the run, starts it, and optionally waits for its result.
The ablation switches reproduce the paper's ablation shape: ``--no-reviewer`` (the Main Agent
decides from Worker summaries alone) and ``--serial-workers`` (one Worker at a time).

``--harness`` starts an external run whose single Worker (and, with ``--harness-main``, whose Main
Agent) an external harness plays through MCP: it prints the token(s) and ready-to-paste MCP
configuration for Claude Code and Codex (docs/harnesses.md).
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.benchmarks.services import THETA0_HANDLE, benchmark_resolve
from apps.core.errors import ApplicationError
from apps.experiments.models import Checkpoint
from apps.expos.harness import claude_code_config, codex_config, harness_run_start
from apps.research.agent_config import ROLES, llm_config
from apps.research.choices import RUN_TERMINAL_STATES
from apps.research.models import Run
from apps.research.services import run_create, run_final_result, run_start

# Accelerator-seconds one final-split evaluation is budgeted at when reserving for the end.
FINAL_EVAL_SECONDS = 30


def launch_run(
    *,
    benchmark: str,
    policy: str = "heuristic",
    name: str = "",
    wall_seconds: int = 3600,
    accelerator_seconds: int = 3600,
    llm_tokens: int = 0,
    parallel: int = 2,
    gate: bool = False,
    reviewer: bool = True,
    serial_workers: bool = False,
    max_workers: int = 4,
    screen_steps: int = 60,
    train_steps: int = 200,
    learning_rate: float = 2e-3,
    batch_size: int = 64,
    actor: str = "system",
) -> Any:
    """Create and start a run; the final evaluation's cost is reserved from the accelerator budget."""
    if policy not in ("heuristic", "llm"):
        raise ApplicationError("invalid_policy", "policy is heuristic or llm.")
    if policy == "llm":
        for role in ROLES:
            llm_config(role)  # fails now, with the variable to set, rather than inside a worker
        llm_tokens = llm_tokens or 2_000_000
    bench = benchmark_resolve(benchmark)
    base = _base_checkpoint()
    parallel = 1 if serial_workers else max(1, parallel)
    # θ0, the reference and up to max_workers accepted candidates are evaluated at the end.
    reserve = min(FINAL_EVAL_SECONDS * (2 + max_workers), accelerator_seconds // 4)
    run = run_create(
        name=name or f"{bench.name} {policy}",
        benchmark=bench,
        base_checkpoint=base,
        target_capability=bench.description or bench.task,
        budget_wall_seconds=wall_seconds,
        budget_accelerator_seconds=accelerator_seconds,
        budget_llm_tokens=llm_tokens,
        max_parallel_workers=parallel,
        reserved_final_seconds=reserve,
        agent_mode=policy,
        policy={
            "training_gate": gate,
            "reviewers": reviewer,
            "serial_workers": serial_workers,
            "heuristic": {
                "max_workers": max_workers,
                "screen_steps": screen_steps,
                "train_steps": train_steps,
                "learning_rate": learning_rate,
                "batch_size": batch_size,
            },
        },  # fmt: skip
    )
    return run_start(run=run, actor=actor)


def _base_checkpoint() -> Any:
    base = Checkpoint.objects.filter(handle=THETA0_HANDLE).first() or Checkpoint.objects.filter(is_base=True).first()
    if base is None:
        raise ApplicationError("no_base_checkpoint", "No θ0 is installed: run `manage.py build_minibench` first.")
    return base


def wait_for_result(run: Any, *, poll: float = 2.0, timeout: float | None = None, write: Any = None) -> Any:
    """Block until the run ends; print status changes as they happen. Returns the final run row."""
    started, last = time.monotonic(), None
    while True:
        current = Run.objects.get(pk=run.pk)
        line = f"run {current.name!r}: {current.status}"
        if write is not None and line != last:
            write(line)
            last = line
        if current.status in RUN_TERMINAL_STATES:
            return current
        if timeout is not None and time.monotonic() - started > timeout:
            return current
        time.sleep(poll)


class Command(BaseCommand):
    help = "Start a research run (heuristic or LLM agents) on a benchmark."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--benchmark", default="minibench/arithmetic", help="name, name@version or uuid")
        parser.add_argument("--policy", choices=("heuristic", "llm"), default="heuristic")
        parser.add_argument("--name", default="")
        parser.add_argument("--wall-seconds", type=int, default=3600, help="wall-clock budget")
        parser.add_argument("--accelerator-seconds", type=int, default=3600, help="accelerator-seconds budget")
        parser.add_argument("--llm-tokens", type=int, default=0, help="LLM token budget (llm policy)")
        parser.add_argument("--parallel", type=int, default=2, help="most Workers active at once")
        parser.add_argument("--max-workers", type=int, default=4, help="most Workers over the run (heuristic)")
        parser.add_argument("--screen-steps", type=int, default=60, help="heuristic: steps of a screening run")
        parser.add_argument("--train-steps", type=int, default=200, help="heuristic: steps of a full run")
        parser.add_argument("--gate", action="store_true", help="hold training for the Main Agent's approval")
        parser.add_argument("--no-reviewer", action="store_true", help="ablation: no Reviewers")
        parser.add_argument("--serial-workers", action="store_true", help="ablation: one Worker at a time")
        parser.add_argument("--wait", action="store_true", help="wait for the result and print it")
        parser.add_argument("--harness", action="store_true", help="an external harness plays the Worker (MCP)")
        parser.add_argument("--harness-main", action="store_true", help="with --harness: it plays the Main Agent too")
        parser.add_argument("--task", default="", help="with --harness: the Worker's task")
        parser.add_argument("--api-url", default="", help="with --harness: the URL harnesses reach (RSI_API_URL)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["harness"]:
            self._harness(options)
            return
        try:
            run = launch_run(
                benchmark=options["benchmark"], policy=options["policy"], name=options["name"],
                wall_seconds=options["wall_seconds"], accelerator_seconds=options["accelerator_seconds"],
                llm_tokens=options["llm_tokens"], parallel=options["parallel"], gate=options["gate"],
                reviewer=not options["no_reviewer"], serial_workers=options["serial_workers"],
                max_workers=options["max_workers"], screen_steps=options["screen_steps"],
                train_steps=options["train_steps"], actor="cli",
            )  # fmt: skip
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(f"run {run.uuid} started ({run.agent_mode}, {run.max_parallel_workers} parallel)")
        if options["wait"]:
            run = wait_for_result(run, write=self.stdout.write)
            self.stdout.write(json.dumps(run_final_result(run=run), indent=2, default=str))

    def _harness(self, options: dict[str, Any]) -> None:
        try:
            started = harness_run_start(
                benchmark=benchmark_resolve(options["benchmark"]), base_checkpoint=_base_checkpoint(),
                name=options["name"], task=options["task"], wall_seconds=options["wall_seconds"],
                accelerator_seconds=options["accelerator_seconds"],
                reserved_final_seconds=min(FINAL_EVAL_SECONDS * 3, options["accelerator_seconds"] // 4),
                plays_main=options["harness_main"],
            )  # fmt: skip
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        url = options["api_url"] or settings.RSI_API_URL
        self.stdout.write(f"run {started.run.uuid} started (external harness)")
        for seat in started.seats:
            self.stdout.write(f"token for {seat.node.handle} ({seat.node.kind}): {seat.token}")
        self.stdout.write("--- Claude Code: .mcp.json ---")
        self.stdout.write(json.dumps(claude_code_config(api_url=url, seats=started.seats), indent=2))
        self.stdout.write("--- Codex: ~/.codex/config.toml ---")
        self.stdout.write(codex_config(api_url=url, seats=started.seats), ending="")
        self.stdout.write("--- end ---")
