"""The runs list's search and tag filter on both databases (the embedded SQLite default answered 500).

The same scenario runs in-process on PostgreSQL and in a child process on the embedded default.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import scenario_answers

SCENARIO = """
import json
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from apps.research import services as research_services
from tests.factories import make_run

runs = {name: make_run(name=name) for name in ("alpha", "beta", "gamma", "demo tagged nowhere")}
research_services.run_label(run=runs["alpha"], actor="user:t", tags=["Demo", "lr-sweep"])
research_services.run_label(run=runs["beta"], actor="user:t", tags=["demonstration"])
research_services.run_label(run=runs["gamma"], actor="user:t", tags=["x", "demo"])
admin = get_user_model().objects.create_superuser("search-admin", "a@example.org", "pw")
client = Client(HTTP_HOST="localhost")
client.force_login(admin)
answers = {}
for query in ("tag=demo", "tag=lr-sweep", "tag=demon", "q=demo", "q=sweep", "tag=%22demo%22"):
    response = client.get(reverse("dashboard:run-list") + "?" + query)
    body = response.content.decode()
    answers[query] = [response.status_code, sorted(n for n in runs if f">{n}<" in body)]
print(json.dumps(answers))
"""

EXPECTED = {
    # Exact elements only: "demonstration" is not the tag "demo", nor is a quoted "demo".
    "tag=demo": [200, ["alpha", "gamma"]],
    "tag=lr-sweep": [200, ["alpha"]],
    "tag=demon": [200, []],
    # Search: a name holding the text, or a tag equal to it (lower-cased).
    "q=demo": [200, ["alpha", "demo tagged nowhere", "gamma"]],
    "q=sweep": [200, []],
    "tag=%22demo%22": [200, []],
}


@pytest.mark.django_db(transaction=True)
def test_search_and_tag_filter_on_postgresql():
    assert scenario_answers(SCENARIO) == EXPECTED


def test_search_and_tag_filter_on_the_embedded_sqlite_default(tmp_path: Path):
    assert scenario_answers(SCENARIO, sqlite_dir=tmp_path) == EXPECTED
