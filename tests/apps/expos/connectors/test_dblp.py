"""search_scholar_search_dblp_* tools against a loopback DBLP search API."""

from __future__ import annotations

import pytest

from apps.expos.connectors import ConnectorConfig
from tests.apps.expos.connectors import call, error_of
from tests.fakes.dblp import FakeDblp


@pytest.fixture(scope="module")
def dblp():
    with FakeDblp() as fake:
        yield fake


@pytest.fixture
def config(dblp):
    return ConnectorConfig(dblp_api_url=dblp.url)


def test_papers_parse_author_lists_single_authors_and_venue_lists(config, dblp):
    result = call(config, "search_scholar_search_dblp_papers", {"query": "lora", "max_results": 5})

    sent = dblp.requests[-1]
    assert sent.path == "/search/publ/api"
    assert sent.query["format"] == ["json"]
    assert sent.query["h"] == ["5"]
    assert result["total"] == 2
    lora, qlora = result["hits"]
    assert lora["authors"] == ["Edward J. Hu", "Yelong Shen"]
    assert lora["venue"] == "ICLR"
    assert lora["ee"] == ["https://openreview.net/forum?id=nZeVKeeFYf9"]
    assert qlora["authors"] == ["Tim Dettmers"]  # DBLP sends a lone author as an object
    assert qlora["venue"] == "NeurIPS, CoRR"
    assert qlora["doi"] == "10.48550/ARXIV.2305.14314"
    assert qlora["key"] == "conf/nips/DettmersPHZ23"


def test_authors_parse_affiliations_and_aliases(config):
    result = call(config, "search_scholar_search_dblp_authors", {"query": "hinton"})

    assert [a["url"] for a in result["hits"]] == ["https://dblp.org/pid/10/3248", "https://dblp.org/pid/428/8371"]
    first = result["hits"][0]
    assert first["affiliations"] == ["Google DeepMind, London, UK"]  # the award note is not an affiliation
    assert first["aliases"] == ["Geoffrey Hinton"]
    assert result["hits"][1]["affiliations"] == []


def test_venues(config):
    result = call(config, "search_scholar_search_dblp_venues", {"query": "learning representations"})

    assert result["hits"] == [
        {
            "venue": "International Conference on Learning Representations (ICLR)",
            "acronym": "ICLR",
            "type": "Conference or Workshop",
            "url": "https://dblp.org/db/conf/iclr/",
        }
    ]


def test_zero_hits_has_no_hit_key_and_gives_an_empty_list(config):
    result = call(config, "search_scholar_search_dblp_papers", {"query": "zzzznothing"})

    assert result == {"query": "zzzznothing", "total": 0, "hits": []}


def test_paging_sends_first_hit_offset(config, dblp):
    result = call(config, "search_scholar_search_dblp_papers", {"query": "lora", "offset": 1, "max_results": 1})

    assert dblp.requests[-1].query["f"] == ["1"]
    assert [h["key"] for h in result["hits"]] == ["conf/nips/DettmersPHZ23"]


def test_not_configured_without_api_url():
    error = error_of(ConnectorConfig(), "search_scholar_search_dblp_venues", {"query": "x"})

    assert error.code == "not_configured"
    assert "RSI_DBLP_API_URL" in error.message


def test_closed_port_is_unreachable(closed_url):
    error = error_of(ConnectorConfig(dblp_api_url=closed_url), "search_scholar_search_dblp_authors", {"query": "x"})

    assert error.code == "unreachable"
    assert closed_url in error.message
