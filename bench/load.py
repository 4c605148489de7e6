"""Load: N concurrent heuristic runs × their agents × M API clients on one stack (issue 35, item 6).

    RSI_MINIBENCH_CACHE=/path/to/built/ci timeout 3600 .venv/bin/python bench/load.py \\
        --runs 1,6,12 --clients 16 --seconds 300 [--db URL] [--redis URL]

One stack, as ``manage.py demo`` runs it (bench/orchestration.py's: uvicorn + Celery gpu, agents
and default workers), on a dedicated PostgreSQL database (re-created, dropped at the end) and
Redis database (flushed). For each size N in ``--runs``:

1. N heuristic runs start on the minibench with short budgets (their agents call the API as
   they would in production); the window opens once every run is ``running`` (at most 60 s);
2. for ``--seconds``, ``--clients`` API clients (threads, one keep-alive session each) call
   tools as agents do, with agent tokens: reads with a Main token of a live run
   (``events_tail``, ``public_check_quota``), writes and reads with a Worker token of a side
   run (``experiment_log_metrics`` one point, ``experiment_metrics_read``) — the side run is
   made by the app's own services (bench/api_vs_mlflow.py ``build_ours``) so the live runs'
   research is not changed by the clients;
3. a sampler, logged in as an operator, loads dashboard pages every 2 s during the window:
   the runs list ``/``, a live run's page and its ``snapshot.json`` (round robin over the runs);
4. the runs are aborted (``run_stop(final_eval=False)``) and their jobs drained before the next size.

Reported per size: calls/s and p50/p99 per tool from the clients' own timings (and answers
other than 2xx), dashboard page times (p50/p99), and **fair share** over the window: each run's
accelerator-seconds, the overlap of its gpu-queue jobs' [started_at, finished_at or now] with
the window, and the jobs it started in the window; the spread is ``(max - min) / mean`` of the
accelerator-seconds (0 = equal), with Jain's index ``(Σx)² / (n·Σx²)`` (1 = equal, 1/n = one
run has it all). Then a growth table over the sizes and the load average before and after.

The command stops by itself (each size is bounded: ≤ 60 s to open the window, ``--seconds``,
≤ 90 s to drain), ends every process it started (the stack's process groups, also on SIGTERM;
its Lifeline on SIGKILL) and drops its database.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _setup import django_on_bench_db, minibench_stack_folders, percentile  # noqa: E402

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/rsiweb_bench_load"
OPEN_TIMEOUT = 60.0  # seconds for every run of a size to be running
DRAIN_TIMEOUT = 90.0  # seconds for the aborted runs' jobs to end
PAGE_EVERY = 2.0  # seconds between dashboard samples


class Terminated(SystemExit):
    """SIGTERM: unwind, so the stack stops and the database is dropped in ``finally``."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(128 + signum)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


@dataclass
class Timings:
    """Per-name latencies (seconds) and answers other than 2xx, from many threads."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # Why: the status code (or the client's exception) of each answer other than 2xx, per name.
    reasons: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, seconds: float, ok: bool, reason: str = "") -> None:
        with self.lock:
            self.latencies[name].append(seconds)
            if not ok:
                self.failures[name] += 1
                self.reasons[name][reason or "?"] += 1

    def why(self) -> str:
        """``name: 409×12 ReadTimeout×1; …`` for every name with answers other than 2xx."""
        with self.lock:
            return "; ".join(
                f"{name}: " + " ".join(f"{reason}×{count}" for reason, count in sorted(counts.items()))
                for name, counts in sorted(self.reasons.items())
            )

    def rows(self, wall: float) -> list[dict[str, Any]]:
        out = []
        for name in sorted(self.latencies):
            values = self.latencies[name]
            out.append({"name": name, "calls": len(values), "per_s": len(values) / wall,
                        "p50": percentile(values, 0.5) * 1000, "p99": percentile(values, 0.99) * 1000,
                        "failed": self.failures[name]})  # fmt: skip
        return out


# --- the world the clients act in ----------------------------------------------------------------


def launch_runs(n: int, size_index: int, seconds: int, args: argparse.Namespace) -> list[Any]:
    from apps.flows.runs import run_launch

    budget = seconds + int(OPEN_TIMEOUT) + 120
    return [
        run_launch(
            benchmark="minibench/arithmetic",
            policy="heuristic",
            name=f"load {n}x #{i} (size {size_index})",
            wall_seconds=budget,
            accelerator_seconds=budget * 2,
            parallel=args.parallel,
            max_workers=args.max_workers,
            screen_steps=args.screen_steps,
            train_steps=args.train_steps,
            seed=i,
            actor="bench",
        )  # fmt: skip
        for i in range(n)
    ]


def wait_running(runs: list[Any]) -> bool:
    from apps.research.models import Run

    deadline = time.monotonic() + OPEN_TIMEOUT
    while time.monotonic() < deadline:
        statuses = set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True))
        if statuses == {"running"}:
            return True
        time.sleep(1.0)
    return False


def main_tokens(runs: list[Any]) -> list[str]:
    """A fresh Main token per live run (issuing one revokes none: the run's own agents go on)."""
    from apps.expos.auth import agent_token_issue
    from apps.research.choices import NodeKind
    from apps.research.models import ResearchNode

    tokens = []
    for run in runs:
        main = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
        tokens.append(agent_token_issue(run=run, node=main, role=NodeKind.MAIN, actor="bench")[0])
    return tokens


def operator_cookie() -> dict[str, str]:
    """A logged-in operator's session cookie (the database session backend the server reads too)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username="load-bench",
                                                     defaults={"is_staff": True, "is_superuser": True})  # fmt: skip
    client = Client()
    client.force_login(user)
    return {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}


# --- the load ------------------------------------------------------------------------------------

# Steps of the side run's metric points, unique across every size: the sizes append to the same
# experiments, and a step logged again with another value is refused (409 metric_conflict).
STEPS = itertools.count()


def _reason(answer: requests.Response) -> str:
    """The status and, for an API refusal, its stable code: ``409 conflict``."""
    try:
        body = answer.json()
    except ValueError:
        return str(answer.status_code)
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return f"{answer.status_code} {code}" if code else str(answer.status_code)


def drive(base: str, *, reads: list[str], world: Any, clients: int, seconds: float, runs: list[Any],
          cookie: dict[str, str]) -> tuple[Timings, Timings, float]:  # fmt: skip
    """``clients`` threads calling tools and one sampling pages until ``seconds`` have passed."""
    tools, pages = Timings(), Timings()
    stop_at = time.monotonic() + seconds

    def call(session: requests.Session, name: str, arguments: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            answer = session.post(f"{base}/api/v1/tools/{name}", json=arguments, timeout=60)
            ok, reason = answer.status_code < 300, _reason(answer)
        except requests.RequestException as exc:
            ok, reason = False, type(exc).__name__
        tools.add(name, time.perf_counter() - started, ok, reason)

    def client(k: int) -> None:
        reader = requests.Session()
        reader.headers["Authorization"] = f"Bearer {reads[k % len(reads)]}"
        writer = requests.Session()
        token, experiment = world.appenders[k % len(world.appenders)]
        writer.headers["Authorization"] = f"Bearer {token}"
        for i in itertools.count():
            if time.monotonic() >= stop_at:
                return
            match i % 4:
                case 0:
                    call(reader, "events_tail", {"limit": 50})
                case 1:
                    point = {"key": "loss", "step": next(STEPS), "value": (i % 97) / 97}
                    call(writer, "experiment_log_metrics", {"experiment": experiment, "points": [point]})
                case 2:
                    call(reader, "public_check_quota", {})
                case 3:
                    call(writer, "experiment_metrics_read", {"experiment": experiment, "key": "loss"})

    def sampler() -> None:
        session = requests.Session()
        session.cookies.update(cookie)
        for i in itertools.count():
            if time.monotonic() >= stop_at:
                return
            run = runs[i % len(runs)]
            for name, path in (("runs list /", "/"), ("run page", f"/runs/{run.uuid}/"),
                               ("run snapshot.json", f"/runs/{run.uuid}/snapshot.json")):  # fmt: skip
                started = time.perf_counter()
                try:
                    answer = session.get(f"{base}{path}", timeout=60, allow_redirects=False)
                    ok, reason = answer.status_code == 200, _reason(answer)
                except requests.RequestException as exc:
                    ok, reason = False, type(exc).__name__
                pages.add(name, time.perf_counter() - started, ok, reason)
            time.sleep(max(0.0, min(PAGE_EVERY, stop_at - time.monotonic())))

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    threads.append(threading.Thread(target=sampler, daemon=True))
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    return tools, pages, time.monotonic() - started


def fair_share(runs: list[Any], begin: Any, end: Any) -> dict[str, Any]:
    """Each run's gpu-queue accelerator-seconds and jobs started within [begin, end], and their spread."""
    from apps.jobs.models import Job

    seconds, started = [], []
    for run in runs:
        total = 0.0
        for job in Job.objects.filter(run=run, queue="gpu", started_at__isnull=False, started_at__lt=end):
            overlap = (min(job.finished_at or end, end) - max(job.started_at, begin)).total_seconds()
            total += max(0.0, overlap)
        seconds.append(total)
        started.append(Job.objects.filter(run=run, queue="gpu", started_at__gte=begin, started_at__lt=end).count())
    mean = sum(seconds) / len(seconds)
    squares = sum(x * x for x in seconds)
    return {
        "accelerator_seconds": [round(x, 1) for x in seconds],
        "jobs_started": started,
        "spread": (max(seconds) - min(seconds)) / mean if mean else 0.0,
        "jain": (sum(seconds) ** 2) / (len(seconds) * squares) if squares else 1.0,
    }


def abort_and_drain(runs: list[Any]) -> int:
    """Abort the size's runs; wait (bounded) for their jobs to end. Returns the jobs still active."""
    from apps.core.errors import ApplicationError
    from apps.flows.runs import run_stop
    from apps.jobs.choices import JOB_ACTIVE_STATES
    from apps.jobs.models import Job

    for run in runs:
        with contextlib.suppress(ApplicationError):  # it ended by itself
            run_stop(run=run, actor="bench", reason="load bench: size measured", final_eval=False)
    deadline = time.monotonic() + DRAIN_TIMEOUT
    active = Job.objects.filter(run__in=runs, status__in=JOB_ACTIVE_STATES)
    while active.exists() and time.monotonic() < deadline:
        time.sleep(1.0)
    return active.count()


# --- report --------------------------------------------------------------------------------------


def print_size(result: dict[str, Any]) -> None:
    print(f"\n### {result['runs']} run(s) × {result['clients']} clients, {result['wall']:.0f} s window "
          f"(load average before {result['load_before']}, after {result['load_after']})")  # fmt: skip
    print("| tool / page | calls | calls/s | p50 ms | p99 ms | not 2xx |")
    print("|---|---|---|---|---|---|")
    for row in result["tools"] + result["pages"]:
        print(f"| {row['name']} | {row['calls']} | {row['per_s']:.1f} | {row['p50']:.1f} | {row['p99']:.1f} | "
              f"{row['failed']} |")  # fmt: skip
    if result["why"]:
        print(f"answers other than 2xx: {result['why']}")
    share = result["share"]
    print(f"fair share over the window: accelerator-seconds per run {share['accelerator_seconds']}, gpu jobs "
          f"started per run {share['jobs_started']}; spread (max-min)/mean {share['spread']:.2f}, "
          f"Jain {share['jain']:.2f}; jobs still active after the drain: {result['left_active']}")  # fmt: skip
    if not result["opened"]:
        print(f"(not every run was running within {OPEN_TIMEOUT:.0f} s; measured anyway)")


def print_growth(results: list[dict[str, Any]]) -> None:
    def p(result: dict[str, Any], name: str, q: str) -> str:
        rows = [r for r in result["tools"] + result["pages"] if r["name"] == name]
        return f"{rows[0][q]:.0f}" if rows else "-"

    print("\n### growth")
    print("| runs | client calls/s | log_metrics p50/p99 ms | events_tail p50/p99 ms | runs list p50/p99 ms | "
          "run page p50/p99 ms | snapshot p50/p99 ms | fair-share spread / Jain | load avg after |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        total = sum(row["calls"] for row in r["tools"]) / r["wall"]
        cells = [
            f"{p(r, n, 'p50')}/{p(r, n, 'p99')}"
            for n in ("experiment_log_metrics", "events_tail", "runs list /", "run page", "run snapshot.json")
        ]
        print(f"| {r['runs']} | {total:.1f} | {' | '.join(cells)} | {r['share']['spread']:.2f} / "
              f"{r['share']['jain']:.2f} | {r['load_after']} |")  # fmt: skip


# --- main ----------------------------------------------------------------------------------------


def drop_database(url: str) -> None:
    from django.db import connections

    connections.close_all()
    dbname = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="1,6,12", help="sizes: concurrent runs, comma separated")
    parser.add_argument("--clients", type=int, default=16, help="concurrent API clients")
    parser.add_argument("--seconds", type=int, default=300, help="measured window per size")
    parser.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB),
                        help="PostgreSQL database (re-created, dropped at the end)")  # fmt: skip
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/12"),
                        help="Redis database of the stack (flushed)")  # fmt: skip
    parser.add_argument("--parallel", type=int, default=2, help="Workers researching at once, per run")
    parser.add_argument("--max-workers", type=int, default=3)
    parser.add_argument("--screen-steps", type=int, default=20)
    parser.add_argument("--train-steps", type=int, default=40)
    args = parser.parse_args()
    sizes = [int(n) for n in args.runs.split(",") if n.strip()]
    if not sizes or min(sizes) < 1 or args.clients < 1 or args.seconds < 1:
        sys.exit("--runs needs sizes >= 1, --clients and --seconds >= 1")
    signal.signal(signal.SIGTERM, _terminated)
    os.environ["BENCH_DATABASE_URL"] = args.db
    os.environ["REDIS_URL"] = args.redis
    cache, base = minibench_stack_folders("/tmp/rsiweb-bench-load")
    print(f"before: {uptime()}", flush=True)
    django_on_bench_db(fresh=True)
    stack = None
    results: list[dict[str, Any]] = []
    try:
        import redis
        from api_vs_mlflow import build_ours
        from django.conf import settings
        from django.utils import timezone
        from orchestration import _start_stack

        from apps.benchmarks.services import minibench_install

        redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
        minibench_install(root=Path(cache))
        stack = _start_stack(base)
        world = build_ours(stack.url, list_size=0, history=0)
        cookie = operator_cookie()
        print(f"stack up at {stack.url}", flush=True)
        for index, n in enumerate(sizes):
            runs = launch_runs(n, index, args.seconds, args)
            opened = wait_running(runs)
            reads = main_tokens(runs)
            load_before = os.getloadavg()[0]
            begin = timezone.now()
            tools, pages, wall = drive(stack.url, reads=reads, world=world, clients=args.clients,
                                       seconds=args.seconds, runs=runs, cookie=cookie)  # fmt: skip
            end = timezone.now()
            result = {"runs": n, "clients": args.clients, "wall": wall, "opened": opened,
                      "tools": tools.rows(wall), "pages": pages.rows(wall),
                      "why": "; ".join(w for w in (tools.why(), pages.why()) if w),
                      "share": fair_share(runs, begin, end),
                      "load_before": f"{load_before:.2f}", "load_after": f"{os.getloadavg()[0]:.2f}"}  # fmt: skip
            result["left_active"] = abort_and_drain(runs)
            results.append(result)
            print_size(result)
            sys.stdout.flush()
    finally:
        if stack is not None:
            stack.stop()
        drop_database(args.db)
        redis_client = __import__("redis").Redis.from_url(args.redis)
        redis_client.flushdb()
    if results:
        print_growth(results)
    print(f"\nafter: {uptime()}")
    print(f"machine: {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
