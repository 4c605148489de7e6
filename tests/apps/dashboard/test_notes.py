"""Notes (issue 36, item 6): a markdown note per run and per experiment, append-only versions with
author and time, rendered without the author's own HTML, carried in the run bundle."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from django.urls import reverse

from apps.research.models import Note

pytestmark = pytest.mark.django_db

JSON = {"HTTP_ACCEPT": "application/json"}
HOSTILE = 'Plan **SFT** next.\n\n<script>alert("x")</script> <img src=x onerror=alert(1)> [go](javascript:alert(1))'


def _post(client, run, text, experiment=""):
    return client.post(reverse("dashboard:note-post", args=[run.uuid]), {"text": text, "experiment": experiment},
                       **JSON)  # fmt: skip


def test_run_notes_are_versioned_and_rendered_without_raw_html(world, as_role):
    client = as_role("operator")
    assert _post(client, world.run, "first *idea*").json()["version"] == 1
    assert _post(client, world.run, HOSTILE).json()["version"] == 2
    versions = list(Note.objects.filter(run=world.run, experiment=None).order_by("version"))
    assert [(n.version, n.author, n.text) for n in versions] == [
        (1, world.people["operator"], "first *idea*"), (2, world.people["operator"], HOSTILE.strip())]  # fmt: skip
    html = as_role("viewer").get(reverse("dashboard:run-detail", args=[world.run.uuid])).content.decode()
    current = html.split('id="note-current">')[1].split("</div>")[0]
    assert "<strong>SFT</strong>" in current
    assert "<script>" not in current
    assert "&lt;script&gt;" in current
    assert "<img" not in current
    assert 'href="javascript:' not in current
    assert "2 versions" in html
    assert "v1 · operator-person" in html
    assert 'id="note-form"' not in html  # viewers read notes; operators write them


def test_an_experiment_has_its_own_note(world, as_role):
    client = as_role("operator")
    assert _post(client, world.run, "exp_0002 is contaminated", experiment="exp_0002").json()["version"] == 1
    assert _post(client, world.run, "run-level note").json()["version"] == 1
    page = client.get(reverse("dashboard:experiment", args=[world.run.uuid, "exp_0002"])).content.decode()
    assert "exp_0002 is contaminated" in page
    assert "run-level note" not in page
    assert 'name="experiment" value="exp_0002"' in page


@pytest.mark.parametrize(
    ("text", "experiment", "status", "code"),
    [("   ", "", 400, "invalid"), ("x" * 20_001, "", 400, "invalid"), ("fine", "exp_9999", 404, None)],
)
def test_bad_notes_are_refused_and_nothing_is_stored(world, as_role, text, experiment, status, code):
    answer = _post(as_role("operator"), world.run, text, experiment)
    assert answer.status_code == status
    if code:
        assert answer.json()["code"] == code
    assert Note.objects.count() == 0
    assert _post(as_role("viewer"), world.run, "viewers cannot write").status_code == 403
    assert Note.objects.count() == 0


def test_the_bundle_carries_every_version(world, as_role):
    client = as_role("operator")
    _post(client, world.run, "v1")
    _post(client, world.run, "v2")
    _post(client, world.run, "on exp_0001", experiment="exp_0001")
    archive = client.get(reverse("dashboard:run-export", args=[world.run.uuid])).content
    bundle = json.loads(zipfile.ZipFile(io.BytesIO(archive)).read("run.json"))
    assert [(n["subject"], n["version"], n["author"], n["text"]) for n in bundle["notes"]] == [
        ("run", 1, "operator-person", "v1"), ("run", 2, "operator-person", "v2"),
        ("exp_0001", 1, "operator-person", "on exp_0001")]  # fmt: skip
