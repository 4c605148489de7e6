"""build_connectors: the paper's 22 names, well-formed specs, off unless configured, env parsing."""

from __future__ import annotations

import jsonschema
import pytest

from apps.expos.connectors import TOOL_NAMES, ConnectorConfig, ConnectorError, build_connectors
from tests.apps.expos.connectors import error_of

# The smallest valid arguments for each tool, to reach the not_configured check.
MINIMAL_ARGS = {
    "hf_search_datasets": {"query": "math"},
    "hf_inspect_dataset": {"dataset": "acme/math"},
    "hf_dataset_configs": {"dataset": "acme/math"},
    "hf_dataset_splits": {"dataset": "acme/math"},
    "hf_dataset_readme": {"dataset": "acme/math"},
    "hf_dataset_sample": {"dataset": "acme/math"},
    "hf_download_dataset": {"dataset": "acme/math", "workspace": "/tmp"},
    "hf_materialize_dataset": {"dataset": "acme/math", "workspace": "/tmp", "prompt": "q", "completion": "a"},
    "search_web_google_search": {"query": "lora"},
    "search_web_web_parse": {"url": "https://example.com/"},
    "search_github_search_repositories": {"query": "lora"},
    "search_github_search_code": {"query": "lora"},
    "search_github_search_issues": {"query": "lora"},
    "search_github_search_pull_requests": {"query": "lora"},
    "search_github_search_users": {"query": "octocat"},
    "search_github_get_repository_readme": {"owner": "huggingface", "repo": "peft"},
    "search_scholar_arxiv_search_by_content": {"query": "lora"},
    "search_scholar_arxiv_search_by_author": {"author": "Edward Hu"},
    "search_scholar_google_scholar_search": {"query": "lora"},
    "search_scholar_search_dblp_papers": {"query": "lora"},
    "search_scholar_search_dblp_authors": {"query": "hinton"},
    "search_scholar_search_dblp_venues": {"query": "iclr"},
}


def test_build_connectors_returns_the_22_paper_tools_in_order():
    tools = build_connectors(ConnectorConfig())

    assert list(tools) == list(TOOL_NAMES)
    assert len(tools) == 22
    assert set(MINIMAL_ARGS) == set(TOOL_NAMES)


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_every_spec_is_well_formed(name):
    spec = build_connectors(ConnectorConfig())[name]

    assert spec.name == name
    assert spec.description
    assert "\n" not in spec.description
    assert spec.connector
    assert spec.service
    jsonschema.Draft202012Validator.check_schema(spec.input_schema)
    jsonschema.Draft202012Validator.check_schema(spec.output_schema)
    jsonschema.validate(MINIMAL_ARGS[name], spec.input_schema)


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_every_tool_is_off_until_configured(name):
    assert not build_connectors(ConnectorConfig())[name].configured

    error = error_of(ConnectorConfig(), name, MINIMAL_ARGS[name])

    assert error.code == "not_configured"
    assert "RSI_" in error.message  # says how to turn it on


def test_bad_arguments_are_bad_request_naming_the_field():
    config = ConnectorConfig(github_api_url="http://127.0.0.1:9")

    unknown = error_of(config, "search_github_search_repositories", {"query": "x", "qeury": "typo"})
    wrong_type = error_of(config, "search_github_search_repositories", {"query": "x", "per_page": "ten"})
    out_of_range = error_of(config, "search_github_search_repositories", {"query": "x", "per_page": 1000})

    assert unknown.code == wrong_type.code == out_of_range.code == "bad_request"
    assert "qeury" in unknown.message
    assert "per_page" in wrong_type.message


def test_from_env_reads_rsi_variables_and_infers_providers():
    config = ConnectorConfig.from_env(
        {
            "RSI_HF_ENDPOINT": "https://hub.internal",
            "RSI_HF_TOKEN": "hf_secret",
            "RSI_GITHUB_API_URL": "https://api.github.com",
            "RSI_SEARCH_PROVIDER_URL": "https://serpapi.com",
            "RSI_SEARCH_API_KEY": "serp_secret",
            "RSI_WEB_PARSE_ENABLED": "1",
            "RSI_WEB_PARSE_ALLOW_PRIVATE": "false",
            "RSI_CONNECTOR_TIMEOUT_S": "2.5",
            "RSI_ARXIV_API_URL": "",
        }
    )

    assert config.hf_provider == "hub"
    assert config.hf_endpoint == "https://hub.internal"
    assert config.search_provider == "serpapi"
    assert config.web_parse_enabled is True
    assert config.allow_private_addresses is False
    assert config.timeout_s == 2.5
    assert config.arxiv_api_url is None  # empty counts as unset
    assert "secret" not in repr(config)


def test_from_env_local_catalog_chooses_the_local_provider(tmp_path):
    config = ConnectorConfig.from_env({"RSI_LOCAL_CATALOG_DIR": str(tmp_path)})

    assert config.hf_provider == "local"
    assert build_connectors(config)["hf_search_datasets"].connector == "hf_local_catalog"


def test_connector_error_refuses_unknown_codes():
    with pytest.raises(ValueError, match="unknown connector error code"):
        ConnectorError("oops", "x")
