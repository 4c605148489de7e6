"""The ExpOS REST API against MLflow's tracking server, side by side on one machine (issue 4).

    REDIS_URL=redis://127.0.0.1:6379/6 timeout 1800 .venv/bin/python bench/api_vs_mlflow.py

Both servers run here, on the same PostgreSQL: rsiweb under ``manage.py serve`` (uvicorn, as ``manage.py demo`` serves
it) on ``rsiweb_bench_api``, MLflow's ``mlflow server`` on databases of its own, once with
``--workers 4`` (its default, ``mlflow_bench_w4``) and once with ``--workers 1``
(``mlflow_bench_w1``). All of them are dropped and re-created. MLflow lives in its own
virtualenv, ``var/bench-mlflow-venv``, which this script creates on first use
(``python3.11 -m venv`` + ``pip install mlflow==MLFLOW_VERSION psycopg2-binary``), so it is never
installed into the project's ``.venv``.

Every request goes through a keep-alive ``requests.Session``; concurrent clients are threads,
one session each. All three servers run at once and each figure is measured on them in turn, in
alternating slices, so they see the same load on a shared machine. What is compared
(docs/benchmarks.md explains the mapping):

=====================  ====================================================  ===========================
figure                 rsiweb                                                MLflow REST
=====================  ====================================================  ===========================
create a record        POST /api/v1/tools/worker_submit (eval_only)          runs/create
append one record      POST /api/v1/tools/experiment_log_metrics (1 point)   runs/log-metric
  (1 and 8 clients)
batched append         POST /api/v1/tools/experiment_log_metrics (1,000)     runs/log-batch (1,000 metrics)
read a 10,000 history  POST /api/v1/tools/experiment_metrics_read            metrics/get-history
list 1,000 records     GET /api/v1/experiments/?limit=1000                   runs/search (max_results 1000)
tiny GET               GET /healthz                                          GET /health
=====================  ====================================================  ===========================

The floor (issue 14): ``POST /bench/floor`` on the same rsiweb server (bench/_floor_urls.py, served
with bench/_settings_floor.py) parses a JSON point, INSERTs one row and COMMITs. It is measured in
the same interleaved slices as the single appends, with the same clients, so the append's cost
over "HTTP plus one durable commit" is read from one run.

MLflow's multi-worker server restarts a worker under load now and then; a request that meets a
dropped connection is retried (at most ``RETRIES`` times, ``Session``) and counted, and the
counts are printed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _setup import percentile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MLFLOW_VERSION = "3.17.2"
MLFLOW_VENV = ROOT / "var" / "bench-mlflow-venv"
PG = "postgres://postgres@127.0.0.1:5432"
API_DB = "rsiweb_bench_api"
MLFLOW_DB = "mlflow_bench"
DATA_DIR = ROOT / "var" / "bench-api"
SECRET = "bench-only-secret-key-0123456789-0123456789-0123456789"


def loadavg() -> float:
    return os.getloadavg()[0]


# --- measuring ----------------------------------------------------------------------------------


@dataclass
class Figure:
    """One operation measured on one server: per-request latencies and the wall time of them all."""

    latencies: list[float]
    wall: float
    load: float
    unit_per_call: int = 1  # records per request (1,000 for a batch)
    retries: int = 0  # requests repeated after a dropped connection (included in their latency)

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.wall

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) * 1000

    @property
    def p95(self) -> float:
        return percentile(self.latencies, 0.95) * 1000


# Call numbers are unique across the whole run: MLflow's steps and our file names come from them.
counter = iter(range(10**9))
RETRIES = 5
retried = {"count": 0}
_retried_lock = threading.Lock()
# A worker that is restarted drops its connections: refused, reset, or cut mid-answer.
_DROPPED = (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)


class Session(requests.Session):
    """A keep-alive session that repeats a request whose connection dropped, and counts it.

    MLflow's multi-worker server restarts a worker under load now and then. Only dropped
    connections are retried, never an answer with a bad status. Repeating a request that may
    already have been applied is harmless here: appends are idempotent per (key, step) on our
    side, creates carry an Idempotency-Key (the same one on the retry), and an extra MLflow run
    or metric point does not change what is measured.
    """

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        for attempt in range(RETRIES + 1):
            try:
                return super().request(*args, **kwargs)
            except _DROPPED:
                if attempt == RETRIES:
                    raise
                with _retried_lock:
                    retried["count"] += 1
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")


def measure(
    make_session: Callable[[], requests.Session],
    call: Callable[[requests.Session, int], None],
    *,
    calls: int,
    clients: int = 1,
    warmup: int = 3,
) -> Figure:
    """``calls`` requests split over ``clients`` threads (one keep-alive session each), after a warm-up."""
    sessions = [make_session() for _ in range(clients)]
    lock = threading.Lock()

    def next_index() -> int:
        with lock:
            return next(counter)

    for session in sessions:  # open the connection and warm the server's code paths
        for _ in range(warmup):
            call(session, next_index())
    retries_before = retried["count"]
    latencies: list[float] = []
    errors: list[BaseException] = []
    share = [calls // clients + (1 if i < calls % clients else 0) for i in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(session: requests.Session, count: int) -> None:
        mine = []
        barrier.wait()
        try:
            for _ in range(count):
                started = time.perf_counter()
                call(session, next_index())
                mine.append(time.perf_counter() - started)
        except BaseException as exc:  # reported below; a failed figure must not look fast
            errors.append(exc)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(s, n)) for s, n in zip(sessions, share, strict=True)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    for session in sessions:
        session.close()
    if errors:
        raise errors[0]
    return Figure(latencies=latencies, wall=wall, load=loadavg(), retries=retried["count"] - retries_before)


def expect(response: requests.Response, *codes: int) -> dict[str, Any]:
    if response.status_code not in codes:
        raise RuntimeError(f"{response.request.method} {response.url}: {response.status_code} {response.text[:500]}")
    return response.json()


# --- servers ------------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, log: Path, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    """Stop a server we started, with the process group it made (MLflow's workers)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, 15)
            process.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, 9)
            process.wait(timeout=5)


def recreate_database(name: str) -> None:
    subprocess.run(["psql", f"{PG}/postgres", "-qc", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"], check=True)
    subprocess.run(["psql", f"{PG}/postgres", "-qc", f"CREATE DATABASE {name}"], check=True)


def ensure_mlflow_venv() -> Path:
    """MLflow in its own virtualenv (never the project's): created and pinned on first use."""
    mlflow = MLFLOW_VENV / "bin" / "mlflow"
    pip = MLFLOW_VENV / "bin" / "pip"
    if mlflow.exists():
        installed = subprocess.run(
            [str(MLFLOW_VENV / "bin" / "python"), "-c", "import mlflow; print(mlflow.__version__)"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        if installed == MLFLOW_VERSION:
            return mlflow
    print(f"installing mlflow=={MLFLOW_VERSION} into {MLFLOW_VENV} ...", flush=True)
    if not pip.exists():
        subprocess.run(["python3.11", "-m", "venv", str(MLFLOW_VENV)], check=True)
    subprocess.run([str(pip), "install", "-q", f"mlflow=={MLFLOW_VERSION}", "psycopg2-binary"], check=True)
    return mlflow


def start_rsiweb(port: int, processes: int, *, root: Path = ROOT, **overrides: str) -> subprocess.Popen:
    """``manage.py serve`` (uvicorn), as compose.yaml and ``manage.py demo`` run it, plus the floor endpoint.

    ``root``: the checkout whose code it serves; ``overrides``: more environment for it.
    """
    log = Path(f"/tmp/bench-api-rsiweb-{port}.log")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench._settings_floor",
        "DATABASE_URL": f"{PG}/{API_DB}",
        "SECRET_KEY": SECRET,
        "RSI_DATA_DIR": str(DATA_DIR),
        "RSI_LOG_LEVEL": "WARNING",
        # The throttle stays in the path (its leases from Redis, as in production) but must not
        # refuse a benchmark's thousands of calls a minute.
        "RSI_TOKEN_RATE": "10000000/min",
        **overrides,
    }
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--processes", str(processes)],
        cwd=root, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    wait_for(f"http://127.0.0.1:{port}/healthz", process, log)
    return process


def start_mlflow(mlflow: Path, port: int, workers: int, database: str) -> subprocess.Popen:
    log = Path(f"/tmp/bench-mlflow-w{workers}.log")
    artifacts = DATA_DIR / "mlflow-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            str(mlflow), "server",
            "--backend-store-uri", f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
            "--default-artifact-root", artifacts.as_uri(),
            "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        ],
        cwd=DATA_DIR, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        # SQLAlchemy's default pool (5 + 10 overflow per worker process) can take 60 of the shared
        # server's 100 connections; 2 kept + 6 overflow still serves 8 concurrent clients.
        env={**os.environ, "MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": "2", "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": "6"},
    )  # fmt: skip
    wait_for(f"http://127.0.0.1:{port}/health", process, log, seconds=300)
    return process


# --- rsiweb ---------------------------------------------------------------------------------------


@dataclass
class OursWorld:
    base: str
    submitter: str  # tokens of Workers
    appenders: list[tuple[str, str]]  # (token, the handle of an experiment the Worker owns)
    lister: str
    history_experiment: str  # an experiment of the lister's with a ``history``-point metric
    batch_experiment: str  # an experiment of the submitter's


def django_setup() -> None:
    os.environ.update(
        DATABASE_URL=f"{PG}/{API_DB}",
        SECRET_KEY=SECRET,
        RSI_DATA_DIR=str(DATA_DIR),
        DJANGO_SETTINGS_MODULE="rsiweb.settings.base",
    )
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/6")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connection

    from bench._floor_urls import CREATE_FLOOR_TABLE

    with connection.cursor() as cursor:
        cursor.execute(CREATE_FLOOR_TABLE)


def build_ours(base: str, *, list_size: int, history: int) -> OursWorld:
    """One running run, Workers with tokens (made by the app's own services), and the rows to read."""
    from apps.experiments.services import experiment_create, metric_points_log
    from apps.expos.auth import agent_token_issue
    from apps.research.choices import NodeKind, RunStatus
    from apps.research.models import Run
    from apps.research.services import node_create, run_set_status
    from tests.factories import make_run

    run = make_run(name="api-vs-mlflow", max_parallel_workers=20)
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="bench")
    # Every eval-only submission spends one feedback evaluation: of the Worker, of the checkpoint
    # and of the run (the run policy's quotas, docs/run-policy.md).
    unlimited = dict.fromkeys(
        ("feedback_evals_per_worker", "feedback_evals_per_checkpoint", "feedback_evals_per_run"), 10**6
    )
    Run.objects.filter(pk=run.pk).update(policy={**run.policy, **unlimited})

    def worker(task: str) -> tuple[Any, str]:
        node = node_create(run=run, kind=NodeKind.WORKER, task=task)
        return node, agent_token_issue(run=run, node=node, role=NodeKind.WORKER)[0]

    def experiment(owner: Any, claim: str) -> Any:
        return experiment_create(
            run=run, owner=owner, kind="eval_only", input_checkpoint=run.base_checkpoint,
            action={"evaluate": "feedback", "claim": claim}, status="succeeded",
        )  # fmt: skip

    submitter, submitter_token = worker("submits experiments")
    batch_experiment = experiment(submitter, "batched metrics")
    appenders = []
    for i in range(8):
        node, token = worker(f"appender {i}")
        appenders.append((token, experiment(node, f"appended metrics {i}").handle))
    lister, lister_token = worker("owns the listed experiments")
    for i in range(list_size):
        experiment(lister, f"listed {i}")
    # A ``history``-point metric, logged as experiment_log_metrics logs it.
    history_experiment = experiment(lister, "a long history")
    rng = random.Random(0)
    metric_points_log(
        experiment=history_experiment, points=[("loss", step, round(rng.random() * 3, 6)) for step in range(history)]
    )
    return OursWorld(
        base=base, submitter=submitter_token, appenders=appenders, lister=lister_token,
        history_experiment=history_experiment.handle, batch_experiment=batch_experiment.handle,
    )  # fmt: skip


class Ours:
    def __init__(self, world: OursWorld, *, history: int, list_size: int, batch_size: int) -> None:
        self.w = world
        self.history = history
        self.list_size = list_size
        self.batch_size = batch_size
        self._appender = iter(range(10**9))
        self._lock = threading.Lock()

    def session(self, token: str | None = None) -> requests.Session:
        s = Session()
        if token:
            s.headers["Authorization"] = f"Bearer {token}"
        return s

    def submitter(self) -> requests.Session:
        return self.session(self.w.submitter)

    def appender(self) -> requests.Session:
        """Each concurrent client is its own Worker logging on its own experiment, as eight agents would."""
        with self._lock:
            token, handle = self.w.appenders[next(self._appender) % len(self.w.appenders)]
        s = self.session(token)
        s.bench_experiment = handle  # type: ignore[attr-defined]
        return s

    def lister(self) -> requests.Session:
        return self.session(self.w.lister)

    def tool(self, s: requests.Session, name: str, args: dict[str, Any], key: bool = False) -> dict[str, Any]:
        headers = {"Idempotency-Key": uuid.uuid4().hex} if key else {}
        return expect(s.post(f"{self.w.base}/api/v1/tools/{name}", json=args, headers=headers), 200, 201)

    def tiny(self, s: requests.Session, i: int) -> None:
        expect(s.get(f"{self.w.base}/healthz"), 200)

    def create(self, s: requests.Session, i: int) -> None:
        # The agents' client sends an Idempotency-Key with every create; so do we.
        self.tool(s, "worker_submit", {"kind": "eval_only", "claim": f"bench {i}"}, key=True)

    def append(self, s: requests.Session, i: int) -> None:
        # No Idempotency-Key needed: a point is kept once per (key, step), so a retry is harmless.
        point = {"key": "loss", "step": i, "value": random.random()}
        answer = self.tool(s, "experiment_log_metrics", {"experiment": s.bench_experiment, "points": [point]})
        if answer["logged"] != 1:
            raise RuntimeError(f"append {i}: {answer}")

    def batch(self, s: requests.Session, i: int) -> None:
        points = [
            {"key": "loss", "step": i * self.batch_size + j, "value": random.random()} for j in range(self.batch_size)
        ]
        answer = self.tool(s, "experiment_log_metrics", {"experiment": self.w.batch_experiment, "points": points})
        if answer["logged"] != self.batch_size:
            raise RuntimeError(f"batch {i}: {answer}")

    def read_history(self, s: requests.Session, i: int) -> None:
        args = {"experiment": self.w.history_experiment, "key": "loss"}
        points = self.tool(s, "experiment_metrics_read", args)["points"]
        if len(points) != self.history:
            raise RuntimeError(f"history has {len(points)} points, expected {self.history}")

    def list(self, s: requests.Session, i: int) -> None:
        rows = 0
        while rows < self.list_size:  # pages of up to 1,000 (the API's ceiling)
            params = {"limit": self.list_size, "offset": rows}
            page = expect(s.get(f"{self.w.base}/api/v1/experiments/", params=params), 200)["results"]
            if not page:
                break
            rows += len(page)
        if rows != self.list_size:
            raise RuntimeError(f"listed {rows} experiments, expected {self.list_size}")


class Floor:
    """``POST /bench/floor`` on the rsiweb server: a JSON point, one INSERT, one COMMIT."""

    def __init__(self, base: str) -> None:
        self.base = base

    def session(self) -> requests.Session:
        return Session()

    def append(self, s: requests.Session, i: int) -> None:
        point = {"key": "loss", "step": i, "value": random.random()}
        if expect(s.post(f"{self.base}/bench/floor", json=point), 200)["logged"] != 1:
            raise RuntimeError(f"floor {i}: not logged")


# --- MLflow ---------------------------------------------------------------------------------------


class Mlflow:
    """MLflow's REST API (what MlflowClient sends) through the same keep-alive sessions."""

    def __init__(self, base: str, *, history: int, list_size: int, batch_size: int, clients: int) -> None:
        self.api = f"{base}/api/2.0/mlflow"
        self.base = base
        self.history = history
        self.list_size = list_size
        self.batch_size = batch_size
        s = Session()
        self.experiment = self.create_experiment(s, "bench")
        self.metric_run = self.create_run_id(s, self.experiment)
        self.client_runs = [self.create_run_id(s, self.experiment) for _ in range(clients)]
        self.batch_run = self.create_run_id(s, self.experiment)
        self.history_run = self.create_run_id(s, self.experiment)
        self._client = iter(range(10**9))
        self._lock = threading.Lock()
        self._local = threading.local()
        rng = random.Random(0)
        now = int(time.time() * 1000)
        for start in range(0, history, 1000):
            metrics = [
                {"key": "loss", "value": round(rng.random() * 3, 6), "timestamp": now, "step": step}
                for step in range(start, min(history, start + 1000))
            ]
            expect(s.post(f"{self.api}/runs/log-batch", json={"run_id": self.history_run, "metrics": metrics}), 200)
        # The listed runs: their own experiment, each run with a status, two params and a score,
        # about what an rsiweb experiment row carries.
        self.list_experiment = self.create_experiment(s, "listed")
        s.close()

        def fill(indices: range) -> None:
            session = Session()
            for i in indices:
                run_id = self.create_run_id(session, self.list_experiment)
                expect(
                    session.post(
                        f"{self.api}/runs/log-batch",
                        json={
                            "run_id": run_id,
                            "params": [{"key": "kind", "value": "eval_only"}, {"key": "claim", "value": f"listed {i}"}],
                            "metrics": [{"key": "feedback_score", "value": 0.5, "timestamp": now, "step": 0}],
                        },
                    ),
                    200,
                )
            session.close()

        threads = [threading.Thread(target=fill, args=(range(k, list_size, 8),)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def create_experiment(self, s: requests.Session, name: str) -> str:
        body = {"name": f"{name}-{uuid.uuid4().hex[:8]}"}
        response = s.post(f"{self.api}/experiments/create", json=body)
        if response.status_code == 400 and "RESOURCE_ALREADY_EXISTS" in response.text:
            # A retry after a dropped connection whose first attempt had been applied.
            found = s.get(f"{self.api}/experiments/get-by-name", params={"experiment_name": body["name"]})
            return expect(found, 200)["experiment"]["experiment_id"]
        return expect(response, 200)["experiment_id"]

    def create_run_id(self, s: requests.Session, experiment: str) -> str:
        body = {"experiment_id": experiment, "start_time": int(time.time() * 1000)}
        return expect(s.post(f"{self.api}/runs/create", json=body), 200)["run"]["info"]["run_id"]

    def session(self) -> requests.Session:
        return Session()

    def appender(self) -> requests.Session:
        """Each concurrent client logs into its own run, as eight training processes would."""
        s = Session()
        with self._lock:
            s.bench_run = self.client_runs[next(self._client) % len(self.client_runs)]  # type: ignore[attr-defined]
        return s

    def tiny(self, s: requests.Session, i: int) -> None:
        r = s.get(f"{self.base}/health")
        if r.status_code != 200:
            raise RuntimeError(f"/health: {r.status_code}")

    def create(self, s: requests.Session, i: int) -> None:
        self.create_run_id(s, self.experiment)

    def append(self, s: requests.Session, i: int) -> None:
        run_id = getattr(s, "bench_run", self.metric_run)
        body = {
            "run_id": run_id,
            "key": "loss",
            "value": random.random(),
            "timestamp": int(time.time() * 1000),
            "step": i,
        }
        expect(s.post(f"{self.api}/runs/log-metric", json=body), 200)

    def batch(self, s: requests.Session, i: int) -> None:
        now = int(time.time() * 1000)
        metrics = [
            {"key": "loss", "value": random.random(), "timestamp": now, "step": i * self.batch_size + j}
            for j in range(self.batch_size)
        ]
        expect(s.post(f"{self.api}/runs/log-batch", json={"run_id": self.batch_run, "metrics": metrics}), 200)

    def read_history(self, s: requests.Session, i: int) -> None:
        # MlflowClient.get_metric_history pages with max_results=25000; one page holds all here.
        points, token = 0, None
        while True:
            params = {"run_id": self.history_run, "metric_key": "loss", "max_results": 25000}
            if token:
                params["page_token"] = token
            page = expect(s.get(f"{self.api}/metrics/get-history", params=params), 200)
            points += len(page.get("metrics", []))
            token = page.get("next_page_token")
            if not token:
                break
        if points != self.history:
            raise RuntimeError(f"history has {points} points, expected {self.history}")

    def list(self, s: requests.Session, i: int) -> None:
        body = {"experiment_ids": [self.list_experiment], "max_results": self.list_size}
        runs = expect(s.post(f"{self.api}/runs/search", json=body), 200).get("runs", [])
        if len(runs) != self.list_size:
            raise RuntimeError(f"search_runs gave {len(runs)} runs, expected {self.list_size}")


# --- the run --------------------------------------------------------------------------------------

ROWS = [
    # key, label, calls attribute, clients, kind (for the target)
    ("tiny", "tiny GET (health)", "tinies", 1, "probe"),
    ("create", "create a record", "creates", 1, "single"),
    ("append1", "append one record, 1 client", "appends", 1, "single"),
    ("append8", "append one record, 8 clients", "appends8", 8, "single"),
    ("batch", "batched append of 1,000", "batches", 1, "batch"),
    ("history", "read a 10,000-point history", "reads", 1, "batch"),
    ("list", "list 1,000 records", "reads", 1, "batch"),
]


def operations(side: Any, *, ours: bool) -> dict[str, tuple[Callable[[], requests.Session], Callable[..., None]]]:
    """Per figure: how a client session is made on this side, and the call it repeats."""
    if isinstance(side, Floor):  # the floor only has single appends
        return {"append1": (side.session, side.append), "append8": (side.session, side.append)}
    writer = side.submitter if ours else side.session
    reader = side.lister if ours else side.session
    return {
        "tiny": (side.session, side.tiny),
        "create": (writer, side.create),
        "append1": (side.appender, side.append),
        "append8": (side.appender, side.append),
        "batch": (writer, side.batch),
        "history": (reader, side.read_history),
        "list": (reader, side.list),
    }


def merge(parts: list[Figure]) -> Figure:
    return Figure(
        latencies=[x for p in parts for x in p.latencies],
        wall=sum(p.wall for p in parts),
        load=statistics.mean(p.load for p in parts),
        retries=sum(p.retries for p in parts),
    )


def compare(sides: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, Figure]]:
    """Each figure on every side in turn, in ``args.rounds`` alternating slices.

    The machine is shared and its load drifts by the minute; interleaving the servers slice by
    slice puts every side under about the same load, which separate phases would not.
    """
    ops = {name: operations(side, ours=name == "rsiweb") for name, side in sides.items()}
    results: dict[str, dict[str, Figure]] = {name: {} for name in sides}
    for key, label, count_attr, clients, _ in ROWS:
        total = getattr(args, count_attr)
        rounds = max(1, min(args.rounds, total // max(clients, 1)))
        order = [name for name in sides if key in ops[name]]
        parts: dict[str, list[Figure]] = {name: [] for name in order}
        for r in range(rounds):
            calls = total // rounds + (1 if r < total % rounds else 0)
            for name in order if r % 2 == 0 else order[::-1]:
                make_session, call = ops[name][key]
                warmup = 1 if key == "batch" else 3
                parts[name].append(measure(make_session, call, calls=calls, clients=clients, warmup=warmup))
        print(f"{label} ({clients} client{'s' if clients > 1 else ''}):", flush=True)
        for name in order:
            figure = results[name][key] = merge(parts[name])
            print(
                f"  {name:12s} {figure.per_second:9.1f} req/s  min {min(figure.latencies) * 1000:7.2f}"
                f"  p50 {figure.p50:8.2f}  p95 {figure.p95:8.2f} ms"
                f"  (n={len(figure.latencies)}, load {figure.load:.1f}, retried {figure.retries})",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tinies", type=int, default=200, help="tiny GETs (the Nagle/delayed-ACK probe)")
    parser.add_argument("--creates", type=int, default=200)
    parser.add_argument("--appends", type=int, default=300, help="single appends with one client")
    parser.add_argument("--appends8", type=int, default=800, help="single appends over eight clients")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--reads", type=int, default=20, help="history reads and 1,000-record listings")
    parser.add_argument("--rounds", type=int, default=4, help="alternating slices per figure")
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--list-size", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=1, help="rsiweb server processes (manage.py serve)")
    parser.add_argument("--mlflow-workers", default="4,1", help="comma-separated --workers configurations")
    args = parser.parse_args()

    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/6")
    flush_redis()
    mlflow = ensure_mlflow_venv()
    servers: list[subprocess.Popen] = []
    sides: dict[str, Any] = {}
    try:
        print(
            f"set-up: rsiweb (manage.py serve, {args.processes} process(es)) on {API_DB}; load {loadavg():.1f}",
            flush=True,
        )
        recreate_database(API_DB)
        django_setup()
        port = free_port()
        world = build_ours(f"http://127.0.0.1:{port}", list_size=args.list_size, history=args.history)
        servers.append(start_rsiweb(port, args.processes))
        sides["rsiweb"] = Ours(world, history=args.history, list_size=args.list_size, batch_size=args.batch_size)
        sides["floor"] = Floor(world.base)
        for workers in [int(w) for w in args.mlflow_workers.split(",")]:
            database = f"{MLFLOW_DB}_w{workers}"
            print(
                f"set-up: MLflow {MLFLOW_VERSION} --workers {workers} on {database}; load {loadavg():.1f}", flush=True
            )
            recreate_database(database)
            port = free_port()
            servers.append(start_mlflow(mlflow, port, workers, database))
            sides[f"mlflow w{workers}"] = Mlflow(
                f"http://127.0.0.1:{port}", history=args.history, list_size=args.list_size,
                batch_size=args.batch_size, clients=8,
            )  # fmt: skip
        results = compare(sides, args)
    finally:
        for server in servers:
            stop(server)
        flush_redis()  # the eval-only submissions' Celery messages: no worker consumes them here
    report(results)


def our_side_fresh() -> None:
    """What a bench of rsiweb alone starts from: its Redis database emptied, API_DB re-created and
    migrated, Django set up in this process (bench/append_cpu.py, append_contention.py, profile_append.py)."""
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/6")
    flush_redis()
    recreate_database(API_DB)
    django_setup()


def flush_redis() -> None:
    """Empty the benchmark's own Redis database (REDIS_URL, db 6 by default)."""
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()


def report(results: dict[str, dict[str, Figure]]) -> None:
    ours = results.get("rsiweb")
    floor = results.get("floor", {})
    others = [k for k in results if k not in ("rsiweb", "floor")]
    if ours is None or not others:
        return
    print("\nrequests/s (higher is better); ratio = rsiweb / the faster MLflow configuration")
    header = f"{'figure':32s} {'rsiweb':>9s} " + " ".join(f"{k:>11s}" for k in others) + f" {'ratio':>7s} target"
    print(header)
    for key, label, _, _, kind in ROWS:
        best = max(results[k][key].per_second for k in others)
        ratio = ours[key].per_second / best
        target = {"single": 5.0, "batch": 3.0}.get(kind)
        verdict = "" if target is None else f"{'met' if ratio >= target else 'NOT met'} (>= {target:.0f}x)"
        cells = " ".join(f"{results[k][key].per_second:11.1f}" for k in others)
        print(f"{label:32s} {ours[key].per_second:9.1f} {cells} {ratio:7.2f} {verdict}")
    print("\np50 latency ms")
    for key, label, _, _, _ in ROWS:
        cells = " ".join(f"{results[k][key].p50:11.2f}" for k in others)
        print(f"{label:32s} {ours[key].p50:9.2f} {cells}")
    print("\nsingle append against the floor (one INSERT + COMMIT on the same server); target <= 1.6x")
    for key in ("append1", "append8"):
        if key not in floor:
            continue
        label = next(label for k, label, *_ in ROWS if k == key)
        p50 = ours[key].p50 / floor[key].p50
        rate = floor[key].per_second / ours[key].per_second
        print(
            f"{label:32s} floor p50 {floor[key].p50:6.2f} ms, {floor[key].per_second:7.1f} req/s;"
            f" rsiweb/floor p50 {p50:4.2f}x, throughput {rate:4.2f}x {'met' if p50 <= 1.6 else 'NOT met'}"
        )
    print("\nrequests retried after a dropped connection:")
    for name, figures in results.items():
        print(f"  {name:12s} {sum(f.retries for f in figures.values())}")


if __name__ == "__main__":
    main()
