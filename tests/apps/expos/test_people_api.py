"""Notes and alert rules over the REST API (issue 36): what the dashboard's pages do, for scripts.

People sign in with the Django session (the CSRF token is checked on writes); viewers read notes
and keep their own alert rules, operators write notes, agent tokens are refused. Notes are
versioned with ETag / If-Match (412 on a stale one); bad input is a 400 naming what to fix, and
nothing is stored.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from apps.alerts.models import AlertRule
from apps.experiments.services import experiment_create
from apps.expos.auth import agent_token_issue
from apps.research.choices import NodeKind
from apps.research.models import Note, ResearchNode
from apps.research.notes import note_add
from apps.research.services import node_create
from tests.apps.dashboard.world import PASSWORD, make_people
from tests.factories import make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def run(db):
    return make_run(name="noted run")


def signed_in(username: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    assert client.login(username=username, password=PASSWORD)
    client.get("/accounts/login/")  # the sign-in page sets the csrftoken cookie, as a script would read it
    return client


def send(client: Client, method: str, path: str, body: object = None, **headers: str):
    token = client.cookies["csrftoken"].value if "csrftoken" in client.cookies else ""
    data = json.dumps(body) if body is not None else None
    headers = {"X-CSRFToken": token, **headers}
    return getattr(client, method)(path, data=data, content_type="application/json", headers=headers)


def test_a_run_note_is_read_written_and_versioned_with_etags(people, run):
    operator = signed_in("operator-person")
    url = f"/api/v1/runs/{run.uuid}/note/"
    empty = operator.get(url)
    assert empty.status_code == 200
    assert (empty.json()["version"], empty.json()["text"], empty["ETag"]) == (0, "", f'"note.{run.uuid}.0"')

    first = send(operator, "put", url, {"text": "# lr sweep\nlow lr wins"}, **{"If-Match": empty["ETag"]})
    assert first.status_code == 200, first.content
    assert (first.json()["version"], first.json()["author"], first["ETag"]) == (1, "operator-person",
                                                                                 f'"note.{run.uuid}.1"')  # fmt: skip
    # Someone else saves in between: the first writer's ETag is stale now.
    note_add(run=run, author=people["admin"], text="admin's edit")
    stale = send(operator, "put", url, {"text": "my second thought"}, **{"If-Match": first["ETag"]})
    assert stale.status_code == 412
    assert stale.json()["error"]["code"] == "precondition_failed"
    assert stale.json()["error"]["detail"]["current_etag"] == f'"note.{run.uuid}.2"'
    assert "read it again" in stale.json()["error"]["message"]
    assert Note.objects.filter(run=run).count() == 2
    # Read again, retry with the new ETag; without If-Match a write simply adds the next version.
    fresh = operator.get(url)
    assert fresh.json()["text"] == "admin's edit"
    assert send(operator, "put", url, {"text": "merged"}, **{"If-Match": fresh["ETag"]}).status_code == 200
    assert send(operator, "put", url, {"text": "last"}).json()["version"] == 4

    viewer = signed_in("viewer-person")
    versions = viewer.get(f"{url}versions/").json()
    assert [(v["version"], v["text"]) for v in versions["results"]] == [
        (4, "last"), (3, "merged"), (2, "admin's edit"), (1, "# lr sweep\nlow lr wins")]  # fmt: skip
    assert viewer.get(f"{url}versions/?limit=1").json()["results"][0]["version"] == 4


def test_an_experiment_note_is_its_own_subject(people, run):
    worker = node_create(run=run, kind=NodeKind.WORKER, task="sft")
    experiment = experiment_create(run=run, owner=worker, kind="train_eval", input_checkpoint=run.base_checkpoint,
                                   action={"recipe": "sft"})  # fmt: skip
    operator = signed_in("operator-person")
    url = f"/api/v1/experiments/{experiment.uuid}/note/"
    written = send(operator, "put", url, {"text": "diverged at step 40"}, **{"If-Match": f'"note.{experiment.uuid}.0"'})
    assert written.status_code == 200, written.content
    assert (written.json()["subject"], written.json()["version"]) == (experiment.handle, 1)
    # The run's note is another subject: the experiment's ETag does not match it.
    run_url = f"/api/v1/runs/{run.uuid}/note/"
    other = send(operator, "put", run_url, {"text": "x"}, **{"If-Match": written["ETag"]})
    assert other.status_code == 412
    assert operator.get(run_url).json()["version"] == 0
    assert [n.version for n in Note.objects.filter(experiment=experiment)] == [1]
    assert operator.get(f"{url}versions/").json()["count"] == 1


@pytest.mark.parametrize(
    ("body", "headers", "status", "code", "says"),
    [
        ({"text": "   "}, {}, 400, "note_empty", "needs some text"),
        ({"text": "x" * 20_001}, {}, 400, "note_too_long", "under 20000"),
        ({}, {}, 400, "invalid", "required"),
        ({"text": 7}, {}, 400, "invalid", "valid string"),
        ({"text": "ok", "version": 3}, {}, 400, "invalid", "send only text"),
        (["text"], {}, 400, "invalid", "dictionary"),
        ({"text": "a\u0000b"}, {}, 400, "invalid_input", "/text"),
        ({"text": "ok"}, {"If-Match": "x" * 201}, 400, "invalid_if_match", "ETag as read"),
        ({"text": "ok"}, {"If-Match": '"note.nonsense.1"'}, 412, "precondition_failed", "read it again"),
    ],
)
def test_a_bad_note_write_is_refused_clearly_and_stores_nothing(people, run, body, headers, status, code, says):
    answer = send(signed_in("operator-person"), "put", f"/api/v1/runs/{run.uuid}/note/", body, **headers)
    assert answer.status_code == status, answer.content
    error = answer.json()["error"]
    assert error["code"] == code
    assert says in json.dumps(error)
    assert Note.objects.count() == 0


def test_who_may_read_and_write_notes(people, run):
    url = f"/api/v1/runs/{run.uuid}/note/"
    note_add(run=run, author=people["operator"], text="kept")
    viewer = signed_in("viewer-person")
    assert viewer.get(url).json()["text"] == "kept"
    refused = send(viewer, "put", url, {"text": "a viewer's edit"})
    assert refused.status_code == 403
    assert "operator role" in refused.json()["error"]["message"]
    assert signed_in("nobody-person").get(url).status_code == 403
    assert Client().get(url).status_code in (401, 403)
    # The session's CSRF check holds for writes.
    assert signed_in("operator-person").put(url, data='{"text": "no token"}',
                                             content_type="application/json").status_code == 403  # fmt: skip
    # Notes are people's: an agent token, even the Main Agent's of this run, is refused.
    main = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
    token, _ = agent_token_issue(run=run, node=main, role="main")
    agent = Client(headers={"Authorization": f"Bearer {token}"})
    for answer in (agent.get(url), agent.put(url, data='{"text": "an agent note"}', content_type="application/json"),
                   agent.get("/api/v1/alerts/")):  # fmt: skip
        assert answer.status_code == 403
        assert "agent token may not" in answer.json()["error"]["message"]
    assert [n.text for n in Note.objects.all()] == ["kept"]
    assert Client().get("/api/v1/runs/not-a-uuid/note/", headers={}).status_code in (401, 403)
    assert viewer.get("/api/v1/runs/not-a-uuid/note/").json()["error"]["code"] == "not_found"
    assert viewer.get("/api/v1/experiments/00000000-0000-0000-0000-000000000000/note/").status_code == 404


def test_alert_rules_are_listed_created_and_deleted_by_their_owner(people, run):
    viewer = signed_in("viewer-person")
    url = "/api/v1/alerts/"
    hook = "https://hooks.example.org/services/T000/B000/secret-part"
    made = send(viewer, "post", url, {"channel": "slack", "target": hook, "triggers": ["run_failed", "run_finished"],
                                      "run": str(run.uuid)})  # fmt: skip
    assert made.status_code == 201, made.content
    rule = made.json()
    assert (rule["channel"], rule["run"], rule["triggers"]) == ("slack", str(run.uuid), ["run_finished", "run_failed"])
    assert rule["target"] == "https://hooks.example.org/…"  # the hook's secret path is never shown back
    assert "secret-part" not in json.dumps(viewer.get(url).json())
    every = send(viewer, "post", url, {"channel": "email", "target": "me@example.org", "triggers": ["job_failed"]})
    assert (every.status_code, every.json()["run"]) == (201, None)
    assert [r["uuid"] for r in viewer.get(url).json()["results"]] == [every.json()["uuid"], rule["uuid"]]
    assert viewer.get(f"{url}{rule['uuid']}/").json()["deliveries"] == []

    # Another person sees none of them and cannot delete them.
    other = signed_in("operator-person")
    assert other.get(url).json()["count"] == 0
    assert send(other, "delete", f"{url}{rule['uuid']}/").status_code == 404
    assert AlertRule.objects.count() == 2
    assert send(viewer, "delete", f"{url}{rule['uuid']}/").status_code == 204
    assert list(AlertRule.objects.values_list("target", flat=True)) == ["me@example.org"]
    assert send(viewer, "delete", f"{url}{rule['uuid']}/").status_code == 404
    assert signed_in("nobody-person").get(url).status_code == 403


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ({"channel": "pager", "target": "http://127.0.0.1:9/x", "triggers": ["run_failed"]}, "invalid", "channel"),
        ({"channel": "slack", "target": "ftp://127.0.0.1/x", "triggers": ["run_failed"]}, "invalid_target", "http(s)"),
        ({"channel": "email", "target": "nobody", "triggers": ["run_failed"]}, "invalid_target", "e-mail"),
        ({"channel": "email", "target": "me@example.org", "triggers": []}, "invalid", "triggers"),
        ({"channel": "email", "target": "me@example.org", "triggers": ["coffee_ready"]}, "invalid", "coffee_ready"),
        ({"channel": "email", "target": "me@example.org", "triggers": "run_failed"}, "invalid", "list"),
        ({"channel": "email", "target": "me@example.org", "triggers": ["run_failed"], "run": "nope"}, "invalid",
         "UUID"),
        ({"channel": "email", "target": "me@example.org", "triggers": ["run_failed"],
          "run": "00000000-0000-0000-0000-000000000000"}, "invalid_run", "leave run out"),
        ({"channel": "email", "target": "me@example.org", "triggers": ["run_failed"], "owner": 1}, "invalid",
         "send only"),
        ({"channel": "email", "target": "me\ud800@example.org", "triggers": ["run_failed"]}, "invalid_input",
         "surrogate"),
    ],
)  # fmt: skip
def test_a_bad_alert_rule_is_refused_clearly_and_stores_nothing(people, body, code, says):
    answer = send(signed_in("viewer-person"), "post", "/api/v1/alerts/", body)
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error["code"] == code
    assert says in json.dumps(error), error
    assert AlertRule.objects.count() == 0
