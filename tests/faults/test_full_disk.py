"""A really full artifact disk: the run's trainings fail with ENOSPC, the run says so, and it
recovers on its own once space is back.

The artifact root is a small tmpfs of its own (we run as root, here and in CI), holding θ0 and
the training rows, then filled to the last byte. A real gpu worker trains on the private
servers; each training writes its checkpoint to local scratch and fails when it stores it in
the full artifact root. Most of the run's recent jobs failing is what run-level health must
notice (apps/research: ``run.jobs_failing``, the Main Agent woken with ``jobs_failing``, the run
page's alert). Then the filler goes, nothing is restarted, and the next trainings succeed and
record ``run.jobs_recovered``.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from apps.datapool.storage import artifact_store
from apps.experiments.models import Checkpoint, Event
from apps.flows.runs import run_start
from apps.jobs.choices import JOB_TERMINAL_STATES, JobStatus
from apps.jobs.models import Job, JobLogLine, JobTransition
from apps.research.models import AgentLoop
from apps.research.selectors import JOB_FAILURE_THRESHOLD, JOB_FAILURE_WINDOW
from tests.apps.dashboard.world import make_people
from tests.workers.agents.stack import wait_for

pytestmark = pytest.mark.slow

# θ0 (about 6 MB) and the rows, then the filler; once the filler is gone, room for the two
# checkpoints that the recovering trainings store.
DISK_SIZE = "48m"
STEPS = 4  # a short training: the write at its end is what fails
ENOSPC = "No space left on device"


def _umount(path: str) -> None:
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", path], check=True)  # busy: detach it now, freed once unused


@pytest.fixture
def artifact_roots(artifact_roots: dict[str, str]) -> Iterator[dict[str, str]]:
    """The suite's roots, the artifact root a tmpfs of ``DISK_SIZE`` mounted on the (empty) folder."""
    disk = artifact_roots["ARTIFACT_ROOT"]
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", disk], capture_output=True,
                             text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.fail(f"could not mount a {DISK_SIZE} tmpfs at {disk} (this test needs root, as the fault suite "
                    f"has in CI): {mounted.stderr.strip()}")  # fmt: skip
    try:
        yield artifact_roots
    finally:
        _umount(disk)


def fill(disk: Path) -> Path:
    """Fill the disk's free space with one file (written, not sparse); return it."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb") as out:
        remaining = shutil.disk_usage(disk).free
        while remaining:
            remaining -= out.write(chunk[:remaining])
    assert shutil.disk_usage(disk).free == 0
    with pytest.raises(OSError, match=ENOSPC):
        (disk / "probe").write_bytes(b"x" * 4096)
    (disk / "probe").unlink()
    return filler


def ended(jobs: list[Job]) -> list[Job] | None:
    fresh = list(Job.objects.filter(pk__in=[job.pk for job in jobs]).order_by("pk"))
    return fresh if all(job.status in JOB_TERMINAL_STATES for job in fresh) else None


def health_events(run) -> list[Event]:
    return list(Event.objects.filter(run=run, type__startswith="run.jobs_").order_by("pk"))


def run_page(run, viewer) -> str:
    client = Client()
    client.force_login(viewer)
    return client.get(reverse("dashboard:run-detail", args=[run.uuid])).content.decode()


def test_a_full_artifact_disk_fails_the_run_s_trainings_and_the_run_recovers_when_space_is_back(
    project, training, artifact_roots
):
    disk = Path(artifact_roots["ARTIFACT_ROOT"])
    run = run_start(run=training.run)  # its Main Agent's loop is what a jobs_failing trigger wakes
    filler = fill(disk)
    gpu = project("gpu")
    worker = gpu.process("gpu")

    first = [training(max_steps=STEPS) for _ in range(4)]
    failed = wait_for(lambda: ended(first), timeout=300, what="the four trainings to end", stack=gpu.stack)
    for job in failed:
        assert job.status == JobStatus.FAILED, (job.status, job.error[-2000:])
        assert f"[Errno {errno.ENOSPC}] {ENOSPC}" in job.error, job.error[-2000:]
        # It trained to the end: storing its output is what failed.
        assert JobLogLine.objects.filter(job=job, text__startswith=f"step {STEPS}:").exists()

    # Recorded once, when the third failure crossed the policy's threshold (3 of the last 4).
    [failing] = health_events(run)
    assert failing.type == "run.jobs_failing"
    window = (failing.arguments["failed"], failing.arguments["ended"], failing.arguments["window"])
    assert window == (JOB_FAILURE_THRESHOLD, 3, JOB_FAILURE_WINDOW)
    assert ENOSPC in failing.arguments["summary"]
    assert failing.arguments["job"] == str(failed[2].uuid)
    inbox = AgentLoop.objects.get(run=run, node__kind="main").inbox
    woken = [item for item in inbox if item["trigger"] == "jobs_failing"]
    assert len(woken) == 1, woken
    assert "3 of the run's last 3 jobs failed" in woken[0]["summary"]
    assert ENOSPC in woken[0]["summary"]
    assert Event.objects.filter(run=run, type="main.triggered", arguments__trigger="jobs_failing").count() == 1
    viewer = make_people()["viewer"]
    page = run_page(run, viewer)
    assert 'id="run-health"' in page
    assert "4 of the last 4 jobs failed" in page
    assert ENOSPC in page

    # Space comes back; nothing is restarted. Two successes bring the run under the threshold.
    filler.unlink()
    second = [training(max_steps=STEPS) for _ in range(2)]
    succeeded = wait_for(lambda: ended(second), timeout=300, what="the next two trainings to end", stack=gpu.stack)
    for job in succeeded:
        assert job.status == JobStatus.SUCCEEDED, (job.status, job.error[-2000:])
    assert worker.poll() is None  # the same worker all along
    assert gpu.process("gpu") is worker
    assert [event.type for event in health_events(run)] == ["run.jobs_failing", "run.jobs_recovered"]
    recovered = health_events(run)[1]
    assert recovered.arguments["job"] == str(succeeded[1].uuid)
    assert (recovered.arguments["failed"], recovered.arguments["ended"]) == (2, 4)
    assert 'id="run-health"' not in run_page(run, viewer)

    # Nothing lost, nothing twice: six jobs, none retried or left running, each with one history
    # and at most one output; only the successes stored a checkpoint.
    jobs = list(Job.objects.filter(run=run).order_by("pk"))
    assert [job.pk for job in jobs] == [job.pk for job in first + second]
    assert all(job.attempt == 1 for job in jobs)
    for job in jobs:
        history = list(JobTransition.objects.filter(job=job).order_by("pk").values_list("from_status", "to_status"))
        assert history == [("", JobStatus.QUEUED), (JobStatus.QUEUED, JobStatus.RUNNING),
                           (JobStatus.RUNNING, job.status)], (job.pk, history)  # fmt: skip
    outputs = Checkpoint.objects.filter(producing_job__run=run)
    assert sorted(outputs.values_list("producing_job_id", flat=True)) == [job.pk for job in second]
    assert all(artifact_store().exists(checkpoint.uri) for checkpoint in outputs)
