"""search_web_web_parse: page text extraction, and refusing anything but public http(s) addresses."""

from __future__ import annotations

import socket

import pytest

from apps.expos.connectors import ConnectorConfig
from apps.expos.connectors import web as web_module
from tests.apps.expos.connectors import call, error_of
from tests.fakes.website import FakeWebsite

STRICT = ConnectorConfig(web_parse_enabled=True)


@pytest.fixture(scope="module")
def site():
    with FakeWebsite() as fake:
        yield fake


@pytest.fixture
def lax():
    return ConnectorConfig(web_parse_enabled=True, allow_private_addresses=True)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://127.1.2.3:8080/x",
        "http://10.0.0.5/",
        "http://192.168.1.1/",
        "http://172.16.0.1/",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata endpoint
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://[::ffff:127.0.0.1]/",  # IPv4-mapped loopback
        "http://224.0.0.1/",  # multicast
        "http://0.0.0.0/",
        "http://240.0.0.1/",  # reserved
        "http://100.64.0.1/",  # carrier-grade NAT, not global
        "http://localhost/",  # a name that resolves to loopback
    ],
)
def test_private_and_special_addresses_are_refused(url):
    error = error_of(STRICT, "search_web_web_parse", {"url": url})

    assert error.code == "forbidden_address"


def test_refusal_happens_before_any_connection(site):
    before = len(site.requests)

    error = error_of(STRICT, "search_web_web_parse", {"url": f"{site.url}/page.html"})

    assert error.code == "forbidden_address"
    assert len(site.requests) == before


def test_every_resolved_address_is_checked(monkeypatch):
    # A name answering one public and one private address must be refused as a whole.
    def fake_getaddrinfo(host, port, *args, **kwargs):
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port)),
        ]

    monkeypatch.setattr(web_module.socket, "getaddrinfo", fake_getaddrinfo)

    error = error_of(STRICT, "search_web_web_parse", {"url": "https://mixed.example/"})

    assert error.code == "forbidden_address"
    assert "10.1.2.3" in error.message


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://example.com/", "javascript:alert(1)"]
)
def test_non_http_schemes_are_refused(url):
    error = error_of(STRICT, "search_web_web_parse", {"url": url})

    assert error.code == "bad_request"


def test_credentials_in_url_are_refused():
    assert error_of(STRICT, "search_web_web_parse", {"url": "http://user:pw@example.com/"}).code == "bad_request"


def test_allow_private_addresses_fetches_the_loopback_page(lax, site):
    result = call(lax, "search_web_web_parse", {"url": f"{site.url}/page.html"})

    assert result["status"] == 200
    assert result["title"] == "Low-Rank Adaptation & friends"
    assert result["content_type"] == "text/html"
    assert "LoRA explained" in result["text"]
    assert "LoRA freezes the weights & trains low-rank updates." in result["text"]
    for hidden in ("secret", "color: red", "javascript"):  # script, style, noscript
        assert hidden not in result["text"]
    assert result["text"].splitlines()[-2:] == ["rank r", "alpha"]


def test_connection_goes_to_the_checked_address_with_the_original_host(lax, site):
    port = site.url.rsplit(":", 1)[1]

    call(lax, "search_web_web_parse", {"url": f"http://localhost:{port}/page.html"})

    assert site.requests[-1].headers["host"] == f"localhost:{port}"


def test_redirects_are_followed_and_reported(lax, site):
    result = call(lax, "search_web_web_parse", {"url": f"{site.url}/moved"})

    assert result["final_url"] == f"{site.url}/page.html"
    assert result["title"] == "Low-Rank Adaptation & friends"


def test_every_redirect_hop_is_checked(monkeypatch, site):
    # Treat the loopback fake as public; its redirect to a private address must still be refused.
    monkeypatch.setattr(web_module, "address_problem", lambda ip: None if str(ip) == "127.0.0.1" else "private")
    with FakeWebsite(redirect_target="http://10.0.0.7/admin") as redirecting:
        error = error_of(STRICT, "search_web_web_parse", {"url": f"{redirecting.url}/away"})

    assert error.code == "forbidden_address"
    assert "10.0.0.7" in error.message


def test_redirect_loops_stop(lax, site):
    assert error_of(lax, "search_web_web_parse", {"url": f"{site.url}/loop"}).code == "upstream_error"


def test_plain_text_binary_and_missing_pages(lax, site):
    text = call(lax, "search_web_web_parse", {"url": f"{site.url}/notes.txt"})
    binary = error_of(lax, "search_web_web_parse", {"url": f"{site.url}/file.bin"})
    missing = error_of(lax, "search_web_web_parse", {"url": f"{site.url}/absent"})

    assert text["text"] == "plain notes\nsecond line\n"
    assert text["title"] is None
    assert binary.code == "bad_request"
    assert missing.code == "bad_request"
    assert "404" in missing.message


def test_text_is_cut_at_max_chars(lax, site):
    result = call(lax, "search_web_web_parse", {"url": f"{site.url}/page.html", "max_chars": 100})

    assert len(result["text"]) == 100 or not result["truncated"]


def test_not_configured_unless_enabled():
    error = error_of(
        ConnectorConfig(allow_private_addresses=True), "search_web_web_parse", {"url": "https://example.com/"}
    )

    assert error.code == "not_configured"
    assert "RSI_WEB_PARSE_ENABLED" in error.message


def test_closed_port_is_unreachable(lax, closed_url):
    error = error_of(lax, "search_web_web_parse", {"url": f"{closed_url}/page.html"})

    assert error.code == "unreachable"
    assert closed_url in error.message
