"""The job page's hardware chart and summary (issue 37, item 4)."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from apps.jobs.models import Job

pytestmark = pytest.mark.django_db

GPU = {"index": 0, "util_percent": 97.0, "memory_mib": 70_000.0, "memory_total_mib": 81_559.0, "temperature_c": 71.0}


def test_job_page_charts_the_samples_and_says_peak_memory_and_oom(world, as_role):
    job = world.jobs["running"]
    samples = [{"t": 0, "cpu_percent": 10, "ram_mib": 800, "host_ram_percent": 30, "gpus": []},
               {"t": 10, "cpu_percent": 95, "ram_mib": 1234, "host_ram_percent": 31, "gpus": [GPU]}]  # fmt: skip
    Job.objects.filter(pk=job.pk).update(
        metrics={**job.metrics, "hardware": samples}, error="torch.OutOfMemoryError: CUDA out of memory."
    )
    response = as_role("viewer").get(reverse("dashboard:job", args=[job.uuid]))
    html = response.content.decode()
    assert 'peak RAM <span id="hw-peak-ram">1234.0</span> MiB' in html  # the span hardware.js renews live
    assert "GPU 0 peak 70000.0 / 81559.0 MiB" in html
    assert "out of memory" in html
    figure = response.context["hardware_figure"]
    assert [trace["name"] for trace in figure["data"]][:4] == ["CPU %", "RAM MiB", "GPU 0 util %", "GPU 0 MiB"]
    assert figure["data"][1]["y"] == [800, 1234]
    assert 'id="hardware-figure"' in html
    assert json.loads(html.split('id="hardware-figure" type="application/json">')[1].split("</script>")[0])


def test_a_job_without_samples_says_so(world, as_role):
    job = world.jobs["running"]
    Job.objects.filter(pk=job.pk).update(metrics={k: v for k, v in job.metrics.items() if k != "hardware"})
    response = as_role("viewer").get(reverse("dashboard:job", args=[job.uuid]))
    texts = [a["text"] for a in response.context["hardware_figure"]["layout"].get("annotations", [])]
    assert texts == ["No samples yet."]


def test_the_experiment_node_summarises_each_jobs_hardware(world, as_role):
    job = world.jobs["running"]
    samples = [{"t": 10, "cpu_percent": 95, "ram_mib": 2048, "host_ram_percent": 31, "gpus": [GPU]}]
    Job.objects.filter(pk=job.pk).update(metrics={**job.metrics, "hardware": samples})
    experiment = job.experiment
    response = as_role("viewer").get(reverse("dashboard:experiment", args=[experiment.run.uuid, experiment.handle]))
    html = response.content.decode()
    assert "peak RAM 2048.0 MiB · GPU 0 peak 70000.0 MiB" in html
    row = next(r for r in response.context["jobs"] if r["job"].pk == job.pk)
    assert row["hardware"]["runtime_seconds"] is not None


def test_the_job_pages_hardware_json_is_what_the_page_redraws_live(world, as_role):
    job = world.jobs["running"]
    url = reverse("dashboard:job-hardware", args=[job.uuid])
    page = as_role("viewer").get(reverse("dashboard:job", args=[job.uuid]))
    assert page.context["page_config"]["hardware"] == url
    Job.objects.filter(pk=job.pk).update(
        metrics={**job.metrics, "hardware": [{"t": 0, "cpu_percent": 10, "ram_mib": 900, "gpus": [GPU]}]}
    )
    body = as_role("viewer").get(url).json()
    assert body["figure"]["data"][1]["y"] == [900]
    assert body["summary"]["peak_ram_mib"] == 900.0
    assert body["summary"]["gpus"][0]["memory_mib"] == 70_000.0
    assert as_role("nobody").get(url).status_code == 403
    assert as_role("viewer").get(reverse("dashboard:job-hardware", args=[world.run.uuid])).status_code == 404
