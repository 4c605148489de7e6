"""hf_* tools on the Hub provider: huggingface_hub + the dataset viewer against loopback fakes."""

from __future__ import annotations

import json

import pytest

from apps.expos.connectors import ConnectorConfig
from tests.apps.expos.connectors import call, error_of
from tests.fakes.hf_hub import FakeDataset, FakeDatasetsServer, FakeHub

MATH = FakeDataset(
    id="acme/math-qa",
    description="Arithmetic word problems with answers",
    tags=["task_categories:question-answering", "language:en", "license:mit"],
    card_yaml="license: mit\npretty_name: Math QA\nlanguage:\n- en\n",
    card_body="# Math QA\n\nTwo-step arithmetic word problems.\n",
    rows={
        "default": {
            "train": [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)]
            + [{"question": "Unanswered?", "answer": None}],
            "test": [{"question": "What is 2 + 2?", "answer": "4"}],
        }
    },
    downloads=1234,
    likes=5,
)
CHAT = FakeDataset(
    id="other/chat-logs",
    description="Chat transcripts",
    tags=["task_categories:text-generation"],
    card_yaml="license: cc-by-4.0\n",
    card_body="# Chat logs\n",
    rows={"en": {"train": [{"text": "hi"}]}, "fr": {"train": [{"text": "salut"}]}},
)


@pytest.fixture(scope="module")
def hub():
    with FakeHub([MATH, CHAT]) as fake:
        yield fake


@pytest.fixture(scope="module")
def viewer():
    with FakeDatasetsServer([MATH, CHAT]) as fake:
        yield fake


@pytest.fixture
def config(hub, viewer):
    return ConnectorConfig(hf_provider="hub", hf_endpoint=hub.url, hf_datasets_server_url=viewer.url)


def test_search_datasets_returns_hub_listing(config):
    result = call(config, "hf_search_datasets", {"query": "math", "limit": 5})

    assert result["provider"] == "hub"
    assert [d["id"] for d in result["datasets"]] == ["acme/math-qa"]
    found = result["datasets"][0]
    assert found["author"] == "acme"
    assert found["downloads"] == 1234
    assert "license:mit" in found["tags"]
    assert found["last_modified"].startswith("2024-05-01")


def test_search_datasets_sends_search_and_limit(config, hub):
    call(config, "hf_search_datasets", {"query": "chat", "limit": 3})

    sent = hub.requests[-1]
    assert sent.path == "/api/datasets"
    assert sent.query["search"] == ["chat"]
    assert sent.query["limit"] == ["3"]


def test_inspect_dataset_returns_card_data_and_files(config):
    result = call(config, "hf_inspect_dataset", {"dataset": "acme/math-qa"})

    assert result["sha"] == MATH.sha
    assert result["license"] == "mit"
    assert result["card_data"]["pretty_name"] == "Math QA"
    files = {f["path"]: f["size"] for f in result["files"]}
    assert files["data/train.jsonl"] == len(MATH.files["data/train.jsonl"])
    assert "README.md" in files


def test_inspect_unknown_dataset_is_bad_request(config):
    error = error_of(config, "hf_inspect_dataset", {"dataset": "acme/nope"})

    assert error.code == "bad_request"
    assert "not found" in error.message


def test_configs_and_splits_come_from_the_viewer(config):
    configs = call(config, "hf_dataset_configs", {"dataset": "other/chat-logs"})
    splits = call(config, "hf_dataset_splits", {"dataset": "acme/math-qa"})
    fr_only = call(config, "hf_dataset_splits", {"dataset": "other/chat-logs", "config": "fr"})

    assert configs["configs"] == ["en", "fr"]
    assert [(s["config"], s["split"]) for s in splits["splits"]] == [("default", "train"), ("default", "test")]
    assert fr_only["splits"] == [{"config": "fr", "split": "train", "num_rows": None}]


def test_readme_is_downloaded_and_front_matter_parsed(config):
    result = call(config, "hf_dataset_readme", {"dataset": "acme/math-qa"})

    assert result["readme"].startswith("---\nlicense: mit")
    assert "Two-step arithmetic" in result["readme"]
    assert result["card_data"] == {"license": "mit", "pretty_name": "Math QA", "language": ["en"]}
    assert result["truncated"] is False


def test_readme_is_cut_at_max_chars(config):
    result = call(config, "hf_dataset_readme", {"dataset": "acme/math-qa", "max_chars": 100})

    assert len(result["readme"]) <= 100 or result["truncated"] is False


def test_sample_uses_first_rows_and_picks_the_config(config, viewer):
    result = call(config, "hf_dataset_sample", {"dataset": "acme/math-qa", "split": "train", "n": 2})

    assert result["config"] == "default"
    assert result["rows"] == [
        {"question": "What is 0 + 1?", "answer": "1"},
        {"question": "What is 1 + 1?", "answer": "2"},
    ]
    assert result["features"] == [{"name": "question", "dtype": "string"}, {"name": "answer", "dtype": "string"}]
    assert result["truncated"] is True
    assert viewer.requests[-1].path == "/first-rows"


def test_sample_of_missing_split_is_bad_request(config):
    error = error_of(config, "hf_dataset_sample", {"dataset": "acme/math-qa", "split": "validation"})

    assert error.code == "bad_request"


def test_download_writes_into_the_workspace_pinned_to_one_revision(config, hub, tmp_path):
    result = call(config, "hf_download_dataset", {"dataset": "acme/math-qa", "workspace": str(tmp_path)})

    assert result["path"] == "downloads/acme__math-qa"
    assert result["revision"] == MATH.sha
    paths = {f["path"] for f in result["files"]}
    assert paths == {
        "downloads/acme__math-qa/README.md",
        "downloads/acme__math-qa/data/train.jsonl",
        "downloads/acme__math-qa/data/test.jsonl",
    }
    assert (tmp_path / "downloads/acme__math-qa/data/train.jsonl").read_bytes() == MATH.files["data/train.jsonl"]
    assert not (tmp_path / "downloads/acme__math-qa/.cache").exists()
    assert result["total_bytes"] == sum(f["size"] for f in result["files"])
    file_requests = [r for r in hub.requests if "/resolve/" in r.path]
    assert all(f"/resolve/{MATH.sha}/" in r.path for r in file_requests[-6:])


def test_download_honours_allow_patterns_and_the_size_limit(hub, viewer, tmp_path):
    config = ConnectorConfig(hf_provider="hub", hf_endpoint=hub.url, max_download_bytes=100)

    narrowed = call(
        config,
        "hf_download_dataset",
        {"dataset": "acme/math-qa", "workspace": str(tmp_path), "allow_patterns": ["*/test.jsonl"]},
    )
    too_big = error_of(config, "hf_download_dataset", {"dataset": "acme/math-qa", "workspace": str(tmp_path)})

    assert [f["path"] for f in narrowed["files"]] == ["downloads/acme__math-qa/data/test.jsonl"]
    assert too_big.code == "bad_request"
    assert "allow_patterns" in too_big.message


def test_download_never_goes_into_the_datapool_or_outside_the_root(hub, tmp_path):
    pool = tmp_path / "datapool"
    (pool / "w1").mkdir(parents=True)
    config = ConnectorConfig(
        hf_provider="hub", hf_endpoint=hub.url, datapool_root=str(pool), workspace_root=str(tmp_path / "workspaces")
    )

    into_pool = error_of(config, "hf_download_dataset", {"dataset": "acme/math-qa", "workspace": str(pool / "w1")})
    relative = error_of(config, "hf_download_dataset", {"dataset": "acme/math-qa", "workspace": "ws"})

    assert into_pool.code == relative.code == "bad_request"
    assert "datapool" in into_pool.message or "outside" in into_pool.message
    assert not any(pool.rglob("*.jsonl"))


def test_materialize_maps_columns_into_prompt_completion_jsonl(config, tmp_path):
    call(config, "hf_download_dataset", {"dataset": "acme/math-qa", "workspace": str(tmp_path)})

    result = call(
        config,
        "hf_materialize_dataset",
        {"dataset": "acme/math-qa", "workspace": str(tmp_path), "prompt": "Q: {question}\nA:", "completion": "answer"},
    )

    assert result["path"] == "materialized/acme__math-qa-train.jsonl"
    assert result["rows"] == 12
    assert result["skipped"] == 1  # the row without an answer
    lines = [json.loads(line) for line in (tmp_path / result["path"]).read_text().splitlines()]
    assert lines[0] == {"prompt": "Q: What is 0 + 1?\nA:", "completion": "1"}
    assert not list((tmp_path / "materialized").glob("*.partial"))


def test_materialize_test_split_and_named_output(config, tmp_path):
    call(config, "hf_download_dataset", {"dataset": "acme/math-qa", "workspace": str(tmp_path)})

    result = call(
        config,
        "hf_materialize_dataset",
        {
            "dataset": "acme/math-qa",
            "workspace": str(tmp_path),
            "split": "test",
            "prompt": "question",
            "completion": "answer",
            "output": "math-test",
        },
    )

    assert result["path"] == "materialized/math-test.jsonl"
    assert result["rows"] == 1


def test_materialize_unknown_column_is_bad_request_and_missing_download_not_found(config, tmp_path):
    missing = error_of(
        config,
        "hf_materialize_dataset",
        {"dataset": "acme/math-qa", "workspace": str(tmp_path), "prompt": "question", "completion": "answer"},
    )
    call(config, "hf_download_dataset", {"dataset": "acme/math-qa", "workspace": str(tmp_path)})
    unknown = error_of(
        config,
        "hf_materialize_dataset",
        {"dataset": "acme/math-qa", "workspace": str(tmp_path), "prompt": "{problem}", "completion": "answer"},
    )
    escape = error_of(
        config,
        "hf_materialize_dataset",
        {
            "dataset": "acme/math-qa",
            "workspace": str(tmp_path),
            "source": "../../etc",
            "prompt": "question",
            "completion": "answer",
        },
    )

    assert unknown.code == escape.code == "bad_request"
    assert missing.code == "not_found"  # the workspace's state, not the request: 404 at the API
    assert "hf_download_dataset" in missing.message
    assert "problem" in unknown.message
    assert "question" in unknown.message
    assert not (tmp_path / "materialized" / "acme__math-qa-train.jsonl").exists()


def test_token_is_sent_only_when_configured(hub, viewer):
    without = ConnectorConfig(hf_provider="hub", hf_endpoint=hub.url, hf_datasets_server_url=viewer.url)
    with_token = ConnectorConfig(
        hf_provider="hub", hf_endpoint=hub.url, hf_datasets_server_url=viewer.url, hf_token="hf_test"
    )

    call(without, "hf_inspect_dataset", {"dataset": "acme/math-qa"})
    anonymous = hub.requests[-1].headers
    call(with_token, "hf_inspect_dataset", {"dataset": "acme/math-qa"})
    authorised = hub.requests[-1].headers
    call(with_token, "hf_dataset_configs", {"dataset": "acme/math-qa"})

    assert "authorization" not in anonymous
    assert authorised["authorization"] == "Bearer hf_test"
    assert viewer.requests[-1].headers["authorization"] == "Bearer hf_test"


def test_viewer_tools_need_a_viewer_url_for_a_mirror_endpoint(hub):
    config = ConnectorConfig(hf_provider="hub", hf_endpoint=hub.url)

    error = error_of(config, "hf_dataset_configs", {"dataset": "acme/math-qa"})
    still_works = call(config, "hf_search_datasets", {"query": "math"})

    assert error.code == "not_configured"
    assert "RSI_HF_DATASETS_SERVER_URL" in error.message
    assert still_works["datasets"]


def test_no_provider_is_not_configured():
    error = error_of(ConnectorConfig(hf_endpoint="http://127.0.0.1:9"), "hf_search_datasets", {"query": "x"})

    assert error.code == "not_configured"
    assert "RSI_HF_PROVIDER" in error.message


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("hf_search_datasets", {"query": "math"}),
        ("hf_inspect_dataset", {"dataset": "acme/math-qa"}),
        ("hf_dataset_readme", {"dataset": "acme/math-qa"}),
    ],
)
def test_closed_hub_endpoint_is_unreachable(closed_url, tool, args):
    config = ConnectorConfig(hf_provider="hub", hf_endpoint=closed_url, timeout_s=2)

    error = error_of(config, tool, args)

    assert error.code == "unreachable"
    assert closed_url in error.message


def test_closed_viewer_is_unreachable(hub, closed_url):
    config = ConnectorConfig(hf_provider="hub", hf_endpoint=hub.url, hf_datasets_server_url=closed_url, timeout_s=2)

    error = error_of(config, "hf_dataset_splits", {"dataset": "acme/math-qa"})

    assert error.code == "unreachable"
    assert closed_url in error.message


@pytest.mark.parametrize("template", ["{question:>999999999}", "{question.__class__}", "{question!r}", "{0}", "{}"])
def test_materialize_templates_take_plain_placeholders_only(config, tmp_path, template):
    call(config, "hf_download_dataset", {"dataset": "acme/math-qa", "workspace": str(tmp_path)})

    error = error_of(
        config,
        "hf_materialize_dataset",
        {"dataset": "acme/math-qa", "workspace": str(tmp_path), "prompt": template, "completion": "answer"},
    )

    assert error.code == "bad_request"


def test_materialize_source_over_name_max_is_a_missing_download_not_a_crash(config, tmp_path):
    # No file system holds such a name, so the download it names does not exist: 404, as for any.
    error = error_of(
        config,
        "hf_materialize_dataset",
        {"dataset": "acme/math-qa", "workspace": str(tmp_path), "source": "0" * 300, "prompt": "q", "completion": "a"},
    )
    assert error.code == "not_found"
    assert "255" in error.message
