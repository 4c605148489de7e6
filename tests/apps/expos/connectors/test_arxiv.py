"""search_scholar_arxiv_* tools against a loopback arXiv export API (Atom)."""

from __future__ import annotations

import pytest

from apps.expos.connectors import ConnectorConfig, ConnectorError
from apps.expos.connectors.arxiv import parse_feed
from tests.apps.expos.connectors import call, error_of
from tests.fakes.arxiv import FakeArxiv


@pytest.fixture(scope="module")
def arxiv():
    with FakeArxiv() as fake:
        yield fake


@pytest.fixture
def config(arxiv):
    return ConnectorConfig(arxiv_api_url=arxiv.url)


def test_search_by_content_parses_the_atom_feed(config, arxiv):
    result = call(config, "search_scholar_arxiv_search_by_content", {"query": "low-rank adaptation", "max_results": 5})

    assert arxiv.requests[-1].query["search_query"] == ["all:low-rank AND all:adaptation"]
    assert arxiv.requests[-1].query["max_results"] == ["5"]
    assert result["total_results"] == 1
    paper = result["papers"][0]
    assert paper["id"] == "2106.09685v2"
    assert paper["title"] == "LoRA: Low-Rank Adaptation of Large Language Models"  # hard wraps collapsed
    assert paper["authors"] == ["Edward J. Hu", "Yelong Shen", "Phillip Wallis"]
    assert paper["primary_category"] == "cs.CL"
    assert paper["categories"] == ["cs.CL", "cs.AI", "cs.LG"]
    assert paper["pdf_url"] == "http://arxiv.org/pdf/2106.09685v2"
    assert paper["abs_url"] == "http://arxiv.org/abs/2106.09685v2"
    assert paper["comment"] == "Draft V2 includes better baselines"
    assert paper["doi"] is None


def test_search_by_author_quotes_full_names(config, arxiv):
    result = call(config, "search_scholar_arxiv_search_by_author", {"author": "Tim Dettmers"})

    assert arxiv.requests[-1].query["search_query"] == ['au:"Tim Dettmers"']
    paper = result["papers"][0]
    assert paper["id"] == "2305.14314v1"
    assert paper["doi"] == "10.48550/arXiv.2305.14314"
    assert paper["journal_ref"] == "NeurIPS 2023"


def test_search_by_author_with_extra_words(config, arxiv):
    result = call(config, "search_scholar_arxiv_search_by_author", {"author": "Hu", "query": "adaptation"})

    assert arxiv.requests[-1].query["search_query"] == ["au:Hu AND all:adaptation"]
    assert [p["id"] for p in result["papers"]] == ["2106.09685v2"]


def test_arxiv_error_entry_is_bad_request(config):
    # arXiv answers a query it cannot parse with HTTP 200 and one entry titled "Error".
    error = error_of(config, "search_scholar_arxiv_search_by_content", {"query": "(unbalanced"})

    assert error.code == "bad_request"
    assert "malformed search_query" in error.message


def test_feed_with_a_dtd_is_refused():
    with pytest.raises(ConnectorError) as caught:
        parse_feed('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><feed xmlns="http://www.w3.org/2005/Atom"/>')

    assert caught.value.code == "upstream_error"


def test_not_configured_without_api_url():
    error = error_of(ConnectorConfig(), "search_scholar_arxiv_search_by_author", {"author": "x"})

    assert error.code == "not_configured"
    assert "RSI_ARXIV_API_URL" in error.message


def test_closed_port_is_unreachable(closed_url):
    error = error_of(
        ConnectorConfig(arxiv_api_url=closed_url), "search_scholar_arxiv_search_by_content", {"query": "x"}
    )

    assert error.code == "unreachable"
    assert closed_url in error.message
