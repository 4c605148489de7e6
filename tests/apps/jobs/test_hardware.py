"""Hardware evidence: a running job samples its process tree (and GPUs where present) into its
metrics; the summary gives runtime, peaks per device and OOM or not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from apps.jobs import hardware, services
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.jobs.selectors import job_hardware
from tests.apps.jobs.conftest import wait_for
from workers.runtime import RunningJob


def test_a_sample_counts_the_children_and_skips_absent_gpus_cleanly():
    sampler = hardware.Sampler()
    alone = sampler.sample()["ram_mib"]
    # A child that holds ~200 MiB: a rank of a multi-device job is such a child.
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(200 * 2**20); import time; time.sleep(30)"])
    try:
        wait_for(lambda: sampler.sample()["ram_mib"] > alone + 150, timeout=20, what="the child's memory")
    finally:
        child.kill()
        child.wait()
    point = sampler.sample()
    assert set(point) == {"t", "cpu_percent", "ram_mib", "host_ram_percent", "gpus"}
    if hardware._nvml() is None:  # this CI host: no NVML, and no error either
        assert point["gpus"] == []


def test_the_summary_takes_peaks_per_device_and_reads_an_oom():
    samples = [
        {"t": 0, "cpu_percent": 50, "ram_mib": 900, "gpus": [{"index": 0, "memory_mib": 10, "util_percent": 5,
                                                               "temperature_c": 40, "memory_total_mib": 80}]},
        {"t": 10, "cpu_percent": 190, "ram_mib": 1200, "gpus": [
            {"index": 0, "memory_mib": 70, "util_percent": 99, "temperature_c": 71, "memory_total_mib": 80},
            {"index": 1, "memory_mib": 60, "util_percent": 97, "temperature_c": 65, "memory_total_mib": 80}]},
    ]  # fmt: skip
    summary = hardware.summary(samples, runtime_seconds=12.34, error="torch.OutOfMemoryError: CUDA out of memory.")
    assert summary["runtime_seconds"] == 12.3
    assert (summary["peak_ram_mib"], summary["peak_cpu_percent"], summary["samples"]) == (1200, 190, 2)
    assert [g["memory_mib"] for g in summary["gpus"]] == [70, 60]
    assert summary["gpus"][0]["temperature_c"] == 71
    assert summary["oom"] is True
    assert hardware.summary([], runtime_seconds=None)["oom"] is False
    assert hardware.looks_like_oom("rank 1 failed: exit code -9 (SIGKILL)")


@pytest.mark.django_db(transaction=True)
def test_a_running_job_records_samples_every_interval_and_a_last_one(run, settings, monkeypatch):
    settings.RSI_JOB_HEARTBEAT_SECONDS = 0.1
    monkeypatch.setenv("RSI_HARDWARE_SAMPLE_SECONDS", "0.2")
    job = services.job_enqueue(kind=JobKind.TRAIN, spec={"x": 1}, run=run)
    job = services.job_claim(job_id=job.pk, worker="this-host:1")
    with RunningJob(job) as running:
        wait_for(lambda: len(Job.objects.get(pk=job.pk).metrics.get("hardware", [])) >= 4, timeout=10,
                 what="hardware samples")  # fmt: skip
        running.record(lambda: services.job_succeed(job=job, result={}))
    done = Job.objects.get(pk=job.pk)
    samples = done.metrics["hardware"]
    times = [s["t"] for s in samples]
    assert times == sorted(times)
    assert all(s["ram_mib"] > 50 for s in samples)  # this Python process at least
    evidence = job_hardware(job=done)
    assert evidence["summary"]["samples"] == len(samples)
    assert evidence["summary"]["runtime_seconds"] is not None
    assert evidence["summary"]["oom"] is False
