"""hf_* tools on the local catalog provider (the minibench layout), fully offline."""

from __future__ import annotations

import json

import pytest

from apps.expos.connectors import TOOL_NAMES, ConnectorConfig, build_connectors
from tests.apps.expos.connectors import call, error_of

CATALOG = {
    "arith-clean": {
        "meta": {
            "name": "arith-clean",
            "task": "arithmetic",
            "description": "Clean arithmetic word problems",
            "quality": "useful",
            "rows": 3,
            "format": "qa",
            "files": ["data.jsonl"],
            "license": "cc-by-4.0",
            "tags": ["math", "synthetic"],
        },
        "readme": (
            "---\nlicense: cc-by-4.0\ntask_categories:\n- question-answering\n---\n# Arithmetic\nClean problems.\n"
        ),
        "data": "".join(json.dumps({"question": f"{i} + {i} = ?", "answer": str(2 * i)}) + "\n" for i in range(3)),
    },
    "arith-broken": {
        "meta": {
            "name": "arith-broken",
            "task": "arithmetic",
            "description": "Arithmetic problems, scraped",
            "quality": "wrong_format",
            "rows": 2,
            "format": "qa",
            "files": ["data.jsonl"],
            "license": "mit",
            "tags": ["math"],
        },
        "readme": "---\nlicense: mit\n---\n# Scraped arithmetic\n",
        "data": '{"question": "1 + 1 = ?", "answer": "2"}\nquestion=2+2 answer=4\n',
    },
    "recipes": {
        "meta": {
            "name": "recipes",
            "task": "cooking",
            "description": "Cooking recipes",
            "quality": "honeypot",
            "rows": 1,
            "format": "qa",
            "files": ["data.jsonl", "../../outside.txt"],
            "license": "mit",
            "tags": [],
        },
        "readme": "# Recipes\n",
        "data": json.dumps({"question": "How long to boil an egg?", "answer": "7 minutes"}) + "\n",
    },
}
HIDDEN_LABELS = ("useful", "wrong_format", "honeypot")


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    root = tmp_path_factory.mktemp("catalog")
    for name, entry in CATALOG.items():
        folder = root / name
        folder.mkdir()
        (folder / "meta.json").write_text(json.dumps(entry["meta"]))
        (folder / "README.md").write_text(entry["readme"])
        (folder / "data.jsonl").write_text(entry["data"])
    (root / "not-a-dataset").mkdir()  # no meta.json: ignored
    (root.parent / "outside.txt").write_text("must never be copied")
    return root


@pytest.fixture
def config(catalog):
    return ConnectorConfig(hf_provider="local", local_catalog_dir=str(catalog))


def test_search_matches_name_description_and_tags(config):
    math = call(config, "hf_search_datasets", {"query": "arithmetic"})
    everything = call(config, "hf_search_datasets", {"query": "", "limit": 10})
    by_tag = call(config, "hf_search_datasets", {"query": "synthetic"})

    assert math["provider"] == "local"
    assert [d["id"] for d in math["datasets"]] == ["arith-broken", "arith-clean"]
    assert [d["id"] for d in everything["datasets"]] == ["arith-broken", "arith-clean", "recipes"]
    assert [d["id"] for d in by_tag["datasets"]] == ["arith-clean"]
    assert "task:arithmetic" in math["datasets"][0]["tags"]


def test_inspect_returns_card_license_and_files(config):
    result = call(config, "hf_inspect_dataset", {"dataset": "arith-clean"})

    assert result["license"] == "cc-by-4.0"
    assert result["card_data"]["task_categories"] == ["question-answering"]
    assert {f["path"] for f in result["files"]} == {"README.md", "data.jsonl"}
    assert len(result["sha"]) == 64


def test_configs_and_splits_are_default_train_with_row_count(config):
    configs = call(config, "hf_dataset_configs", {"dataset": "arith-clean"})
    splits = call(config, "hf_dataset_splits", {"dataset": "arith-clean"})

    assert configs["configs"] == ["default"]
    assert splits["splits"] == [{"config": "default", "split": "train", "num_rows": 3}]


def test_readme_returns_card_and_front_matter(config):
    result = call(config, "hf_dataset_readme", {"dataset": "arith-clean"})

    assert "Clean problems." in result["readme"]
    assert result["card_data"]["license"] == "cc-by-4.0"


def test_sample_shows_rows_and_keeps_malformed_lines_visible(config):
    clean = call(config, "hf_dataset_sample", {"dataset": "arith-clean", "n": 2})
    broken = call(config, "hf_dataset_sample", {"dataset": "arith-broken", "n": 5})

    assert clean["rows"] == [{"question": "0 + 0 = ?", "answer": "0"}, {"question": "1 + 1 = ?", "answer": "2"}]
    assert clean["features"] == [{"name": "question", "dtype": "string"}, {"name": "answer", "dtype": "string"}]
    assert clean["truncated"] is True
    assert broken["rows"][1] == {"_raw": "question=2+2 answer=4"}


def test_download_copies_card_and_data_but_never_meta_or_outside_files(config, tmp_path):
    result = call(config, "hf_download_dataset", {"dataset": "recipes", "workspace": str(tmp_path)})

    assert result["path"] == "downloads/recipes"
    assert sorted(f["path"] for f in result["files"]) == ["downloads/recipes/README.md", "downloads/recipes/data.jsonl"]
    assert not (tmp_path / "downloads/recipes/meta.json").exists()
    assert not list(tmp_path.rglob("outside.txt"))


def test_materialize_downloaded_dataset(config, tmp_path):
    call(config, "hf_download_dataset", {"dataset": "arith-clean", "workspace": str(tmp_path)})

    result = call(
        config,
        "hf_materialize_dataset",
        {"dataset": "arith-clean", "workspace": str(tmp_path), "prompt": "question", "completion": "answer"},
    )

    lines = (tmp_path / result["path"]).read_text().splitlines()
    assert result["rows"] == 3
    assert json.loads(lines[2]) == {"prompt": "2 + 2 = ?", "completion": "4"}


def test_materialize_malformed_data_is_bad_request_and_writes_nothing(config, tmp_path):
    call(config, "hf_download_dataset", {"dataset": "arith-broken", "workspace": str(tmp_path)})

    error = error_of(
        config,
        "hf_materialize_dataset",
        {"dataset": "arith-broken", "workspace": str(tmp_path), "prompt": "question", "completion": "answer"},
    )

    assert error.code == "bad_request"
    assert list(tmp_path.glob("materialized/*")) == []


def test_hidden_quality_labels_never_leave_the_catalog(config, tmp_path):
    answers = [
        call(config, "hf_search_datasets", {"query": ""}),
        *(
            call(config, tool, {"dataset": name})
            for name in CATALOG
            for tool in ("hf_inspect_dataset", "hf_dataset_splits", "hf_dataset_readme", "hf_dataset_sample")
        ),
        *(call(config, "hf_download_dataset", {"dataset": name, "workspace": str(tmp_path)}) for name in CATALOG),
    ]

    text = json.dumps(answers) + "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert not any(label in text for label in HIDDEN_LABELS)
    assert '"quality"' not in text


def test_unknown_or_escaping_dataset_names_are_refused(config):
    unknown = error_of(config, "hf_inspect_dataset", {"dataset": "nope"})
    owner_style = error_of(config, "hf_inspect_dataset", {"dataset": "acme/arith-clean"})
    traversal = error_of(config, "hf_inspect_dataset", {"dataset": "../catalog"})

    assert unknown.code == owner_style.code == "not_found"  # 404 at the API: well-formed, names nothing
    assert traversal.code == "bad_request"


def test_missing_catalog_folder_is_not_configured(tmp_path):
    unset = ConnectorConfig(hf_provider="local")
    missing = ConnectorConfig(hf_provider="local", local_catalog_dir=str(tmp_path / "absent"))

    assert error_of(unset, "hf_search_datasets", {"query": "x"}).code == "not_configured"
    assert error_of(missing, "hf_search_datasets", {"query": "x"}).code == "not_configured"


def test_local_provider_serves_all_eight_hf_tools(config):
    tools = build_connectors(config)
    hf_tools = [name for name in TOOL_NAMES if name.startswith("hf_")]

    assert len(hf_tools) == 8
    assert all(tools[name].configured and tools[name].connector == "hf_local_catalog" for name in hf_tools)
