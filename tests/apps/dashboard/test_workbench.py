"""The researcher's workbench (issue 36, items 1-3) on PostgreSQL: the runs table's columns, sort,
query and exports; a run's experiments table, parallel coordinates and curves; artifacts and their
downloads (sealed data never); the bundle's training metrics and logs. The world is
tests/apps/dashboard/workbench_world.py (services only); the SQLite half is test_workbench_sqlite.py.
"""

from __future__ import annotations

import csv
import io
import json
import zipfile

import pyarrow.parquet as pq
import pytest
from django.urls import reverse

from apps.datapool.storage import artifact_store
from apps.experiments.services import checkpoint_register
from apps.flows.scores import run_scores
from apps.research.models import Run
from tests.apps.dashboard.workbench_world import build_workbench

pytestmark = pytest.mark.django_db


@pytest.fixture
def bench(tmp_path, settings):
    settings.ARTIFACT_ROOT = str(tmp_path / "store")
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    return build_workbench(tmp_path / "made")


def _names(body: str, runs: list[Run]) -> list[str]:
    """The runs a runs-list page shows, in its order."""
    found = [(body.find(f'data-run="{run.uuid}"'), run.name) for run in runs]
    return [name for at, name in sorted(found) if at >= 0]


def test_the_runs_table_sorts_chooses_columns_queries_by_value_and_refuses_bad_input(
    bench, as_role, django_assert_max_num_queries
):
    client = as_role("viewer")
    runs = [bench.low, bench.high, bench.running]
    url = reverse("dashboard:run-list")

    # No query per run: the table's 14, and one each, for every row at once, for the jobs training now
    # (the live accelerator bars) and the flagged runs (selectors.runs_accelerator_in_flight, runs_flag_reasons).
    with django_assert_max_num_queries(16):
        page = client.get(url)
    body = page.content.decode()
    assert page.status_code == 200
    # The final-split score with its CI and the gain over θ0, straight from apps.flows.scores.
    assert '<td data-col="final" class="num nowrap"' in body
    assert "0.700 <span" in body
    assert "0.400 <span" in body
    assert ">0.750<" in body
    assert ">0.250<" in body
    assert _names(body, runs) == ["still running", "sweep high lr", "sweep low lr"]  # newest first

    assert _names(client.get(url, {"sort": "-final"}).content.decode(), runs) == [
        "sweep low lr", "sweep high lr", "still running"]  # fmt: skip
    # Ascending: a run with no final score still comes last.
    assert _names(client.get(url, {"sort": "gain"}).content.decode(), runs) == [
        "sweep high lr", "sweep low lr", "still running"]  # fmt: skip

    chosen = client.get(url, {"col": ["final", "hp.learning_rate", "train.loss", "policy.training_gate"]})
    text = chosen.content.decode()
    assert '<th class="sortable' in text
    assert 'data-col="hp.learning_rate"' in text
    assert 'data-col="train.loss"' in text
    assert 'data-col="budget"' not in text

    for query, expected in (
        ("final > 0.5 and lr < 1e-3", ["sweep low lr"]),
        ("gain >= 0.25 and not (hp.learning_rate = 1e-4)", ["sweep high lr"]),
        ("status = running or final < 0.5", ["still running", "sweep high lr"]),
        ("final = none", ["still running"]),
    ):
        answer = client.get(url, {"query": query})
        assert answer.status_code == 200, query
        assert sorted(_names(answer.content.decode(), runs)) == expected, query

    for params, message in (
        ({"query": "final >> 0.5"}, "query: expected a value after final &gt;"),
        ({"query": "final > 0.5 and"}, "query: expected a column name, found &#x27;the end&#x27;"),
        ({"query": "weights > 2"}, "query: unknown column &#x27;weights&#x27;"),
        ({"query": "__import__('os')"}, "query: unknown column &#x27;__import__&#x27;"),
        ({"query": "final > 0.5; drop table"}, "query: unexpected &#x27;;&#x27; (at character 12)"),
        ({"sort": "-nonsense"}, "sort: no column &#x27;nonsense&#x27;"),
        ({"col": "nonsense"}, "col: no column &#x27;nonsense&#x27;"),
        ({"created_after": "last tuesday"}, "created_after: Enter a valid date."),
        ({"status": "sleeping"}, "status: Select a valid choice."),
    ):
        refused = client.get(url, params)
        assert refused.status_code == 400, params
        assert message in refused.content.decode(), (params, refused.content.decode()[-3000:])
        assert 'data-run="' not in refused.content.decode()


def test_runs_export_as_csv_and_parquet_from_the_table_or_its_selection(bench, as_role):
    client = as_role("viewer")
    csv_url = reverse("dashboard:runs-export", args=["csv"])

    answer = client.get(csv_url, {"query": "final > 0.5 and lr < 1e-3"})
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.content.decode())))
    assert [row["name"] for row in rows] == ["sweep low lr"]
    row = rows[0]
    assert float(row["final"]) == pytest.approx(0.7)
    assert float(row["gain"]) == pytest.approx(0.75)
    assert float(row["theta0"]) == pytest.approx(0.25)
    assert float(row["hp.learning_rate"]) == pytest.approx(1e-4)
    assert row["hp.max_steps"] == "50"
    assert row["recipe"] == "sft"
    assert row["policy.training_gate"] == "False"
    # The same numbers as the run page's (apps.flows.scores.run_scores), read for all runs at once.
    scores = run_scores(run=bench.low)
    assert (float(row["final_low"]), float(row["final_high"])) == pytest.approx((scores.raw.low, scores.raw.high))
    assert row["hacking"] == scores.hacking_headline
    assert float(row["train.loss"]) > 0
    assert row["hacking"]

    parquet = client.get(reverse("dashboard:runs-export", args=["parquet"]), {"sort": "-final"})
    assert parquet.status_code == 200
    table = pq.read_table(io.BytesIO(parquet.content))
    assert table.column("name").to_pylist() == ["sweep low lr", "sweep high lr", "still running"]
    assert str(table.schema.field("final").type) == "double"
    assert table.column("final").to_pylist()[2] is None
    assert str(table.schema.field("hp.max_steps").type) == "int64"

    # The table's current selection (the checkboxes' runs=...), whatever the filters say.
    chosen = client.get(csv_url, {"selection": "1", "runs": [str(bench.high.uuid)]})
    assert [row["name"] for row in csv.DictReader(io.StringIO(chosen.content.decode()))] == ["sweep high lr"]
    for params, message in (
        ({"selection": "1"}, "Tick at least one run first."),
        ({"runs": ["not-a-uuid"]}, "runs: every selected run is named by its uuid."),
        ({"query": "final >"}, "query: expected a value after final >, found 'the end' (at character 8)"),
    ):
        refused = client.get(csv_url, params)
        assert refused.status_code == 400
        assert refused.json()["message"] == message
    assert client.get(reverse("dashboard:runs-export", args=["xlsx"])).status_code == 404
    assert as_role("nobody").get(csv_url).status_code == 403


def test_a_runs_experiments_as_a_sortable_table_with_parallel_coordinates_and_overlaid_curves(bench, as_role):
    client = as_role("viewer")
    url = reverse("dashboard:run-experiments", args=[bench.low.uuid])
    page = client.get(url, {"sort": "-feedback"})
    body = page.content.decode()
    assert page.status_code == 200
    assert body.index('data-experiment="exp_0001"') < body.index('data-experiment="exp_0002"')
    ascending = client.get(url, {"sort": "hp.max_steps"}).content.decode()
    assert ascending.index('data-experiment="exp_0001"') < ascending.index('data-experiment="exp_0002"')
    descending = client.get(url, {"sort": "-hp.learning_rate"}).content.decode()
    assert descending.index('data-experiment="exp_0002"') < descending.index('data-experiment="exp_0001"')
    assert 'data-col="integrity"><span class="badge integrity-accepted">accepted' in body
    figure = json.loads(body.split('<script id="parcoords-figure" type="application/json">')[1].split("</script>")[0])
    labels = [d["label"] for d in figure["data"][0]["dimensions"]]
    assert labels == ["learning_rate", "max_steps", "feedback score"]
    assert figure["data"][0]["dimensions"][2]["values"] == [0.6, 0.5]
    refused = client.get(url, {"sort": "weights"})
    assert refused.status_code == 400
    assert "sort: no column &#x27;weights&#x27;" in refused.content.decode()

    curves = client.get(reverse("dashboard:curves"), {"runs": [str(bench.low.uuid), str(bench.high.uuid)]})
    series = json.loads(curves.content.decode().split('<script id="curve-data" type="application/json">')[1]
                        .split("</script>")[0])  # fmt: skip
    assert [s["label"] for s in series] == ["sweep low lr · exp_0001", "sweep low lr · exp_0002",
                                            "sweep high lr · exp_0001"]  # fmt: skip
    assert [p["step"] for p in series[1]["points"]] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert all("loss" in p and "elapsed_s" in p for s in series for p in s["points"])
    chosen = client.get(reverse("dashboard:curves"), {"exp": [str(bench.experiments["high/exp_0001"].uuid)]})
    assert "sweep high lr · exp_0001" in chosen.content.decode()
    assert "sweep low lr" not in chosen.content.decode()
    bad = client.get(reverse("dashboard:curves"), {"exp": "../etc"})
    assert bad.status_code == 302


def test_artifact_pages_list_and_serve_checkpoints_and_data_but_never_sealed_data(bench, as_role, settings, tmp_path):
    client = as_role("viewer")
    page = client.get(reverse("dashboard:run-artifacts", args=[bench.low.uuid]))
    body = page.content.decode()
    trained = bench.experiments["low/exp_0001"].output_checkpoint
    reference = bench.low.benchmark.reference_checkpoint
    assert f'data-checkpoint="{trained.handle}"' in body
    assert f'data-entry="{bench.entry.handle}"' in body
    assert reference.handle not in body

    weights = client.get(reverse("dashboard:checkpoint-file", args=[trained.uuid, "model.safetensors"]))
    assert weights.status_code == 200
    assert b"".join(weights.streaming_content) == b"weights of sweep low lr exp_0001"
    data = client.get(reverse("dashboard:data-entry-download", args=[bench.entry.handle]))
    assert b"".join(data.streaming_content).count(b"\n") == 6
    assert client.get(reverse("dashboard:checkpoint-file", args=[trained.uuid, "../config.json"])).status_code == 404
    assert (
        as_role("nobody").get(reverse("dashboard:checkpoint-file", args=[trained.uuid, "config.json"])).status_code
        == 403
    )

    # The sealed reference, even stored in the artifact store, is neither listed nor served.
    folder = tmp_path / "reference"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"sealed reference weights")
    store = artifact_store()
    sealed_ref = checkpoint_register(uri=store.put_dir(folder, key="checkpoints/ref"), directory=folder,
                                     is_reference=True, run=bench.low)  # fmt: skip
    assert (
        sealed_ref.handle not in client.get(reverse("dashboard:run-artifacts", args=[bench.low.uuid])).content.decode()
    )
    assert (
        client.get(reverse("dashboard:checkpoint-file", args=[sealed_ref.uuid, "model.safetensors"])).status_code == 404
    )
    # Sealed benchmark data under a misconfigured store (the sealed root inside it) is never served.
    settings.SEALED_ROOT = str(tmp_path / "store" / "sealed")
    split = tmp_path / "split"
    split.mkdir()
    (split / "final.jsonl").write_text('{"prompt": "sealed question", "answer": "sealed answer"}\n')
    leaked = checkpoint_register(uri=store.put_dir(split, key="sealed/bench"), directory=split, run=bench.low)
    listing = client.get(reverse("dashboard:run-artifacts", args=[bench.low.uuid])).content.decode()
    assert f'href="/checkpoints/{leaked.uuid}/' not in listing
    answer = client.get(reverse("dashboard:checkpoint-file", args=[leaked.uuid, "final.jsonl"]))
    assert answer.status_code == 404
    assert b"sealed answer" not in answer.content


def test_the_bundle_carries_training_metrics_job_logs_and_each_evaluations_hyperparameters(bench, as_role):
    answer = as_role("operator").get(reverse("dashboard:run-export", args=[bench.low.uuid]))
    archive = zipfile.ZipFile(io.BytesIO(answer.content))
    names = archive.namelist()
    training = list(csv.DictReader(io.StringIO(archive.read("training_metrics.csv").decode())))
    losses = [r for r in training if r["experiment"] == "exp_0002" and r["key"] == "loss"]
    assert [int(r["step"]) for r in losses] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert all(float(r["elapsed_s"]) > 0 for r in losses)
    logs = [n for n in names if n.startswith("logs/train-exp_0001-")]
    assert len(logs) == 1
    assert "step 10: loss=" in archive.read(logs[0]).decode()
    scores = list(csv.DictReader(io.StringIO(archive.read("scores.csv").decode())))
    feedback = {r["experiment"]: r for r in scores if r["split"] == "feedback"}
    assert float(feedback["exp_0002"]["hp.learning_rate"]) == pytest.approx(3e-4)
    assert feedback["exp_0002"]["hp.max_steps"] == "80"
    assert feedback["exp_0001"]["recipe"] == "sft"
