"""search_web_google_search and search_scholar_google_scholar_search via a loopback SerpAPI."""

from __future__ import annotations

import pytest

from apps.expos.connectors import ConnectorConfig
from tests.apps.expos.connectors import call, error_of
from tests.fakes.serpapi import FakeSerpApi


@pytest.fixture(scope="module")
def serpapi():
    with FakeSerpApi(api_key="k-123") as fake:
        yield fake


@pytest.fixture
def config(serpapi):
    return ConnectorConfig(search_provider="serpapi", search_provider_url=serpapi.url, search_api_key="k-123")


def test_google_search_parses_organic_results(config, serpapi):
    result = call(config, "search_web_google_search", {"query": "lora", "num": 5})

    sent = serpapi.requests[-1]
    assert sent.path == "/search.json"
    assert sent.query["engine"] == ["google"]
    assert sent.query["q"] == ["lora"]
    assert sent.query["api_key"] == ["k-123"]
    assert result["total_results"] == 1000
    assert result["results"] == [
        {
            "position": 1,
            "title": "LoRA: Low-Rank Adaptation of Large Language Models - arXiv",
            "link": "https://arxiv.org/abs/2106.09685",
            "snippet": "We propose Low-Rank Adaptation, or LoRA, which freezes the pre-trained model weights ...",
            "displayed_link": "https://arxiv.org › cs",
            "source": "arXiv",
        }
    ]


def test_scholar_search_parses_citations_and_pdf(config, serpapi):
    result = call(config, "search_scholar_google_scholar_search", {"query": "low-rank adaptation", "year_low": 2021})

    assert serpapi.requests[-1].query["engine"] == ["google_scholar"]
    assert serpapi.requests[-1].query["as_ylo"] == ["2021"]
    paper = result["results"][0]
    assert paper["cited_by"] == 12000
    assert paper["pdf_link"] == "https://arxiv.org/pdf/2106.09685"
    assert paper["authors"] == ["EJ Hu", "Y Shen"]
    assert paper["publication"].startswith("EJ Hu, Y Shen")
    assert paper["result_id"] == "Zk9_8O0CnGsJ"


def test_no_results_is_an_empty_list_not_an_error(config):
    result = call(config, "search_web_google_search", {"query": "qwxzv nothing"})

    assert result["results"] == []


def test_bad_api_key_is_upstream_error(serpapi):
    config = ConnectorConfig(search_provider="serpapi", search_provider_url=serpapi.url, search_api_key="wrong")

    error = error_of(config, "search_scholar_google_scholar_search", {"query": "lora"})

    assert error.code == "upstream_error"
    assert "Invalid API key" in error.message


@pytest.mark.parametrize("tool", ["search_web_google_search", "search_scholar_google_scholar_search"])
def test_not_configured_without_provider_url(tool):
    error = error_of(ConnectorConfig(search_api_key="k"), tool, {"query": "x"})

    assert error.code == "not_configured"
    assert "RSI_SEARCH_PROVIDER_URL" in error.message


@pytest.mark.parametrize("tool", ["search_web_google_search", "search_scholar_google_scholar_search"])
def test_closed_port_is_unreachable(closed_url, tool):
    config = ConnectorConfig(search_provider="serpapi", search_provider_url=closed_url, search_api_key="k")

    error = error_of(config, tool, {"query": "x"})

    assert error.code == "unreachable"
    assert closed_url in error.message
