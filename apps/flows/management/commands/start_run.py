"""Start a research run on a benchmark: ``manage.py start_run --benchmark minibench/arithmetic``.

The agents run as Celery tasks on the ``agents`` queue (start the workers: ``./dev workers`` or
``manage.py demo``); this command creates the run, starts it, and optionally waits for its result, through the same
service as the dashboard's "Start a run" form (``apps.flows.runs.run_launch``). The
ablation switches reproduce the paper's ablation shape: ``--no-reviewer`` (the Main Agent
decides from Worker summaries alone) and ``--serial-workers`` (one Worker at a time).

``--harness`` starts an external run whose first Worker (and, with ``--harness-main``, whose Main
Agent) an external harness plays through MCP; the Reviewers its Main Agent requests are played by
our own Reviewer loop, or with ``--harness-reviewers`` by the harness. It prints the token(s) and ready-to-paste MCP
configuration for Claude Code and Codex (docs/harnesses.md). ``--parallel``, ``--serial-workers``,
``--seed``, ``--gate``, ``--no-reviewer`` and the budgets apply as for our own loops; the flags of
our loops alone (``--policy``, ``--llm-*``, ``--max-workers``, ``--screen-steps``,
``--train-steps``) are refused with a message rather than dropped.
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.benchmarks.services import benchmark_resolve
from apps.core.errors import ApplicationError
from apps.experiments.models import Checkpoint
from apps.expos.harness import claude_code_config, codex_config, harness_run_start
from apps.flows.runs import FINAL_EVAL_SECONDS, base_checkpoint_default, run_final_result, run_launch
from apps.ml.hparams import LR_SCHEDULERS
from apps.research.agent_config import DEFAULT_PROFILE, DEFAULT_SEARCH_POLICY, SEARCH_POLICIES
from apps.research.choices import RUN_TERMINAL_STATES
from apps.research.models import Run


def wait_for_result(
    run: Any, *, poll: float = 2.0, timeout: float | None = None, write: Any = None, on_poll: Any = None
) -> Any:
    """Block until the run ends; print status changes as they happen. Returns the final run row.

    ``on_poll`` (the demo's) is called with the current run row on every poll, before the check.
    """
    started, last = time.monotonic(), None
    while True:
        current = Run.objects.get(pk=run.pk)
        line = f"run {current.name!r}: {current.status}"
        if write is not None and line != last:
            write(line)
            last = line
        if on_poll is not None:
            on_poll(current)
        if current.status in RUN_TERMINAL_STATES:
            return current
        if timeout is not None and time.monotonic() - started > timeout:
            return current
        time.sleep(poll)


# Flags of our own agent loops (name: default), which a harness run cannot honour.
OUR_LOOPS_ONLY: dict[str, Any] = {
    "policy": "heuristic",
    "llm_profile": DEFAULT_PROFILE,
    "llm_tokens": 0,
    "max_workers": 4,
    "screen_steps": 60,
    "train_steps": 200,
    "lr_scheduler_type": "cosine",
    "search_policy": DEFAULT_SEARCH_POLICY,
}


class Command(BaseCommand):
    help = "Start a research run (heuristic or LLM agents) on a benchmark."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--benchmark", default="minibench/arithmetic", help="name, name@version or uuid")
        parser.add_argument("--policy", choices=("heuristic", "llm"), default=None, help="default heuristic")
        parser.add_argument(
            "--llm-profile", default=None, help="llm policy: endpoint profile (README, RSI_LLM_PROFILES)"
        )
        parser.add_argument("--seed", type=int, default=0, help="first training seed of the heuristic's recipes")
        parser.add_argument(
            "--base", default="", help="θ0's checkpoint handle (manage.py model_add); default minibench's"
        )
        parser.add_argument("--name", default="")
        parser.add_argument("--wall-seconds", type=int, default=3600, help="wall-clock budget")
        parser.add_argument("--accelerator-seconds", type=int, default=3600, help="accelerator-seconds budget")
        parser.add_argument("--llm-tokens", type=int, default=None, help="LLM token budget (llm policy)")
        parser.add_argument("--parallel", type=int, default=2, help="most Workers active at once")
        parser.add_argument("--max-workers", type=int, default=None, help="most Workers over the run (heuristic: 4)")
        parser.add_argument("--screen-steps", type=int, default=None, help="heuristic: steps of a screening run (60)")
        parser.add_argument("--train-steps", type=int, default=None, help="heuristic: steps of a full run (200)")
        parser.add_argument("--lr-scheduler", dest="lr_scheduler_type", choices=LR_SCHEDULERS, default=None,
                            help="heuristic: every training's learning-rate schedule (cosine)")  # fmt: skip
        parser.add_argument(
            "--search-policy",
            choices=SEARCH_POLICIES,
            default=None,
            help=f"the Main Agent's search policy over the research DAG (default {DEFAULT_SEARCH_POLICY}; greedy: "
            "expand the best line; uct: upper confidence bound with stagnation detection)",
        )
        parser.add_argument("--gate", action="store_true", help="hold training for the Main Agent's approval")
        parser.add_argument("--no-reviewer", action="store_true", help="ablation: no Reviewers")
        parser.add_argument("--serial-workers", action="store_true", help="ablation: one Worker at a time")
        parser.add_argument("--wait", action="store_true", help="wait for the result and print it")
        parser.add_argument("--harness", action="store_true", help="an external harness plays the Worker (MCP)")
        parser.add_argument("--harness-main", action="store_true", help="with --harness: it plays the Main Agent too")
        parser.add_argument(
            "--harness-reviewers",
            action="store_true",
            help="with --harness-main: the harness plays the Reviewers its Main Agent requests too (by default "
            "our own Reviewer loop reviews the harness's Workers)",
        )
        parser.add_argument("--task", default="", help="with --harness: the Worker's task")
        parser.add_argument("--api-url", default="", help="with --harness: the URL harnesses reach (RSI_API_URL)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["harness"]:
            self._harness(options)
            return
        options = {**options, **{k: v for k, v in OUR_LOOPS_ONLY.items() if options[k] is None}}
        try:
            run = run_launch(
                benchmark=options["benchmark"], policy=options["policy"], llm_profile=options["llm_profile"],
                name=options["name"], seed=options["seed"],
                wall_seconds=options["wall_seconds"], accelerator_seconds=options["accelerator_seconds"],
                llm_tokens=options["llm_tokens"], parallel=options["parallel"], gate=options["gate"],
                reviewer=not options["no_reviewer"], serial_workers=options["serial_workers"],
                max_workers=options["max_workers"], screen_steps=options["screen_steps"],
                train_steps=options["train_steps"], actor="cli", base_checkpoint=self._base(options),
                search_policy=options["search_policy"], lr_scheduler_type=options["lr_scheduler_type"],
            )  # fmt: skip
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(f"run {run.uuid} started ({run.agent_mode}, {run.max_parallel_workers} parallel, "
                          f"search policy {run.search_policy})")  # fmt: skip
        if options["wait"]:
            run = wait_for_result(run, write=self.stdout.write)
            self.stdout.write(json.dumps(run_final_result(run=run), indent=2, default=str))

    def _base(self, options: dict[str, Any]) -> Checkpoint | None:
        if not options["base"]:
            return None
        found = Checkpoint.objects.filter(handle=options["base"]).first()
        if found is None:
            raise CommandError(f"No checkpoint {options['base']!r}; register it with `manage.py model_add`.")
        return found

    def _harness(self, options: dict[str, Any]) -> None:
        # A harness run honours the run's settings; what only our own loops have is refused, not dropped.
        given = [f"--{name.replace('_', '-')}" for name in OUR_LOOPS_ONLY if options[name] is not None]
        if given:
            raise CommandError(
                f"{', '.join(given)} cannot be honoured by a harness run: the harness is the agents' policy "
                "(no LLM or heuristic loop of ours runs its agents). Drop them; --parallel, --serial-workers, "
                "--seed, --gate, --no-reviewer and the budgets apply."
            )
        if options["harness_reviewers"] and not options["harness_main"]:
            raise CommandError(
                "--harness-reviewers needs --harness-main: the Main Agent requests Reviewers, and without "
                "--harness-main no harness does."
            )
        if options["harness_reviewers"] and options["no_reviewer"]:
            raise CommandError("--harness-reviewers and --no-reviewer contradict each other; drop one.")
        if not options["harness_main"] and options["gate"]:
            raise CommandError(
                "--gate holds training for the Main Agent's approval; with --harness the Main Agent is played by "
                "the harness only with --harness-main. Add --harness-main or drop --gate."
            )
        try:
            started = harness_run_start(
                benchmark=benchmark_resolve(options["benchmark"]),
                base_checkpoint=self._base(options) or base_checkpoint_default(),
                name=options["name"], task=options["task"], wall_seconds=options["wall_seconds"],
                accelerator_seconds=options["accelerator_seconds"],
                reserved_final_seconds=min(FINAL_EVAL_SECONDS * 3, options["accelerator_seconds"] // 4),
                plays_main=options["harness_main"], plays_reviewers=options["harness_reviewers"],
                parallel=1 if options["serial_workers"] else options["parallel"], seed=options["seed"],
                gate=options["gate"], reviewer=not options["no_reviewer"],
            )  # fmt: skip
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        url = options["api_url"] or settings.RSI_API_URL
        self.stdout.write(
            f"run {started.run.uuid} started (external harness, {started.run.max_parallel_workers} parallel)"
        )
        for seat in started.seats:
            self.stdout.write(f"token for {seat.node.handle} ({seat.node.kind}): {seat.token}")
        self.stdout.write("--- Claude Code: .mcp.json ---")
        self.stdout.write(json.dumps(claude_code_config(api_url=url, seats=started.seats), indent=2))
        self.stdout.write("--- Codex: ~/.codex/config.toml ---")
        self.stdout.write(codex_config(api_url=url, seats=started.seats), ending="")
        self.stdout.write("--- end ---")
