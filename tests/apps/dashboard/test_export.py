"""Run bundles (issue 15, point 8): export a finished run, no sealed text in it, import into an empty instance.

The import goes to a fresh database of its own, migrated and written by child ``manage.py``
processes, as an operator restoring a bundle on another instance would do it.
"""

from __future__ import annotations

import io
import json
import zipfile

import psycopg
import pytest
from django.core.management import call_command
from django.urls import reverse

from apps.experiments.anchors import instance_fingerprint
from apps.experiments.events import chain_key
from apps.experiments.models import Evaluation, EvaluationSample, Event
from apps.flows.bundle import FORMAT_VERSION, bundle_read, bundle_sign, export_run_bundle
from tests.support.bundles import empty_instance as empty_instance_of
from tests.support.bundles import manage, sealed_finished_world, table_count

pytestmark = pytest.mark.django_db


@pytest.fixture
def sealed_world(people, settings, tmp_path):
    """The dashboard's finished world on a registered benchmark with real sealed items."""
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    return sealed_finished_world(tmp_path, people=people)


def test_bundle_holds_the_run_without_sealed_text(sealed_world):
    world, sealed = sealed_world
    run = world.run
    bundle = export_run_bundle(run)
    text = json.dumps(bundle, ensure_ascii=False)

    for item in sealed:
        assert item["prompt"] not in text
        assert item["answer"] not in text
    assert bundle["version"] == FORMAT_VERSION
    tables = bundle["tables"]
    assert {row["handle"] for row in tables["experiments.experiment"]} == {
        "exp_0001",
        "exp_0002",
        "exp_0003",
        "exp_0004",
    }
    assert {row["handle"] for row in tables["research.researchnode"]} >= {"main", "worker_0001", "reviewer_0001"}
    assert len(tables["research.decision"]) >= 3
    assert len(tables["research.researchedge"]) >= 2
    # Every evaluation and per-sample result, by sample id and correctness (outputs dropped).
    assert len(tables["experiments.evaluation"]) == Evaluation.objects.filter(run=run).count()
    samples = tables["experiments.evaluationsample"]
    assert len(samples) == EvaluationSample.objects.filter(evaluation__run=run).count() > 20
    assert {row["sample_id"] for row in samples} >= {item["id"] for item in sealed if item["id"].startswith("final")}
    assert {row["output"] for row in samples} == {""}
    assert sum(row["correct"] for row in samples) > 0
    # The whole sealed chain, and the integrity report as the dashboard computes it.
    assert len(tables["experiments.event"]) == Event.objects.filter(chain__key=chain_key(run)).count()
    assert bundle["chain"]["events"] == len(tables["experiments.event"])
    exp2 = next(s for s in bundle["integrity_report"]["submissions"] if s["experiment"] == "exp_0002")
    assert exp2["hacked"] is True
    assert bundle["scores"]["returned_checkpoint"] == run.result_checkpoint.handle
    # Checkpoints: manifests and hashes, no artifact bytes.
    checkpoints = {row["handle"]: row for row in tables["experiments.checkpoint"]}
    assert run.result_checkpoint.handle in checkpoints
    assert all(len(row["manifest_sha256"]) == 64 and row["manifest"] for row in checkpoints.values())


def test_operators_download_the_bundle_from_the_run_page(sealed_world, as_role):
    world, sealed = sealed_world
    page = reverse("dashboard:run-detail", args=[world.run.uuid])
    export = reverse("dashboard:run-export", args=[world.run.uuid])

    assert f'href="{export}"' in as_role("operator").get(page).content.decode()
    assert f'href="{export}"' not in as_role("viewer").get(page).content.decode()
    assert as_role("viewer").get(export).status_code == 403
    assert as_role(None).get(export).status_code == 302  # to the login page
    response = as_role("admin").get(export)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        bundle = json.loads(archive.read("run.json"))
        scores = archive.read("scores.csv").decode()
    assert bundle["run"] == str(world.run.uuid)
    lines = scores.strip().splitlines()
    assert lines[0].startswith("evaluation,experiment,checkpoint,split")
    assert len(lines) == 1 + Evaluation.objects.filter(run=world.run).count()
    assert any(",final," in line and ",0.55," in line for line in lines)


IMPORTED_PAGES = """
import json
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from apps.research.models import Run
from apps.flows.scores import run_scores
run = Run.objects.get(uuid="{run}")
client = Client()
client.force_login(User.objects.create_superuser("imported-admin", password="pw-imported-123"))
pages = {{name: client.get(reverse("dashboard:" + name, args=[run.uuid]), HTTP_HOST="localhost").status_code
         for name in ("run-detail", "integrity")}}
scores = run_scores(run=run)
print(json.dumps({{"run": pages["run-detail"], "integrity": pages["integrity"],
                  "returned": scores.returned_checkpoint, "raw": scores.raw.score,
                  "created_at": run.created_at.isoformat()}}))
"""


@pytest.fixture
def empty_instance(tmp_path):
    with empty_instance_of(tmp_path / "instance") as env:
        yield env


def test_import_into_an_empty_instance_keeps_the_chain_and_refuses_twice(sealed_world, empty_instance, tmp_path):
    world, _ = sealed_world
    run = world.run
    path = tmp_path / "bundle.zip"
    call_command("export_run", str(run.uuid), str(path), stdout=io.StringIO())
    bundle = bundle_read(path)
    events = len(bundle["tables"]["experiments.event"])
    url = empty_instance["DATABASE_URL"]

    # A bundle whose chain was edited is refused, and leaves nothing behind.
    tampered = json.loads(json.dumps(bundle))
    tampered["tables"]["experiments.event"][-1]["arguments"] = {"edited": True}
    tampered_path = tmp_path / "tampered.json"
    tampered_path.write_text(json.dumps(tampered), encoding="utf-8")
    refused = manage(empty_instance, "import_run", str(tampered_path))
    assert refused.returncode != 0
    assert "differs from its signed hash" in refused.stderr
    assert table_count(url, "research_run") == 0
    assert table_count(url, "benchmarks_benchmark") == 0

    # A row that collides half-way (a checkpoint handle taken here) rolls back what was written before it.
    taken = run.result_checkpoint.handle
    made = manage(
        empty_instance,
        "shell",
        "-c",
        f"from tests.factories import CheckpointFactory; CheckpointFactory(handle={taken!r})",
    )
    assert made.returncode == 0, made.stderr[-3000:]
    collided = manage(empty_instance, "import_run", str(path))
    assert collided.returncode != 0
    assert "conflicts with rows here" in collided.stderr
    assert table_count(url, "benchmarks_benchmark") == 0  # written before the checkpoints, rolled back with them
    assert table_count(url, "research_run") == 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE experiments_checkpoint CASCADE")  # the guards refuse DELETE; clean-up only

    imported = manage(empty_instance, "import_run", str(path))
    assert imported.returncode == 0, imported.stderr[-3000:]
    verified = manage(empty_instance, "verify_events", "--run", str(run.uuid))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"chain {run.uuid}: OK ({events + 1} events)" in verified.stdout  # and the import's own event
    assert "imported from instance " + instance_fingerprint() in imported.stdout
    assert table_count(url, "experiments_experiment") == 4
    assert table_count(url, "experiments_evaluationsample") == len(bundle["tables"]["experiments.evaluationsample"])
    assert table_count(url, "integrity_integrityfinding") == len(bundle["tables"]["integrity.integrityfinding"])
    # The imported run reads there as here: its page, its integrity report and its scores.
    shown = manage(empty_instance, "shell", "-c", IMPORTED_PAGES.format(run=run.uuid))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert json.loads(shown.stdout.strip().splitlines()[-1]) == {
        "run": 200, "integrity": 200, "returned": bundle["scores"]["returned_checkpoint"],
        "raw": bundle["scores"]["raw"]["score"], "created_at": bundle["tables"]["research.run"][0]["created_at"],
    }  # fmt: skip

    # Exported again from there, it is the same run: the same chain links and per-sample results.
    reexported = manage(empty_instance, "export_run", str(run.uuid), str(tmp_path / "again.zip"))
    assert reexported.returncode == 0, reexported.stderr[-3000:]
    again_bundle = bundle_read(tmp_path / "again.zip")
    for label, columns in (
        ("experiments.event", ("seq", "hash")),
        ("experiments.evaluationsample", ("sample_id", "correct")),
    ):
        again_rows = sorted(tuple(r[c] for c in columns) for r in again_bundle["tables"][label])
        if label == "experiments.event":  # and one event more there: the import, with its origin
            imported_event = again_bundle["tables"][label][-1]
            assert imported_event["type"] == "run.imported"
            assert imported_event["arguments"]["origin"] == instance_fingerprint()
            again_rows = again_rows[:-1]
        assert again_rows == sorted(tuple(r[c] for c in columns) for r in bundle["tables"][label])
    assert "imported" in again_bundle["tables"]["research.run"][0]["tags"]

    again = manage(empty_instance, "import_run", str(path))
    assert again.returncode != 0
    assert "already exists" in again.stderr
    assert table_count(url, "research_run") == 1
    assert table_count(url, "experiments_event") == events + 1


def test_a_bundle_written_before_newer_columns_imports_with_their_defaults(sealed_world, empty_instance, tmp_path):
    # A bundle from before the benchmark contract, the evaluation's engine record and the
    # checkpoint's model profile existed: those columns take their defaults, nothing else changes.
    world, _ = sealed_world
    path = tmp_path / "bundle.zip"
    call_command("export_run", str(world.run.uuid), str(path), stdout=io.StringIO())
    old = bundle_read(path)
    for key in ("contract", "contract_sha256"):
        del old["benchmark"][key]
    for label, column in (("experiments.evaluation", "inference"), ("experiments.checkpoint", "model_profile")):
        assert old["tables"][label], label
        for row in old["tables"][label]:
            del row[column]
    bundle_sign(old)  # as the exporting instance signed it then
    old_path = tmp_path / "old.json"
    old_path.write_text(json.dumps(old), encoding="utf-8")
    imported = manage(empty_instance, "import_run", str(old_path))
    assert imported.returncode == 0, imported.stderr[-3000:]
    with psycopg.connect(empty_instance["DATABASE_URL"], autocommit=True) as conn:
        benchmarks = conn.execute("SELECT contract::text, contract_sha256 FROM benchmarks_benchmark").fetchall()
        assert benchmarks == [("{}", "")]
        assert {r[0] for r in conn.execute("SELECT inference::text FROM experiments_evaluation")} == {"{}"}
