"""The README's main job: a full research run on the embedded default, from one command.

``manage.py demo`` migrates, builds and installs the minibench (once), starts the same processes
production runs — the web server (``manage.py serve``: uvicorn) and real ``celery worker``
processes for the ``gpu``, ``agents`` and ``default`` queues, here on the SQLite broker — then
starts a heuristic run, waits for the run to end and reports its
result: the accepted checkpoint with the best feedback score, evaluated on the final split next
to θ0 and the reference.
The web server starts first and the dashboard answers at once, showing the minibench build's
progress (apps.benchmarks.build_progress) while the workers start and the build runs; the run
starts once the build is installed. ``--no-run`` starts the stack without building the minibench
or starting a run. After the run the stack keeps serving until Ctrl-C (``--no-keep-serving``
exits with the run), printing where to look. The stack's processes end with this command, however it ends
(Ctrl-C, SIGTERM, SIGKILL), and a start refuses a port that a stale server still holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter

from apps.core.errors import ApplicationError
from apps.core.management.commands.serve import uvicorn_command
from apps.core.procs import Lifeline, PortInUse, port_check_free
from apps.experiments.models import Checkpoint, Evaluation
from apps.flows.management.commands.start_run import wait_for_result
from apps.flows.reports import run_review_story
from apps.flows.runs import run_final_result, run_launch
from apps.flows.scores import MIN_GAIN, beats_theta0
from apps.research.choices import Trigger
from apps.research.models import Decision
from apps.reviews.models import ReviewReport

ROOT = Path(__file__).resolve().parents[4]
# Each --profile's namespace (its build's manifest): the demo profile registers apart from a ci build
# (apps.benchmarks.minibench.demo.NAMESPACE; not imported: that package loads torch).
NAMESPACES = {"demo": "minibench-demo", "ci": "minibench", "full": "minibench"}


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class Stack:
    """The web server and the Celery workers as subprocesses sharing one environment.

    Each process gets its own session (process group), so ``kill()`` takes a worker and its pool
    children down at once — the restart test uses that to stop everything mid-run. Every group is
    tied to the process that started it by a Lifeline: none outlives it, however it ends (SIGTERM,
    SIGKILL, a crash). The web server's port is checked first: a start refuses a port that a
    stale server still holds rather than talk to it.
    """

    env: dict[str, str]
    log_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    gpu_slots: int = 1
    agent_threads: int = 4
    # Threads on one machine; production's agents worker forks (compose.yaml), and so do the
    # tests of a pool child that dies alone.
    agent_pool: str = "threads"
    # A process's command line instead of the one below (the fault suite runs compose.yaml's).
    overrides: dict[str, list[str]] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _logs: list[Any] = field(default_factory=list)
    _lifeline: Lifeline | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def commands(self) -> dict[str, list[str]]:
        python = sys.executable
        worker = [python, "-m", "celery", "-A", "rsiweb", "worker", "--without-gossip", "--without-mingle",
                  "--without-heartbeat", "--loglevel=INFO"]  # fmt: skip
        return {
            "web": uvicorn_command(host=self.host, port=self.port),
            # One single-threaded slot per accelerator (DESIGN.md "Execution"); on CPU a few slots.
            "gpu": [*worker, "-Q", "gpu", "-n", "gpu@%h", "--pool=prefork", f"--concurrency={self.gpu_slots}"],
            # Agent steps are short and I/O bound: threads, several at once.
            "agents": [
                *worker,
                "-Q",
                "agents",
                "-n",
                "agents@%h",
                f"--pool={self.agent_pool}",
                f"--concurrency={self.agent_threads}",
            ],  # fmt: skip
            "default": [*worker, "-Q", "default", "-n", "default@%h", "--pool=prefork", "--concurrency=1"],
        } | self.overrides

    def start(self, names: tuple[str, ...] = ("web", "gpu", "agents", "default")) -> Stack:
        """Start ``names``; raises PortInUse (starting nothing) when the web server's port is taken."""
        if "web" in names:
            port_check_free(self.host, self.port)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "RSI_API_URL": self.url, "PYTHONUNBUFFERED": "1"}
        if self._lifeline is None:
            self._lifeline = Lifeline()
        for name in names:
            log = (self.log_dir / f"{name}.log").open("ab")
            self._logs.append(log)
            self.processes[name] = subprocess.Popen(
                self.commands()[name], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            self._lifeline.add(self.processes[name].pid)
        return self

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_ready(self, timeout: float = 180) -> None:
        """Workers print ``ready.``; the web server answers /healthz."""
        deadline = time.monotonic() + timeout
        pending = set(self.processes)
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                process = self.processes[name]
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.log(name)[-3000:]}")
                if name == "web":
                    try:
                        if httpx.get(f"{self.url}/healthz", timeout=2).status_code < 500:
                            pending.discard(name)
                    except httpx.HTTPError:
                        pass
                elif " ready." in self.log(name):
                    pending.discard(name)
            time.sleep(0.3)
        if pending:
            raise RuntimeError(f"not ready after {timeout:.0f}s: {sorted(pending)}")

    def kill(self) -> None:
        """SIGKILL every process group: no shutdown, no acknowledgement (a crash, as in a power cut)."""
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes.values():
            process.wait(timeout=30)
        self._forget()

    def stop(self) -> None:
        """SIGTERM every process group (a warm shutdown), SIGKILL what is left after 30 s."""
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self._forget()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def _forget(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # a pool child that outlived its leader
            if self._lifeline is not None:
                # Reaped: its group number may be reused by an unrelated group from now on.
                self._lifeline.forget(process.pid)
        self.processes.clear()


class _HelpFormatter(DjangoHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Django's order (its own options last) with each option's default after its help."""


class Terminated(SystemExit):
    """SIGTERM arrived: unwind (the stack stops in ``finally``) and exit with 128 + SIGTERM."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(128 + signum)


def theta0_verdict(run: Any) -> str:
    """ "beats θ0" only when the one rule holds (``beats_theta0``: a gain of MIN_GAIN and a CI above 0)."""
    beats, why, evidence = beats_theta0([run])
    rule = f"(rule: gain >= {MIN_GAIN} and CI above 0)"
    if beats:
        return (f"beats θ0 on the final split: gain {evidence['difference']:.3f}, 95 % CI "
                f"[{evidence['ci_low']:.3f}, {evidence['ci_high']:.3f}] {rule}")  # fmt: skip
    return f"does NOT beat θ0 on the final split: {why} {rule}"


class Command(BaseCommand):
    help = (
        "The first five minutes: serve the dashboard at once, build the minibench (first time only; its progress "
        "on the page and here), then run a heuristic research run on the embedded default and keep serving "
        "until Ctrl-C."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # Every option's help ends with its default (Django's own options included).
        return super().create_parser(prog_name, subcommand, formatter_class=_HelpFormatter, **kwargs)

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address the web server listens on")
        parser.add_argument("--port", type=int, default=8000, help="port of the web server")
        parser.add_argument(
            "--no-serve", action="store_true", help="prepare only (migrate, print the admin login), start nothing"
        )
        parser.add_argument(
            "--no-run",
            action="store_true",
            help="serve the dashboard and start the workers, build nothing and start no run",
        )
        parser.add_argument(
            "--keep-serving",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="keep serving after the run until Ctrl-C; --no-keep-serving exits with the run",
        )
        parser.add_argument(
            "--profile",
            choices=tuple(NAMESPACES),
            default="demo",
            help="minibench to build: demo (the ci task with a reference trained in minutes), ci (one task, "
            "arithmetic, the 1,000-step reference) or full (every task)",
        )
        parser.add_argument(
            "--benchmark", default=None, help="the run's sealed benchmark (default: the profile's arithmetic)"
        )
        # The defaults are sized for a first result within ten minutes on two cores (issue 36, item 8;
        # docs/benchmarks.md "The first ten minutes"): batches of 32, four Workers; the Main Agent keeps
        # one slot for a pending review's follow-ups, so the first report can change a decision.
        parser.add_argument(
            "--accelerator-seconds", type=int, default=1500, help="the run's accelerator budget (gpu-queue seconds)"
        )
        parser.add_argument("--wall-seconds", type=int, default=900, help="the run's wall-clock budget")
        parser.add_argument("--parallel", type=int, default=2, help="Workers researching at once")
        parser.add_argument("--max-workers", type=int, default=4, help="Workers the Main Agent may open in all")
        parser.add_argument(
            "--screen-steps", type=int, default=30, help="training steps of a Worker's screening experiments"
        )
        parser.add_argument(
            "--train-steps", type=int, default=150, help="training steps of a Worker's full experiments"
        )
        parser.add_argument("--batch-size", type=int, default=32, help="batch size of the Workers' trainings")
        # On a CPU host, one single-threaded training slot per core (DESIGN.md "Execution").
        parser.add_argument(
            "--gpu-slots",
            type=int,
            default=max(1, min(2, os.cpu_count() or 1)),
            help="training/evaluation slots of the gpu worker (this machine's cores, at most 2)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["no_serve"]:
            self._check_port(options["host"], options["port"])  # before anything, so a refusal is quick
        call_command("migrate", interactive=False, verbosity=0)
        password = self._admin_password()
        url = f"http://{options['host']}:{options['port']}/"
        self.stdout.write(f"rsiweb data folder: {settings.DATA_DIR}")
        if options["no_serve"]:
            self.stdout.write(f"dashboard (once served): {url}   login: admin / {password}")
            return
        stack = Stack(env=dict(os.environ, DJANGO_SETTINGS_MODULE=os.environ.get("DJANGO_SETTINGS_MODULE",
                                                                                  "rsiweb.settings.base")),
                      log_dir=Path(settings.DATA_DIR) / "logs", host=options["host"], port=options["port"],
                      gpu_slots=options["gpu_slots"])  # fmt: skip
        started = time.monotonic()
        # SIGTERM (a service manager, `kill`) stops the stack as Ctrl-C does; SIGKILL cannot be
        # caught, and the stack's Lifeline ends the processes then.
        signal.signal(signal.SIGTERM, _terminated)
        try:
            try:
                # The web server first, alone: the dashboard needs nothing the build makes, so it
                # answers (and shows the build's progress) while the workers start and the build runs.
                stack.start(("web",))
            except PortInUse as exc:  # taken since the check above
                raise CommandError(str(exc)) from None
            stack.wait_ready()
            up = time.monotonic() - started
            self.stdout.write(f"dashboard: {url}   login: admin / {password}   (answering after {up:.0f}s)")
            self.stdout.flush()
            stack.start(("gpu", "agents", "default"))
            if not options["no_run"]:
                self.stdout.write("minibench: building (first time only; the dashboard shows the same bar) ...")
                self.stdout.flush()
                call_command("build_minibench", profile=options["profile"], stdout=self.stdout)
            stack.wait_ready()
            self.stdout.write(f"stack up: web {stack.url}, workers gpu/agents/default (logs in {stack.log_dir})")
            self.stdout.flush()
            if options["no_run"]:
                self.stdout.write(f"serving {url} until interrupted (Ctrl-C); no run started")
                self.stdout.flush()
                while True:
                    time.sleep(3600)
            run = self._start_run(options)
            self.stdout.write(f"run {run.name!r} started: {url}runs/{run.uuid}/  (heuristic policy, not an LLM)")
            run = self._follow(run)
            result = run_final_result(run=run)
            self._report(run, result, time.monotonic() - started)
            self._reviews(run)
            if options["keep_serving"]:
                self._where_to_look(url, run)
                while True:
                    time.sleep(3600)
        except KeyboardInterrupt:
            self.stdout.write("interrupted")
        finally:
            stack.stop()

    def _follow(self, run: Any, poll: float = 3.0) -> Any:
        """Wait for the run's end (as ``start_run --wait``), printing each Reviewer report and each
        decision the Main Agent takes on one as they are recorded: the story the run page tells."""
        reports: set[int] = set()
        decisions: set[int] = set()
        first_seen = False

        def into_run(current: Any, when: Any) -> float:
            return (when - current.started_at).total_seconds() if current.started_at else 0.0

        def news(current: Any) -> None:
            nonlocal first_seen
            if not first_seen:
                first = (Evaluation.objects.filter(run=current, experiment__isnull=False, split="feedback",
                                                   score__isnull=False)
                         .select_related("experiment").order_by("created_at").first())  # fmt: skip
                if first is not None and first.experiment is not None:
                    first_seen = True
                    at = into_run(current, first.created_at)
                    self.stdout.write(f"first result: {first.experiment.handle} scored {first.score:.3f} on the "
                                      f"feedback split, {at:.0f}s into the run")  # fmt: skip
            for report in ReviewReport.objects.filter(run=current).exclude(pk__in=reports).select_related("reviewer"):
                reports.add(report.pk)
                at = into_run(current, report.created_at)
                self.stdout.write(f"review: {report.reviewer.handle} reported {at:.0f}s into the run: "
                                  f"{_first_line(report.summary)}")  # fmt: skip
            taken = Decision.objects.filter(run=current, trigger=Trigger.REVIEW_REPORT).exclude(pk__in=decisions)
            for decision in taken.order_by("created_at"):
                decisions.add(decision.pk)
                self.stdout.write(f"decision on the review: {decision.kind}: {_first_line(decision.rationale)}")
            self.stdout.flush()

        return wait_for_result(run, write=self.stdout.write, poll=poll, on_poll=news)

    def _reviews(self, run: Any) -> None:
        """What the Reviewers found and which decision they changed: ``run_review_story``."""
        story = run_review_story(run=run)
        self.stdout.write(f"reviews: {len(story.reports)} Reviewer report(s); "
                          f"{len(story.changed)} decision(s) taken on a report")  # fmt: skip
        for item in story.changed:
            self.stdout.write(
                f"  {item.reviewer} -> decision {item.decision.kind}: {_first_line(item.decision.rationale)}"
            )
            for evidence in item.evidence:
                self.stdout.write(f"      evidence: {evidence}")
        self.stdout.flush()

    def _theta0(self, namespace: str) -> Any:
        return Checkpoint.objects.filter(handle=f"{namespace}/theta0", is_base=True).first()

    def _where_to_look(self, url: str, run: Any) -> None:
        page = f"{url}runs/{run.uuid}/"
        for line in (
            f"serving {url} until interrupted (Ctrl-C). Where to look:",
            f"  the result, the research DAG and the charts: {page}",
            f"  the integrity report:                        {page}integrity/",
            f"  every run (search, compare, start another):  {url}",
            f"  the API and its docs:                        {url}api/v1/docs/",
            f"  the servers' and workers' logs:              {settings.DATA_DIR}/logs/",
        ):
            self.stdout.write(line)
        self.stdout.flush()

    def _check_port(self, host: str, port: int) -> None:
        try:
            port_check_free(host, port)
        except PortInUse as exc:
            raise CommandError(str(exc)) from None

    def _start_run(self, options: dict[str, Any]) -> Any:
        namespace = NAMESPACES[options["profile"]]
        try:
            return run_launch(
                benchmark=options["benchmark"] or f"{namespace}/arithmetic", policy="heuristic",
                name="demo: heuristic research run", base_checkpoint=self._theta0(namespace),
                wall_seconds=options["wall_seconds"], accelerator_seconds=options["accelerator_seconds"],
                parallel=options["parallel"], max_workers=options["max_workers"],
                screen_steps=options["screen_steps"], train_steps=options["train_steps"],
                batch_size=options["batch_size"], actor="demo",
            )  # fmt: skip
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None

    def _report(self, run: Any, result: dict[str, Any] | None, seconds: float) -> None:
        # The run's own time (its start to its end), not the command's: the stack's start and the
        # minibench build before it are not the run's.
        ran = (run.finished_at - run.started_at).total_seconds() if run.started_at and run.finished_at else None
        took = f"after {ran:.0f}s" if ran is not None else "(no start or end recorded)"
        self.stdout.write(f"run ended: {run.status} {took} (this command has been up {seconds:.0f}s)")
        if not result:
            self.stdout.write("no final result was recorded")
            return

        def score(row: dict[str, Any] | None) -> str:
            return "n/a" if not row or row.get("final_score") is None else f"{row['final_score']:.3f}"

        best = result.get("best") or {}
        self.stdout.write(f"final split: θ0 {score(result.get('theta0'))} | reference {score(result.get('reference'))}"
                          f" | returned {best.get('checkpoint_handle', 'none')} ({best.get('experiment', '-')}, "
                          f"feedback {best.get('feedback_score')}) {score(best)}")  # fmt: skip
        for row in result.get("candidates", []):
            self.stdout.write(f"  other accepted candidate {row.get('experiment')}: final {score(row)} (not used "
                              "for selection)")  # fmt: skip
        self.stdout.write(f"result: the returned checkpoint {theta0_verdict(run)}")
        self.stdout.write(json.dumps(result, default=str))

    def _admin_password(self) -> str:
        """One admin per install; its password lives in the data folder, readable only by us."""
        path = settings.DATA_DIR / "admin_password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(12))
            path.chmod(0o600)
        password = path.read_text().strip()
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(username="admin", defaults={"is_staff": True, "is_superuser": True})
        if not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
        return password
