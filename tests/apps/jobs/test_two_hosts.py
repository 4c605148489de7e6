"""Workers on several machines (issue 14, point 10): train on one host, evaluate on another.

Two worker hosts (network namespaces with their own hostname, tests/support/hosts.py; plain
processes with their own folders where namespaces are unavailable) share only what the README
says machines share: PostgreSQL, Redis and the artifact store, here an S3 store served on
loopback by moto's server and named by its fsspec URL (``RSI_ARTIFACT_ROOT=s3://bucket/prefix``).
Host A trains θ0 into a checkpoint and is shut down; host B, whose folders A never wrote,
evaluates that checkpoint. Whatever B reads of A's work came through S3.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from django.conf import settings
from moto.server import ThreadedMotoServer

from apps.benchmarks.services import benchmark_register
from apps.experiments.choices import ExperimentStatus
from apps.experiments.models import Checkpoint, Evaluation, Experiment
from apps.experiments.services import experiment_create
from apps.flows.pipeline import experiment_start
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from apps.research.choices import NodeKind
from apps.research.services import node_create
from tests.apps.jobs.conftest import HEARTBEAT_SECONDS, REAPER_INTERVAL_SECONDS, STALE_SECONDS, wait_for
from tests.factories import make_run
from tests.support.hosts import Host, namespaces_available
from tests.support.procs import ROOT, Lifeline, child_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST_RECIPE = {"max_steps": 20, "batch_size": 16, "logging_steps": 10}
S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "rsiweb-test",
    "AWS_SECRET_ACCESS_KEY": "rsiweb-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def s3(monkeypatch) -> Iterator[dict[str, str]]:
    """moto's S3 server on loopback and a fresh bucket; this process reaches it as a client would."""
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {**S3_KEYS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bucket = f"rsiweb-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)
    yield {**env, "bucket": bucket, "port": str(port)}
    server.stop()


@pytest.fixture
def artifact_root(settings, s3, tmp_path: Path) -> str:
    """Overrides the jobs suite's local store: the artifact store is the S3 bucket."""
    settings.ARTIFACT_ROOT = f"s3://{s3['bucket']}/artifacts"
    settings.ARTIFACT_CACHE_DIR = str(tmp_path / "test-process-cache")
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    Path(settings.SEALED_ROOT).mkdir()
    return settings.ARTIFACT_ROOT


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[dict[str, Host]]:
    isolated = namespaces_available()
    made = {name: Host(name, tmp_path / name, isolated=isolated) for name in ("hostA", "hostB")}
    yield made
    for host in made.values():
        host.close()


class HostWorker:
    """``celery worker -Q gpu`` on one host, with its own working directory, data folder and caches."""

    def __init__(self, host: Host, *, s3: dict[str, str], sealed: Path) -> None:
        self.host = host
        pg_port = host.forward(int(settings.DATABASES["default"].get("PORT") or 5432))
        redis_port = host.forward(6379)
        s3_port = host.forward(int(s3["port"]))
        broker = settings.CELERY_BROKER_URL.replace("127.0.0.1", host.address).replace("localhost", host.address)
        assert f":{redis_port}/" in broker, broker
        own_sealed = host.root / "sealed"
        shutil.copytree(sealed, own_sealed)  # each GPU host mounts its own copy (README)
        env = child_env(
            REDIS_URL=broker,
            RSI_ARTIFACT_ROOT=settings.ARTIFACT_ROOT,
            RSI_SEALED_ROOT=str(own_sealed),
            RSI_DATA_DIR=str(host.root / "data"),
            HF_HOME=str(host.root / "hf"),
            AWS_ENDPOINT_URL=f"http://{host.address}:{s3_port}",
            RSI_JOB_HEARTBEAT_SECONDS=HEARTBEAT_SECONDS,
            RSI_JOB_STALE_SECONDS=STALE_SECONDS,
            RSI_REAPER_INTERVAL_SECONDS=REAPER_INTERVAL_SECONDS,
            OMP_NUM_THREADS="1",
            **S3_KEYS,
        )
        env["DATABASE_URL"] = env["DATABASE_URL"].replace("127.0.0.1", host.address)
        assert f":{pg_port}/" in env["DATABASE_URL"], env["DATABASE_URL"]
        env["PYTHONPATH"] = str(ROOT)  # the code is installed on every host; the data is not
        self.log_path = host.root / "worker.log"
        argv = [sys.executable, "-m", "celery", "-A", "rsiweb", "worker", "-Q", "gpu,default",
                "-n", f"gpu@{host.name}", "--pool=prefork", "--concurrency=1", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "--loglevel=INFO"]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                host.command(argv), cwd=host.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.lifeline = Lifeline([self.proc.pid])
        wait_for(lambda: " ready." in self.log() or self.proc.poll() is not None, timeout=120, what=host.name)
        assert self.proc.poll() is None, self.log()[-3000:]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def runs(self, job: Job) -> bool:
        """Whether ``job`` was claimed by a process of this worker (by hostname, else by pid)."""
        hostname, _, pid = job.worker.rpartition(":")
        if self.host.isolated:
            return hostname == self.host.name
        try:
            return os.getpgid(int(pid)) == self.proc.pid
        except (ProcessLookupError, ValueError):
            return False

    def stop(self) -> None:
        """Warm shutdown: the job in hand finishes, no new one is taken."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.lifeline.close()


def test_a_checkpoint_trained_on_one_host_is_evaluated_on_another_through_s3(
    hosts, s3, artifact_root, minibench_dir, theta0, data_entry
):
    benchmark = benchmark_register(name="minibench/arithmetic", task_dir=minibench_dir / "tasks" / "arithmetic")
    run = make_run(base_checkpoint=theta0, benchmark=benchmark)
    owner = node_create(run=run, kind=NodeKind.WORKER, task="teach arithmetic")
    experiment = experiment_create(
        run=run, owner=owner, kind="train_eval", input_checkpoint=theta0,
        action={"data": [data_entry().handle], "hyperparameters": FAST_RECIPE}, status="queued",
    )  # fmt: skip
    sealed = Path(settings.SEALED_ROOT)
    a = HostWorker(hosts["hostA"], s3=s3, sealed=sealed)
    b = None
    try:
        experiment_start(experiment=experiment)
        train = wait_for(
            lambda: Job.objects.filter(experiment=experiment, kind=JobKind.TRAIN, status=JobStatus.RUNNING).first(),
            timeout=300, what="host A to claim the training", logs=a.log,
        )  # fmt: skip
        assert a.runs(train), train.worker
        a.stop()  # A finishes the training it holds and leaves: the evaluation cannot go there
        train.refresh_from_db()
        assert train.status == JobStatus.SUCCEEDED, (train.error, a.log()[-3000:])
        b = HostWorker(hosts["hostB"], s3=s3, sealed=sealed)

        def ended() -> Experiment | None:
            current = Experiment.objects.get(pk=experiment.pk)
            return current if current.status not in ("queued", "running") else None

        done = wait_for(ended, timeout=420, what="host B to evaluate", logs=b.log)
        evaluate = Job.objects.get(experiment=experiment, kind=JobKind.EVALUATE)
        assert done.status == ExperimentStatus.SUCCEEDED, (evaluate.error, b.log()[-3000:])
        assert b.runs(evaluate), evaluate.worker
        assert not a.runs(evaluate)
    finally:
        for worker in (a, b):
            if worker is not None:
                worker.stop()

    # The checkpoint A trained lives in the bucket, and only there: B fetched it into its own cache.
    checkpoint = Checkpoint.objects.get(producing_job=train)
    assert checkpoint.uri.startswith(f"s3://{s3['bucket']}/artifacts/checkpoints/")
    prefix = checkpoint.uri.removeprefix(f"s3://{s3['bucket']}/")
    objects = boto3.client("s3").list_objects_v2(Bucket=s3["bucket"], Prefix=prefix + "/").get("Contents", [])
    assert {obj["Key"].removeprefix(prefix + "/") for obj in objects} == set(checkpoint.manifest)
    key = checkpoint.uri.removeprefix(f"{artifact_root}/")
    assert (hosts["hostB"].root / "data" / "artifact-cache" / key / "model.safetensors").is_file()
    assert not list(hosts["hostB"].root.rglob(str(train.uuid)))  # nothing of A's local work dir
    evaluation = Evaluation.objects.get(job=evaluate)
    assert (evaluation.checkpoint, evaluation.status) == (checkpoint, "ok")
    assert done.feedback_score == evaluation.score
