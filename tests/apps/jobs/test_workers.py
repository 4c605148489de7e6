"""Real `celery worker` processes run real jobs: training, a worker killed mid-training, cancel, data.

Each test starts its workers on this suite's Redis db and the test database, enqueues through the
services, and watches the Job rows: the same path production takes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from apps.benchmarks.services import checkpoint_local_dir
from apps.datapool.models import DataEntry
from apps.datapool.services import data_register_from_workspace
from apps.experiments.models import Checkpoint, Event
from apps.flows.pipeline import train_job_spec
from apps.jobs import services
from apps.jobs.choices import JOB_TERMINAL_STATES, JobKind, JobStatus
from apps.jobs.models import Job, JobTransition
from apps.jobs.services import scratch_root
from apps.research.models import Run
from rsiweb.celery import app
from tests.apps.jobs.conftest import wait_for
from tests.factories import make_run
from workers.runtime import MAX_PASSES

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def enqueue_training(run, theta0, entry, *, seed: int = 0, **hyperparameters) -> Job:
    spec = train_job_spec(input_checkpoint=theta0, data=[entry], hyperparameters=hyperparameters)
    return services.job_enqueue(kind=JobKind.TRAIN, spec=spec, run=run, seed=seed, time_limit_seconds=900)


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def finished(job: Job) -> Job | None:
    current = fresh(job)
    return current if current.status in JOB_TERMINAL_STATES else None


def transitions(job: Job) -> list[str]:
    return list(JobTransition.objects.filter(job=job).order_by("pk").values_list("to_status", flat=True))


def stored_checkpoints(artifact_root: Path, theta0: Checkpoint) -> list[Path]:
    """Checkpoint folders in the artifact store other than θ0's."""
    base = checkpoint_local_dir(checkpoint=theta0)
    return sorted(p for p in (artifact_root / "checkpoints").glob("*/*") if p.is_dir() and p != base)


def test_a_worker_killed_mid_training_is_reaped_and_attempt_2_finishes_on_another_worker(
    celery_worker, theta0, data_entry, artifact_root
):
    run = make_run(base_checkpoint=theta0)
    first_worker = celery_worker("w1")
    job = enqueue_training(run, theta0, data_entry(), max_steps=80, batch_size=8, logging_steps=5)
    wait_for(
        lambda: fresh(job).status == JobStatus.RUNNING and fresh(job).progress >= 0.1,
        timeout=240, what="training to be under way", logs=first_worker.log,
    )  # fmt: skip

    first_worker.kill()  # SIGKILL to the worker and its pool child: no ack, no cleanup
    killed_at = timezone.now()
    second_worker = celery_worker("w2")

    def second_attempt_done() -> Job | None:
        following = Job.objects.filter(previous_attempt=job).first()
        return finished(following) if following is not None else None

    attempt2 = wait_for(second_attempt_done, timeout=360, what="attempt 2 to finish", logs=second_worker.log)
    attempt1 = fresh(job)
    assert attempt1.status == JobStatus.LOST
    assert "no heartbeat" in JobTransition.objects.filter(job=attempt1).last().reason
    assert attempt2.status == JobStatus.SUCCEEDED, attempt2.error
    assert (attempt2.attempt, attempt2.spec, attempt2.seed) == (2, attempt1.spec, attempt1.seed)
    assert attempt2.worker != attempt1.worker
    # Re-run as soon as the heartbeat went stale, not after the broker's visibility timeout (12 h).
    restart = (attempt2.started_at - killed_at).total_seconds()
    print(f"attempt 2 claimed {restart:.1f}s after the SIGKILL")
    assert restart < 90
    # Exactly one output checkpoint for the job, made by attempt 2, and nothing else stored.
    assert list(Checkpoint.objects.filter(run=run)) == [Checkpoint.objects.get(producing_job=attempt2)]
    assert not Checkpoint.objects.filter(producing_job=attempt1).exists()
    assert len(stored_checkpoints(artifact_root, theta0)) == 1
    assert not Job.objects.filter(previous_attempt=attempt2).exists()
    # The killed attempt's half-written scratch folder was swept from the host by the reaper loop.
    assert not [p for p in scratch_root().iterdir() if str(attempt1.uuid) in p.name]


def test_cancel_stops_a_running_training_job_without_a_checkpoint(celery_worker, theta0, data_entry, artifact_root):
    run = make_run(base_checkpoint=theta0)
    worker = celery_worker()
    job = enqueue_training(run, theta0, data_entry(), max_steps=3000, batch_size=8, logging_steps=5)
    wait_for(
        lambda: fresh(job).status == JobStatus.RUNNING and fresh(job).progress > 0,
        timeout=240, what="training to be under way", logs=worker.log,
    )  # fmt: skip

    services.job_request_cancel(job=fresh(job), actor="user:tester")

    done = wait_for(lambda: finished(job), timeout=90, what="the job to stop", logs=worker.log)
    assert done.status == JobStatus.CANCELLED
    assert transitions(done) == ["queued", "running", "cancelled"]
    assert done.progress < 0.5
    assert not Checkpoint.objects.filter(producing_job=done).exists()
    assert stored_checkpoints(artifact_root, theta0) == []


def test_data_jobs_run_on_the_default_queue_and_a_failing_body_fails_its_job(celery_worker, theta0, data_entry):
    run = make_run(base_checkpoint=theta0)
    source = data_entry(rows=200)
    worker = celery_worker("data", queues="default")
    job = services.job_enqueue(
        kind=JobKind.DATA,
        spec={"op": "filter", "inputs": [source.handle], "params": {"exclude_regex": "pens", "column": "prompt"}},
        run=run,
    )
    broken = services.job_enqueue(kind=JobKind.DATA, spec={"op": "filter", "inputs": [source.handle], "params": {}})

    done = wait_for(lambda: finished(job), timeout=120, what="the data job to finish", logs=worker.log)
    failed = wait_for(lambda: finished(broken), timeout=60, what="the broken data job to end", logs=worker.log)

    assert done.status == JobStatus.SUCCEEDED, done.error
    derived = DataEntry.objects.get(uuid=done.result["entry"])
    assert list(derived.parents.all()) == [source]
    assert 0 < derived.rows < source.rows
    assert derived.source["job"] == str(done.uuid)
    # Data jobs do not spend the run's accelerator budget.
    assert Run.objects.get(pk=run.pk).used_accelerator_seconds == 0
    # An error in the job body fails the job with the message and traceback, through on_failure.
    assert failed.status == JobStatus.FAILED
    assert "filter needs at least one of" in failed.error
    assert "Traceback" in failed.error
    assert transitions(failed) == ["queued", "running", "failed"]


def test_a_queued_job_whose_message_was_lost_is_sent_again_by_the_reaper_and_runs_once(celery_worker, tmp_path):
    run = make_run()
    (tmp_path / "rows.jsonl").write_text(
        "".join(f'{{"prompt": "Question: {i} pens?", "completion": " {i}"}}\n' for i in range(20)), encoding="utf-8"
    )
    source = data_register_from_workspace(workspace=tmp_path, path="rows.jsonl", name="pens")
    spec = {"op": "filter", "inputs": [source.handle], "params": {"exclude_regex": "1", "column": "prompt"}}
    job = services.job_enqueue(kind=JobKind.DATA, spec=spec, run=run)
    # The message is lost before any worker claimed the job (as when a worker prefetched it and
    # died: with acks late, Redis hands it back only after its visibility timeout, 12 h here).
    with app.connection_for_write() as conn:
        assert conn.default_channel.queue_purge("default") == 1

    worker = celery_worker("w1", queues="default", RSI_JOB_REQUEUE_SECONDS="2")
    done = wait_for(lambda: finished(job), timeout=120, what="the re-sent job to finish", logs=worker.log)

    assert done.status == JobStatus.SUCCEEDED, done.error
    assert done.publishes >= 2
    assert transitions(done) == ["queued", "running", "succeeded"]
    republished = Event.objects.filter(type="job.republished", arguments__job=str(job.uuid))
    assert republished.count() == done.publishes - 1
    assert "reaper: not claimed" in done.log_lines.order_by("seq").first().text
    # The first message comes back after all (Redis restoring the dead worker's unacked copy):
    # the claim finds the job no longer queued, so it does not run a second time.
    dropped = f"job {job.uuid} is succeeded, not queued"
    before = worker.log().count(dropped)
    services._send_message(job)
    wait_for(lambda: worker.log().count(dropped) > before, timeout=60, what="the copy to be dropped", logs=worker.log)
    assert transitions(fresh(job)) == ["queued", "running", "succeeded"]
    assert DataEntry.objects.filter(source__job=str(job.uuid)).count() == 1


def test_a_run_holding_a_slot_passes_its_turn_to_a_run_waiting_behind_it_in_the_queue(celery_worker, tmp_path):
    """Fair share between runs: the queue is first in, first out, but a run with a job running lets
    another run's waiting job go first (concurrent runs of a suite must not compare queue luck)."""
    greedy, late = make_run(name="submits first"), make_run(name="submits later")
    (tmp_path / "rows.jsonl").write_text(
        "".join(f'{{"prompt": "Question: {i} pens?", "completion": " {i}"}}\n' for i in range(20)), encoding="utf-8"
    )
    source = data_register_from_workspace(workspace=tmp_path, path="rows.jsonl", name="pens")
    spec = {"op": "filter", "inputs": [source.handle], "params": {"exclude_regex": "1", "column": "prompt"}}
    first, *more = [services.job_enqueue(kind=JobKind.DATA, spec=spec, run=greedy) for _ in range(3)]
    waiting = services.job_enqueue(kind=JobKind.DATA, spec=spec, run=late)
    # The greedy run's first job runs on another host (claimed there, never finished here).
    assert services.job_claim(job_id=first.pk, worker="other-host:1") is not None

    # (Its heartbeat is that host's business: this worker's reaper must not take it for lost.)
    worker = celery_worker("w1", queues="default", RSI_PASS_TURN_PAUSE_SECONDS="0.1", RSI_JOB_STALE_SECONDS="600")
    jobs = [waiting, *more]
    done = wait_for(lambda: all(finished(j) for j in jobs) and [fresh(j) for j in jobs], timeout=120,
                    what="the three queued jobs to finish", logs=worker.log)  # fmt: skip

    assert [j.status for j in done] == [JobStatus.SUCCEEDED] * 3, [j.error for j in done]
    # The late run's job was behind both of the greedy run's in the queue, and ran before them.
    assert done[0].started_at < min(j.started_at for j in done[1:])
    assert worker.log().count("passes its turn") >= 2
    # Passing a turn is not running: each job ran once, and the reaper was not needed.
    assert [transitions(j) for j in done] == [["queued", "running", "succeeded"]] * 3
    assert not Event.objects.filter(type="job.republished").exists()
    assert fresh(first).status == JobStatus.RUNNING


def test_passing_turns_is_bounded_when_the_waiting_job_has_no_message(celery_worker, tmp_path):
    """A waiting job whose message was lost (the reaper re-sends it only minutes later) cannot keep a
    free slot cycling: a message passes its turn at most MAX_PASSES times, then runs."""
    greedy, stuck = make_run(name="has work"), make_run(name="lost its message")
    (tmp_path / "rows.jsonl").write_text('{"prompt": "Question: 2 pens?", "completion": " 2"}\n', encoding="utf-8")
    source = data_register_from_workspace(workspace=tmp_path, path="rows.jsonl", name="pens")
    spec = {"op": "filter", "inputs": [source.handle], "params": {"exclude_regex": "9", "column": "prompt"}}
    lost = services.job_enqueue(kind=JobKind.DATA, spec=spec, run=stuck)
    with app.connection_for_write() as conn:
        assert conn.default_channel.queue_purge("default") == 1
    elsewhere = services.job_enqueue(kind=JobKind.DATA, spec=spec, run=greedy)
    assert services.job_claim(job_id=elsewhere.pk, worker="other-host:1") is not None
    job = services.job_enqueue(kind=JobKind.DATA, spec=spec, run=greedy)

    worker = celery_worker("w1", queues="default", RSI_PASS_TURN_PAUSE_SECONDS="0.05", RSI_JOB_STALE_SECONDS="600",
                           RSI_JOB_REQUEUE_SECONDS="0")  # fmt: skip
    done = wait_for(lambda: finished(job), timeout=120, what="the job to run after its passes", logs=worker.log)

    assert done.status == JobStatus.SUCCEEDED, done.error
    assert worker.log().count(f"job {job.uuid} passes its turn") == MAX_PASSES
    assert fresh(lost).status == JobStatus.QUEUED
