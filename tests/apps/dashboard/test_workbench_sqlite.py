"""The runs list's status and date filters, query by value, sort and CSV export on both databases.

The same scenario runs in-process on PostgreSQL and in a child process on the embedded SQLite
default (as test_run_search.py does for search and tags): the runs list must answer the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import scenario_answers

SCENARIO = """
import csv, io, json
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from apps.research.choices import RunStatus
from apps.research.services import run_set_status
from tests.factories import make_run

made = {name: make_run(name=name, max_parallel_workers=workers)
        for name, workers in (("alpha", 1), ("beta", 3), ("gamma", 2))}
run_set_status(run=made["alpha"], status=RunStatus.RUNNING, actor="test")
admin = get_user_model().objects.create_superuser("workbench-admin", "a@example.org", "pw")
client = Client(HTTP_HOST="localhost")
client.force_login(admin)
answers = {}
for query in ("status=running", "created_after=2000-01-01", "created_before=2000-01-01",
              "query=max_parallel_workers+>=+2", "query=status+%3D+running+or+max_parallel_workers+%3D+3",
              "sort=-max_parallel_workers", "sort=max_parallel_workers&query=status+!%3D+running",
              "created_after=yesterday", "query=final+>", "sort=nonsense"):
    response = client.get(reverse("dashboard:run-list") + "?" + query)
    body = response.content.decode()
    shown = sorted((body.find(f'data-run="{run.uuid}"'), name) for name, run in made.items())
    answers[query] = [response.status_code, [name for at, name in shown if at >= 0]]
exported = client.get(reverse("dashboard:runs-export", args=["csv"]) + "?sort=max_parallel_workers")
answers["csv"] = [exported.status_code, [row["name"] for row in csv.DictReader(io.StringIO(exported.content.decode()))]]
print(json.dumps(answers))
"""

EXPECTED = {
    "status=running": [200, ["alpha"]],
    "created_after=2000-01-01": [200, ["gamma", "beta", "alpha"]],  # newest first
    "created_before=2000-01-01": [200, []],
    "query=max_parallel_workers+>=+2": [200, ["gamma", "beta"]],
    "query=status+%3D+running+or+max_parallel_workers+%3D+3": [200, ["beta", "alpha"]],
    "sort=-max_parallel_workers": [200, ["beta", "gamma", "alpha"]],
    "sort=max_parallel_workers&query=status+!%3D+running": [200, ["gamma", "beta"]],
    "created_after=yesterday": [400, []],
    "query=final+>": [400, []],
    "sort=nonsense": [400, []],
    "csv": [200, ["alpha", "gamma", "beta"]],
}


@pytest.mark.django_db(transaction=True)
def test_filters_query_sort_and_export_on_postgresql():
    assert scenario_answers(SCENARIO) == EXPECTED


def test_filters_query_sort_and_export_on_the_embedded_sqlite_default(tmp_path: Path):
    assert scenario_answers(SCENARIO, sqlite_dir=tmp_path) == EXPECTED
