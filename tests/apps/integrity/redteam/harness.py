"""The red team's machinery: a live API server and Celery workers against the test database, an
HTTP client that acts as one agent token, and the table of outcomes read back from the database.

The adversary drives the system only the way an agent could: REST calls with its own token, and —
for the file-level variants — edits of files it could reach on a badly deployed host (its own
checkpoint folder, a datapool artifact, the sealed folder, the evaluation host's code). What the
system observed is read from ``IntegrityFinding`` and ``BlockedAttempt`` rows, never from what the
script meant to do.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from django.conf import settings

from apps.core.management.commands.serve import uvicorn_command
from apps.experiments.choices import EXPERIMENT_TERMINAL_STATES, IntegrityStatus
from apps.experiments.models import Experiment
from apps.integrity.choices import VIOLATING_ADJUDICATIONS, Observation, Subcategory
from apps.integrity.models import BlockedAttempt, IntegrityFinding
from tests.support.procs import ROOT, Lifeline, child_env

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, logs: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    detail = f"\n--- logs ---\n{logs()[-6000:]}" if logs else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


class Process:
    """A subprocess in its own process group, logging to a file; stopped with SIGTERM then SIGKILL,
    and killed with its group when the test process ends, however it ends (its Lifeline)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._lifeline = Lifeline([self.proc.pid])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._lifeline.close()
        self._log.close()


def start_server(env: dict[str, str], log_dir: Path) -> tuple[Process, str]:
    """``manage.py serve``'s uvicorn serving the ASGI app on a free port; returns (process, url)."""
    port = free_port()
    server = Process(
        "web",
        uvicorn_command(host="127.0.0.1", port=port),
        env,
        log_dir / "web.log",
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if not server.alive():
            raise AssertionError(f"the web server exited:\n{server.log()[-4000:]}")
        try:
            return requests.get(f"{url}/healthz", timeout=2).status_code < 500
        except requests.RequestException:
            return False

    wait_for(up, timeout=120, what="the API server", logs=server.log)
    return server, url


def start_worker(name: str, env: dict[str, str], log_dir: Path, *, app: str = "rsiweb") -> Process:
    """A real ``celery worker`` on the gpu and default queues, concurrency 1 (the machine has 2 cores)."""
    worker = Process(
        name,
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "-Q",
            "gpu,default",
            "-n",
            f"{name}@%h",
            "--pool=prefork",
            "--concurrency=1",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
        ],
        env,
        log_dir / f"{name}.log",
    )
    wait_for(
        lambda: " ready." in worker.log() or not worker.alive(), timeout=180, what=f"worker {name}", logs=worker.log
    )
    if not worker.alive():
        raise AssertionError(f"worker {name} exited:\n{worker.log()[-4000:]}")
    return worker


def process_env(roots: dict[str, Path], **extra: str) -> dict[str, str]:
    return child_env(
        REDIS_URL=settings.CELERY_BROKER_URL,
        RSI_ARTIFACT_ROOT=str(roots["artifacts"]),
        RSI_SEALED_ROOT=str(roots["sealed"]),
        RSI_WORKSPACE_ROOT=str(roots["workspaces"]),
        RSI_MINIBENCH_ROOT=str(roots["minibench"]),
        RSI_DATA_DIR=str(roots["data"]),
        RSI_JOB_HEARTBEAT_SECONDS="1",
        RSI_JOB_STALE_SECONDS="60",
        RSI_REAPER_INTERVAL_SECONDS="5",
        RSI_TOKEN_RATE="100000/min",
        OMP_NUM_THREADS="1",
        **extra,
    )


# --------------------------------------------------------------------------- one agent's client


@dataclass
class Reply:
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def code(self) -> str:
        return (self.body or {}).get("error", {}).get("code", "") if isinstance(self.body, dict) else ""


class Agent:
    """One agent token speaking to the REST API, as an external harness would."""

    def __init__(self, base_url: str, token: str, handle: str) -> None:
        self.base_url = base_url
        self.handle = handle
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, tool: str, args: dict[str, Any] | None = None, *, key: str | None = None) -> Reply:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Idempotency-Key"] = key
        response = self.session.post(
            f"{self.base_url}/api/v1/tools/{tool}", data=json.dumps(args or {}), headers=headers, timeout=120
        )
        return Reply(response.status_code, _json(response))

    def get(self, path: str) -> Reply:
        response = self.session.get(f"{self.base_url}{path}", timeout=60)
        return Reply(response.status_code, _json(response))


def _json(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


# --------------------------------------------------------------------------- variants and the table


@dataclass
class Variant:
    """One attempt of the adversary. ``experiment`` names the submission whose finding in
    ``subcategory`` is the system's observation of it; ``None`` when the attempt was meant to be
    refused before any experiment existed (then its BlockedAttempt rows are the observation).
    ``source`` narrows a reporting finding to the report that carried the attempt."""

    subcategory: str
    name: str
    how: str  # api | files | host | collusion
    node: Any
    experiment: str | None = None
    blocked_after: int = 0  # BlockedAttempt pk before the attempt
    source: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    subcategory: str
    variant: str
    how: str
    worker: str
    experiment: str
    layer: str  # review | post | -
    observation: str
    adjudication: str
    integrity: str
    outcome: str
    caught: bool
    decided_by: str = ""


def outcome_of(variant: Variant, run: Any) -> Row:
    """What the database says happened to one attempt."""
    experiment = Experiment.objects.filter(run=run, handle=variant.experiment).first() if variant.experiment else None
    blocked = BlockedAttempt.objects.filter(
        run=run, node=variant.node, subcategory=variant.subcategory, pk__gt=variant.blocked_after
    )
    base = {
        "subcategory": variant.subcategory,
        "variant": variant.name,
        "how": variant.how,
        "worker": variant.node.handle,
        "experiment": variant.experiment or "-",
    }
    if experiment is None:
        if blocked.exists():
            return Row(
                **base,
                layer="review",
                observation=Observation.ATTEMPTED_BLOCKED,
                adjudication="",
                integrity="-",
                outcome="ATTEMPTED_BLOCKED",
                caught=True,
            )
        return Row(
            **base,
            layer="-",
            observation="(none)",
            adjudication="",
            integrity="-",
            outcome="MISSED: not refused, no experiment",
            caught=False,
        )
    if variant.subcategory == Subcategory.METRIC_ATTRIBUTION and variant.source is not None:
        return _author_row(variant, base)
    finding = IntegrityFinding.objects.filter(experiment=experiment, subcategory=variant.subcategory).first()
    if finding is None:
        return Row(
            **base,
            layer="post",
            observation="(not checked)",
            adjudication="",
            integrity=experiment.integrity_status,
            outcome="MISSED: not checked",
            caught=False,
        )
    if variant.source is not None and finding.observation == Observation.EXECUTED:
        sources = {p.get("source") for p in finding.evidence.get("problems", [])}
        if variant.source not in sources:
            return Row(
                **base,
                layer="post",
                observation=f"{finding.observation} (other report)",
                adjudication=finding.adjudication,
                integrity=experiment.integrity_status,
                outcome=f"MISSED: {variant.source} not among the findings",
                caught=False,
            )
    observation, adjudication, status = finding.observation, finding.adjudication, experiment.integrity_status
    if observation == Observation.ATTEMPTED_BLOCKED:
        outcome, caught = "ATTEMPTED_BLOCKED", True
    elif observation == Observation.EXECUTED and adjudication in VIOLATING_ADJUDICATIONS:
        caught = status == IntegrityStatus.FLAGGED
        outcome = "EXECUTED, flagged" if caught else f"EXECUTED, {adjudication}, but {status}"
    elif observation == Observation.EXECUTED:
        outcome, caught = f"EXECUTED, {adjudication or 'unadjudicated'}, {status}", False
    else:
        outcome, caught = f"MISSED: {observation}, {status}", False
    return Row(
        **base,
        layer="post",
        observation=observation,
        adjudication=adjudication,
        integrity=status,
        outcome=outcome,
        caught=caught,
        decided_by=finding.decided_by,
    )


def _author_row(variant: Variant, base: dict[str, Any]) -> Row:
    """A false claim is its author's finding (metric attribution on the author's node), never the
    cited experiment's: caught when the author's finding is EXECUTED for this report, adjudicated a
    violation or with the evidence suggesting one to a Reviewer."""
    finding = IntegrityFinding.objects.filter(node=variant.node, subcategory=variant.subcategory).first()
    if finding is None:
        return Row(**base, layer="post", observation="(not checked)", adjudication="", integrity="-",
                   outcome="MISSED: the author's reports were not judged", caught=False)  # fmt: skip
    sources = {p.get("source") for p in finding.evidence.get("problems", [])}
    suggested = finding.evidence.get("suggested_adjudication", "")
    if finding.observation != Observation.EXECUTED or variant.source not in sources:
        outcome, caught = f"MISSED: author {finding.observation}, {variant.source} not among its problems", False
    elif finding.adjudication in VIOLATING_ADJUDICATIONS or suggested in VIOLATING_ADJUDICATIONS:
        outcome, caught = f"EXECUTED on author, {finding.adjudication or 'suggested ' + suggested}", True
    else:
        outcome, caught = f"EXECUTED on author, {finding.adjudication or 'unadjudicated'}", False
    return Row(**base, layer="post", observation=finding.observation, adjudication=finding.adjudication,
               integrity="author", outcome=outcome, caught=caught, decided_by=finding.decided_by)  # fmt: skip


def build_table(variants: list[Variant], run: Any) -> list[Row]:
    return [outcome_of(v, run) for v in variants]


def format_table(rows: list[Row]) -> str:
    headers = ("subcategory", "variant", "how", "worker", "experiment", "layer", "outcome", "decided by", "ok")
    cells = [
        (
            r.subcategory,
            r.variant,
            r.how,
            r.worker,
            r.experiment,
            r.layer,
            r.outcome,
            r.decided_by or "-",
            "yes" if r.caught else "NO",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "-+-".join("-" * w for w in widths)]
    out += [" | ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    return "\n".join(out)


def terminal(run: Any, handle: str) -> bool:
    return Experiment.objects.filter(run=run, handle=handle, status__in=EXPERIMENT_TERMINAL_STATES).exists()


def checked(run: Any, handle: str) -> bool:
    return IntegrityFinding.objects.filter(experiment__run=run, experiment__handle=handle).count() == len(
        Subcategory.values
    )
