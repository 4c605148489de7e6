"""Jobs ride out a short database outage; one that cannot report for too long stops and is retried.

A real GPU-queue worker trains the minibench θ0 on the private servers while the test stops the
private PostgreSQL mid-training (issue 14: a 20 s outage killed the job in flight and left it
"running" until reaped).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connections

from apps.core.hashing import sha256_tree
from apps.datapool.services import data_register_from_workspace
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.models import Checkpoint
from apps.experiments.pipeline import train_job_spec
from apps.experiments.services import checkpoint_register, manifest_digest
from apps.jobs import services
from apps.jobs.choices import JOB_TERMINAL_STATES, JobKind, JobStatus
from apps.jobs.models import Job, JobLogLine, JobTransition
from tests.factories import make_run

pytestmark = pytest.mark.slow

LOGGING_STEPS = 5


@pytest.fixture(scope="session")
def minibench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.minibench import ci_minibench  # noqa: PLC0415 - heavy (torch), fixture only

    return ci_minibench(tmp_path_factory)


@pytest.fixture
def training(transactional_db, artifact_roots, minibench_dir: Path, tmp_path: Path):
    """``training(max_steps)``: a queued training job of θ0 on 300 clean catalog rows."""
    manifest = sha256_tree(minibench_dir / "theta0")
    uri = artifact_store().put_dir(minibench_dir / "theta0", key=checkpoint_key(manifest_digest(manifest)))
    theta0 = checkpoint_register(handle="mb/theta0/faults", uri=uri, manifest=manifest, is_base=True)
    lines = (minibench_dir / "catalog" / "arithmetic-clean" / "data.jsonl").read_text().splitlines()[:300]
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    entry = data_register_from_workspace(workspace=tmp_path, path="rows.jsonl", name="arithmetic-clean")
    run = make_run(base_checkpoint=theta0)

    def enqueue(max_steps: int) -> Job:
        hyper = {"max_steps": max_steps, "batch_size": 8, "logging_steps": LOGGING_STEPS}
        spec = train_job_spec(input_checkpoint=theta0, data=[entry], hyperparameters=hyper)
        return services.job_enqueue(kind=JobKind.TRAIN, spec=spec, run=run, time_limit_seconds=900)

    return enqueue


def wait_for(predicate, *, timeout: float, what: str, logs=None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - the database may be coming back
            connections.close_all()
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs() if logs else ''}")


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def outage(pg_cluster, seconds: float) -> None:
    connections.close_all()
    pg_cluster.stop()
    time.sleep(seconds)
    pg_cluster.start()


def test_a_training_job_rides_out_a_20_second_database_outage(project, pg_cluster, training):
    gpu = project("gpu", RSI_JOB_STALE_SECONDS="60")
    job = training(max_steps=400)
    wait_for(lambda: fresh(job).progress >= 0.05, timeout=300, what="training under way", logs=lambda: gpu.log("gpu"))

    outage(pg_cluster, 20)

    done = wait_for(lambda: (j := fresh(job)).status in JOB_TERMINAL_STATES and j, timeout=600,
                    what="the job to finish", logs=lambda: gpu.log("gpu"))  # fmt: skip
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert not Job.objects.filter(previous_attempt=done).exists()  # no retry was needed
    # Every loss line the trainer logged is in the records, in order: the ones logged during the
    # outage were queued and written when the database came back.
    steps = [int(t.split()[1].rstrip(":")) for t in JobLogLine.objects.filter(job=done, text__startswith="step ")
             .order_by("seq").values_list("text", flat=True)]  # fmt: skip
    assert steps == sorted(steps)
    assert sorted(set(steps)) == list(range(LOGGING_STEPS, 401, LOGGING_STEPS))
    assert [p["step"] for p in done.metrics["points"]] == steps
    assert Checkpoint.objects.filter(producing_job=done).count() == 1


def test_a_job_that_cannot_report_past_its_stale_threshold_stops_and_is_retried(project, pg_cluster, training):
    gpu = project("gpu", RSI_JOB_STALE_SECONDS="6")
    job = training(max_steps=600)
    wait_for(lambda: fresh(job).progress >= 0.05, timeout=300, what="training under way", logs=lambda: gpu.log("gpu"))

    outage(pg_cluster, 10)

    first = wait_for(lambda: (j := fresh(job)).status in JOB_TERMINAL_STATES and j, timeout=120,
                     what="attempt 1 to end", logs=lambda: gpu.log("gpu"))  # fmt: skip
    assert first.status == JobStatus.LOST
    reason = JobTransition.objects.filter(job=first).order_by("pk").last().reason
    # Recorded by the worker that gave up, or by a reaper that saw the stale heartbeat first.
    assert "could not report" in reason or "no heartbeat" in reason
    assert "no report reached the database" in gpu.log("gpu")  # the body was told to stop
    assert not Checkpoint.objects.filter(producing_job=first).exists()
    second = wait_for(lambda: Job.objects.filter(previous_attempt=first).first(), timeout=60, what="attempt 2")
    assert second.attempt == 2
    assert second.spec == first.spec
    assert second.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED)
