"""search_github_* tools against a loopback GitHub REST v3."""

from __future__ import annotations

import pytest

from apps.expos.connectors import ConnectorConfig
from tests.apps.expos.connectors import call, error_of
from tests.fakes.github import FakeGitHub


@pytest.fixture(scope="module")
def github():
    with FakeGitHub() as fake:
        yield fake


@pytest.fixture
def config(github):
    return ConnectorConfig(github_api_url=github.url)


def test_search_repositories_parses_items_and_sends_github_headers(config, github):
    result = call(config, "search_github_search_repositories", {"query": "lora language:python", "sort": "stars"})

    assert result["total_count"] == 2
    assert [r["full_name"] for r in result["items"]] == ["huggingface/peft", "microsoft/LoRA"]
    peft = result["items"][0]
    assert peft["stars"] == 15000
    assert peft["license"] == "Apache-2.0"
    assert peft["topics"] == ["lora", "fine-tuning"]
    sent = github.requests[-1]
    assert sent.query["q"] == ["lora language:python"]
    assert sent.query["sort"] == ["stars"]
    assert sent.headers["accept"] == "application/vnd.github+json"
    assert sent.headers["x-github-api-version"] == "2022-11-28"
    assert "authorization" not in sent.headers


def test_search_code_needs_a_token_on_github(config, github):
    anonymous = error_of(config, "search_github_search_code", {"query": "lora"})
    with_token = ConnectorConfig(github_api_url=github.url, github_token="ghp_test")

    result = call(with_token, "search_github_search_code", {"query": "lora"})

    assert anonymous.code == "upstream_error"
    assert "Requires authentication" in anonymous.message
    assert github.requests[-1].headers["authorization"] == "Bearer ghp_test"
    assert result["items"] == [
        {
            "repository": "huggingface/peft",
            "path": "src/peft/tuners/lora.py",
            "name": "lora.py",
            "sha": "d3adb33fd3adb33fd3adb33fd3adb33fd3adb33f",
            "html_url": "https://github.com/huggingface/peft/blob/abc/src/peft/tuners/lora.py",
        }
    ]


def test_issues_and_pull_requests_are_kept_apart(config, github):
    issues = call(config, "search_github_search_issues", {"query": "lora"})
    issue_query = github.requests[-1].query["q"]
    pulls = call(config, "search_github_search_pull_requests", {"query": "dora"})
    pull_query = github.requests[-1].query["q"]

    assert issue_query == ["lora is:issue"]
    assert pull_query == ["dora is:pr"]
    assert [(i["repository"], i["number"], i["state"]) for i in issues["items"]] == [("huggingface/peft", 101, "open")]
    assert issues["items"][0]["labels"] == ["bug"]
    assert issues["items"][0]["user"] == "octocat"
    assert [(p["number"], p["title"]) for p in pulls["items"]] == [(102, "Add DoRA support")]


def test_search_users(config):
    result = call(config, "search_github_search_users", {"query": "octo"})

    assert result["items"] == [{"login": "octocat", "html_url": "https://github.com/octocat", "type": "User"}]


def test_get_repository_readme_decodes_base64(config):
    result = call(config, "search_github_get_repository_readme", {"owner": "huggingface", "repo": "peft"})

    assert result["content"] == "# PEFT\n\nParameter-Efficient Fine-Tuning methods.\n"
    assert result["repository"] == "huggingface/peft"
    assert result["html_url"] == "https://github.com/huggingface/peft/blob/main/README.md"


def test_missing_readme_is_bad_request(config):
    error = error_of(config, "search_github_get_repository_readme", {"owner": "nobody", "repo": "nothing"})

    assert error.code == "bad_request"
    assert "404" in error.message


def test_not_configured_without_api_url():
    error = error_of(ConnectorConfig(github_token="ghp_x"), "search_github_search_users", {"query": "x"})

    assert error.code == "not_configured"
    assert "RSI_GITHUB_API_URL" in error.message


def test_closed_port_is_unreachable(closed_url):
    error = error_of(ConnectorConfig(github_api_url=closed_url), "search_github_search_repositories", {"query": "x"})

    assert error.code == "unreachable"
    assert closed_url in error.message
