"""Run-level health: when most of a run's recent jobs fail, the run says so and the Main Agent hears it.

Jobs end through the job services (claim, then fail or succeed), as a worker ends them; the
run's events, its Main Agent's inbox and its page are what an operator and the agent would see.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from apps.experiments.models import Event
from apps.flows import runs
from apps.jobs import services as jobs
from apps.jobs.choices import JobKind
from apps.research.models import AgentLoop
from tests.apps.dashboard.world import make_people
from tests.factories import make_run

pytestmark = pytest.mark.django_db

ENOSPC = "Traceback (most recent call last):\n  ...\nOSError: [Errno 28] No space left on device"


def end_job(run, outcome: str, kind: str = JobKind.TRAIN) -> None:
    job = jobs.job_enqueue(kind=kind, spec={"x": 1}, run=run)
    job = jobs.job_claim(job_id=job.pk, worker="host:1")
    if outcome == "fail":
        jobs.job_fail(job=job, error=ENOSPC)
    else:
        jobs.job_succeed(job=job, result={})


def health_events(run) -> list[Event]:
    return list(Event.objects.filter(run=run, type__startswith="run.jobs_").order_by("pk"))


def main_inbox(run) -> list[dict]:
    return list(AgentLoop.objects.get(run=run, node__kind="main").inbox)


def test_three_failures_in_the_last_four_jobs_are_recorded_once_and_wake_the_main_agent():
    run = runs.run_start(run=make_run())
    for outcome in ("succeed", "fail", "fail"):
        end_job(run, outcome)
    assert health_events(run) == []  # 2 of 3: not yet

    end_job(run, "fail")

    [failing] = health_events(run)
    assert failing.type == "run.jobs_failing"
    assert (failing.arguments["failed"], failing.arguments["ended"], failing.arguments["window"]) == (3, 4, 4)
    assert "No space left on device" in failing.arguments["summary"]
    [woken] = [item for item in main_inbox(run) if item["trigger"] == "jobs_failing"]
    assert "3 of the run's last 4 jobs failed" in woken["summary"]
    assert Event.objects.filter(run=run, type="main.triggered", arguments__trigger="jobs_failing").count() == 1

    # Further failures and a success that leaves 3 of 4 failed say nothing new.
    end_job(run, "fail")
    end_job(run, "succeed")
    assert [e.type for e in health_events(run)] == ["run.jobs_failing"]
    # The success that brings it under the threshold is recorded; the Main Agent is not woken again.
    end_job(run, "succeed")
    assert [e.type for e in health_events(run)] == ["run.jobs_failing", "run.jobs_recovered"]
    assert [i["trigger"] for i in main_inbox(run)].count("jobs_failing") == 1


def test_the_window_and_threshold_come_from_the_run_policy():
    run = runs.run_start(run=make_run(policy={"job_failure_window": 2, "job_failure_threshold": 2}))
    end_job(run, "fail")
    assert health_events(run) == []
    end_job(run, "fail")
    assert [(e.type, e.arguments["failed"], e.arguments["window"]) for e in health_events(run)] == [
        ("run.jobs_failing", 2, 2)
    ]


def test_the_run_page_shows_that_most_jobs_are_failing_with_their_errors():
    people = make_people()
    run = runs.run_start(run=make_run())
    client = Client()
    client.force_login(people["viewer"])
    url = reverse("dashboard:run-detail", args=[run.uuid])
    for outcome in ("fail", "fail"):
        end_job(run, outcome)
    assert 'id="run-health"' not in client.get(url).content.decode()

    end_job(run, "fail")

    page = client.get(url).content.decode()
    assert 'id="run-health"' in page
    assert "3 of the last 3 jobs failed" in page
    assert "No space left on device" in page


def test_successes_of_another_kind_do_not_declare_the_run_recovered_while_the_failing_kind_still_fails():
    """Trainings fail on a full disk; evaluations, which store nothing, still succeed. Their successes
    bring the window under the threshold, but only a training that succeeds shows the disk is back."""
    run = runs.run_start(run=make_run())
    for _ in range(3):
        end_job(run, "fail")
    assert [e.type for e in health_events(run)] == ["run.jobs_failing"]

    end_job(run, "succeed", kind=JobKind.EVALUATE)
    end_job(run, "succeed", kind=JobKind.EVALUATE)  # 1 of the last 4 failed: under the threshold
    assert [e.type for e in health_events(run)] == ["run.jobs_failing"]
    end_job(run, "fail")  # still failing trainings: no second jobs_failing within the episode
    assert [e.type for e in health_events(run)] == ["run.jobs_failing"]

    end_job(run, "succeed")
    assert [e.type for e in health_events(run)] == ["run.jobs_failing", "run.jobs_recovered"]
    recovered = health_events(run)[1]
    assert recovered.arguments["failed"] < recovered.arguments["threshold"]
