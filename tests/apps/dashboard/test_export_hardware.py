"""A run bundle carries each job's hardware evidence (issue 37, item 4)."""

from __future__ import annotations

import json

import pytest

from apps.flows.bundle import export_run_bundle
from apps.jobs.models import Job
from tests.support.bundles import sealed_finished_world

pytestmark = pytest.mark.django_db


def test_the_bundle_exports_every_jobs_hardware_summary_and_samples(people, settings, tmp_path):
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    world, _ = sealed_finished_world(tmp_path, people=people)
    jobs = list(Job.objects.filter(run=world.run).order_by("pk"))
    assert jobs
    sample = {"t": 10, "cpu_percent": 88.0, "ram_mib": 4321.0, "host_ram_percent": 40.0, "gpus": []}
    Job.objects.filter(pk=jobs[0].pk).update(metrics={**jobs[0].metrics, "hardware": [sample]})
    bundle = export_run_bundle(world.run)
    by_job = {entry["job"]: entry for entry in bundle["hardware"]}
    assert set(by_job) == {str(j.uuid) for j in jobs}
    first = by_job[str(jobs[0].uuid)]
    assert first["samples"] == [sample]
    assert first["summary"]["peak_ram_mib"] == 4321.0
    assert first["summary"]["oom"] is False
    json.dumps(bundle)  # it is plain JSON, as run.json is written
