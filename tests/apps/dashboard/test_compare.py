"""The runs list's search, filters and labels, the comparison and ablation pages, through the views."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from apps.experiments.models import Event
from apps.flows.compare import best_so_far, config_diff, run_final_score, runs_paired
from apps.research.services import run_label
from tests.apps.dashboard.compare_world import DIFFERENCE, SHARED, build_pair
from tests.factories import make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def pair(people):
    return build_pair()


def _names(response) -> list[str]:
    return re.findall(r'<a href="/runs/[0-9a-f-]+/">([^<]+)</a>', response.content.decode())


def test_final_scores_and_the_paired_bootstrap_use_the_shared_sample_ids(pair):
    a, b = run_final_score(pair.a), run_final_score(pair.b)
    assert (a.score, a.n, b.score, b.n) == (0.5, 40, 0.75, 40)
    assert a.ci_low < 0.5 < a.ci_high
    paired = runs_paired(pair.a, pair.b)
    assert paired["n_common"] == SHARED
    assert (paired["only_a"], paired["only_b"]) == (4, 4)
    assert paired["difference"] == pytest.approx(DIFFERENCE)
    assert paired["mean_a"] == pytest.approx(16 / 36)
    assert paired["ci_low"] < DIFFERENCE < paired["ci_high"]
    assert paired["ci_low"] > 0  # 14 more right of 36 and none fewer: B is better
    assert paired["p_value"] < 0.01


def test_best_so_far_keeps_only_improvements_of_accepted_experiments(pair):
    points = best_so_far(pair.a)
    assert [(round(p["seconds"] / 60), p["best"]) for p in points] == [(5, 0.30), (12, 0.45)]


def test_config_diff_lists_what_differs(pair):
    rows = {row["key"]: row for row in config_diff([pair.a, pair.b])}
    differing = {key for key, row in rows.items() if row["differs"]}
    assert differing == {"ablation", "max_parallel_workers", "policy.reviewers", "policy.seed"}
    assert rows["ablation"]["values"] == ["full", "no-reviewer"]
    assert not rows["benchmark"]["differs"]


def test_comparison_page_shows_differences_curves_and_the_paired_numbers(pair, as_role):
    client = as_role("viewer")
    url = f"{reverse('dashboard:run-compare')}?runs={pair.a.uuid}&runs={pair.b.uuid}"
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<tr data-key="') == 4  # only the differences by default
    assert 'data-key="policy.reviewers"' in html
    assert 'data-key="benchmark"' not in html
    assert [">0.500<" in html, ">0.750<" in html] == [True, True]
    assert [f">{SHARED}<" in html, f">{DIFFERENCE:.3f}<" in html] == [True, True]
    figure = page.context["curves"]
    assert [trace["y"] for trace in figure["data"]] == [[0.30, 0.45, 0.45], [0.50, 0.50]]

    everything = client.get(url + "&config=all").content.decode()
    assert 'data-key="benchmark"' in everything
    assert everything.count('<tr data-key="') > 4


def test_comparison_needs_two_runs(pair, as_role):
    response = as_role("viewer").get(f"{reverse('dashboard:run-compare')}?runs={pair.a.uuid}")
    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard:run-list")


def test_runs_list_searches_and_filters(pair, as_role):
    other = make_run(name="llm sprint", agent_mode="llm", policy={"serial_workers": True})
    run_label(run=other, actor="test", tags=["Paper", "ablation"], starred=True)
    client = as_role("viewer")
    runs = reverse("dashboard:run-list")
    assert sorted(_names(client.get(runs))) == ["full, seed 0", "llm sprint", "no reviewer, seed 1"]
    assert _names(client.get(runs, {"q": "sprint"})) == ["llm sprint"]
    assert _names(client.get(runs, {"q": "paper"})) == ["llm sprint"]  # a tag matches the search
    assert _names(client.get(runs, {"tag": "paper"})) == ["llm sprint"]
    assert _names(client.get(runs, {"policy": "llm"})) == ["llm sprint"]
    assert sorted(_names(client.get(runs, {"status": "finished"}))) == ["full, seed 0", "no reviewer, seed 1"]
    assert _names(client.get(runs, {"ablation": "no-reviewer"})) == ["no reviewer, seed 1"]
    assert _names(client.get(runs, {"ablation": "serial-workers"})) == ["llm sprint"]
    assert _names(client.get(runs, {"ablation": "full"})) == ["full, seed 0"]
    assert _names(client.get(runs, {"starred": "true"})) == ["llm sprint"]
    assert _names(client.get(runs, {"benchmark": pair.a.benchmark.pk})) == ["no reviewer, seed 1", "full, seed 0"]
    assert _names(client.get(runs, {"created_after": "2000-01-01", "created_before": "2000-01-02"})) == []
    assert "No run matches these filters." in client.get(runs, {"q": "nothing like it"}).content.decode()


def test_operators_rename_tag_and_star_and_viewers_may_not(pair, as_role):
    url = reverse("dashboard:run-label", args=[pair.a.uuid])
    assert as_role("viewer").post(url, {"name": "x"}).status_code == 403
    client = as_role("operator")
    response = client.post(
        url, {"name": " baseline ", "tags": "paper, Seeds,paper", "starred": "1"}, HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 200
    assert response.json() == {"name": "baseline", "tags": ["paper", "seeds"], "starred": True}
    pair.a.refresh_from_db()
    assert (pair.a.name, pair.a.tags, pair.a.starred) == ("baseline", ["paper", "seeds"], True)
    assert Event.objects.filter(run=pair.a, type="run.labelled", actor="user:operator-person").exists()

    client.post(url, {"starred": "0"})  # only the star changes
    pair.a.refresh_from_db()
    assert (pair.a.name, pair.a.tags, pair.a.starred) == ("baseline", ["paper", "seeds"], False)
    refused = client.post(url, {"name": "  "}, HTTP_ACCEPT="application/json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_name"


def test_ablation_page_groups_runs_by_arm_at_equal_budget(pair, as_role):
    make_run(name="other budget", benchmark=pair.a.benchmark, budget_wall_seconds=60)
    page = as_role("viewer").get(reverse("dashboard:run-ablation"))
    groups = page.context["groups"]
    assert len(groups) == 2  # the 60 s run is not compared with the 3600 s ones
    equal = next(g for g in groups if g["budget"]["wall_seconds"] == 3600)
    arms = {arm["name"]: arm for arm in equal["arms"]}
    assert list(arms) == ["full", "no-reviewer"]
    assert (arms["full"]["mean"], arms["no-reviewer"]["mean"]) == (0.5, 0.75)
    assert [m["seed"] for m in arms["no-reviewer"]["runs"]] == [1]
    assert 'data-arm="no-reviewer"' in page.content.decode()


def test_comparison_numbers_runs_oldest_first_and_ignores_bad_ids(pair, as_role):
    url = f"{reverse('dashboard:run-compare')}?runs={pair.b.uuid}&runs=not-a-uuid&runs={pair.a.uuid}"
    page = as_role("viewer").get(url)
    assert [column["run"] for column in page.context["columns"]] == [pair.a, pair.b]
