"""Web search through a SerpAPI-compatible provider, and fetching one public page as text.

``search_web_web_parse`` fetches URLs an agent chose, so it is a server-side request forgery
risk: it refuses non-http(s) schemes and any host whose addresses are not all public, re-checks
every redirect hop, and connects to the very address it checked (no second DNS look-up an
attacker could rebind between the check and the connection).
"""

from __future__ import annotations

import ipaddress
import socket
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from .base import (
    JSON,
    Connector,
    ConnectorError,
    http_client,
    integer_schema,
    object_schema,
    raise_for_upstream,
    status_error,
    tool,
    truncate,
    unreachable,
)

NULLABLE_STR: JSON = {"type": ["string", "null"]}
MAX_REDIRECTS = 5
SERPAPI_HINT = (
    "set RSI_SEARCH_PROVIDER_URL=https://serpapi.com and RSI_SEARCH_API_KEY=<key> (RSI_SEARCH_PROVIDER=serpapi)"
)


# ---------------------------------------------------------------- SerpAPI-compatible provider (shared with scholar)


def search_configured(config: Any) -> bool:
    return config.search_provider == "serpapi" and bool(config.search_provider_url)


def serpapi_search(config: Any, engine: str, params: JSON) -> JSON:
    """GET /search.json?engine=..; SerpAPI reports failures as {"error": "..."} with or without an HTTP error."""
    client = http_client(config, config.search_provider_url)
    query = {"engine": engine, **params, "api_key": config.search_api_key, "output": "json"}
    response = client.get("/search.json", query, check=False)
    try:
        body = response.json()
    except ValueError:
        raise_for_upstream(response)
        raise ConnectorError("upstream_error", f"search provider answered non-JSON ({response.status_code})") from None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        # An empty result page is reported as an "error" too; for a caller it is just no results.
        if "hasn't returned any results" in body["error"]:
            return {**body, "organic_results": []}
        code = "bad_request" if response.status_code == 400 else "upstream_error"
        raise ConnectorError(code, f"search provider ({response.status_code}): {body['error'][:300]}")
    raise_for_upstream(response)
    if not isinstance(body, dict):
        raise ConnectorError("upstream_error", "search provider answered a non-object")
    return body


def total_results(body: JSON) -> int | None:
    value = (body.get("search_information") or {}).get("total_results")
    return int(value) if isinstance(value, int | float) else None


SEARCH_IN = object_schema(
    {
        "query": {"type": "string", "minLength": 1, "maxLength": 500},
        "num": integer_schema(10, 1, 100, "Results to return."),
        "start": integer_schema(0, 0, 500, "Result offset, for paging."),
        "hl": {
            "type": "string",
            "pattern": "^[a-z]{2}(-[A-Za-z]{2})?$",
            "description": "Interface language, e.g. 'en'.",
        },
    },
    ["query"],
)
SEARCH_OUT: JSON = {
    "type": "object",
    "required": ["query", "results"],
    "properties": {
        "query": {"type": "string"},
        "total_results": {"type": ["integer", "null"]},
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["position", "title", "link"],
                "properties": {
                    "position": {"type": "integer"},
                    "title": {"type": "string"},
                    "link": {"type": "string"},
                    "snippet": NULLABLE_STR,
                    "displayed_link": NULLABLE_STR,
                    "source": NULLABLE_STR,
                },
            },
        },
    },
}


class WebSearchConnector(Connector):
    name = "web_search"
    service = "serpapi.com (engine=google)"
    enable_hint = SERPAPI_HINT

    def configured(self, tool_name: str) -> bool:
        return search_configured(self.config)

    @tool("search_web_google_search", "Search the web (Google results via the search provider).", SEARCH_IN, SEARCH_OUT)
    def google_search(self, args: JSON) -> JSON:
        params = {"q": args["query"], "num": args["num"], "start": args["start"], "hl": args.get("hl")}
        body = serpapi_search(self.config, "google", params)
        results = [
            {
                "position": int(item.get("position", i + 1)),
                "title": str(item.get("title", "")),
                "link": str(item.get("link", "")),
                "snippet": item.get("snippet"),
                "displayed_link": item.get("displayed_link"),
                "source": item.get("source"),
            }
            for i, item in enumerate(body.get("organic_results") or [])
        ]
        return {"query": args["query"], "total_results": total_results(body), "results": results}


# ---------------------------------------------------------------- fetching one page


PARSE_IN = object_schema(
    {
        "url": {
            "type": "string",
            "minLength": 8,
            "maxLength": 2000,
            "description": "An http(s) URL on the public internet.",
        },
        "max_chars": integer_schema(20000, 100, 200000, "Cut the text after this many characters."),
    },
    ["url"],
)
PARSE_OUT: JSON = {
    "type": "object",
    "required": ["url", "final_url", "status", "title", "text", "truncated"],
    "properties": {
        "url": {"type": "string"},
        "final_url": {"type": "string"},
        "status": {"type": "integer"},
        "content_type": NULLABLE_STR,
        "title": NULLABLE_STR,
        "text": {"type": "string"},
        "truncated": {"type": "boolean"},
    },
}
TEXT_TYPES = ("text/plain", "text/markdown", "text/csv", "application/json", "text/x-rst")
HTML_TYPES = ("text/html", "application/xhtml+xml")


def address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address is not a public internet address, or None when it is."""
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:  # ::ffff:127.0.0.1 reaches 127.0.0.1
        return address_problem(mapped)
    for attr in ("is_loopback", "is_private", "is_link_local", "is_multicast", "is_reserved", "is_unspecified"):
        if getattr(ip, attr):
            return attr.removeprefix("is_").replace("_", "-")
    if not ip.is_global:  # e.g. 100.64.0.0/10 carrier-grade NAT
        return "non-global"
    return None


def resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConnectorError("unreachable", f"cannot resolve {host}: {exc}") from None
    # Strip an IPv6 zone id ('fe80::1%eth0') before parsing.
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))


class _TextExtractor(HTMLParser):
    """Title and visible text of an HTML page; scripts, styles and similar are dropped."""

    SKIP = frozenset({"script", "style", "noscript", "template", "svg", "head", "iframe", "object"})
    BLOCK = frozenset(
        {
            "p",
            "div",
            "br",
            "li",
            "ul",
            "ol",
            "tr",
            "table",
            "section",
            "article",
            "header",
            "footer",
            "pre",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "blockquote",
            "hr",
            "dd",
            "dt",
            "main",
            "nav",
            "aside",
        }
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.skipping = 0
        self.in_title = False
        self.title_parts: list[str] = []
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self.in_title = True
        elif tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        elif tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title_parts.append(data)
        elif not self.skipping:
            self.parts.append(data)

    def result(self) -> tuple[str | None, str]:
        title = " ".join("".join(self.title_parts).split()) or None
        lines = (" ".join(line.split()) for line in "".join(self.parts).splitlines())
        return title, "\n".join(line for line in lines if line)


def html_to_text(html: str) -> tuple[str | None, str]:
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    return parser.result()


class WebParseConnector(Connector):
    name = "web_parse"
    service = "the public web (any http/https URL)"
    enable_hint = "set RSI_WEB_PARSE_ENABLED=1 (RSI_WEB_PARSE_ALLOW_PRIVATE=1 also allows private addresses)"

    def configured(self, tool_name: str) -> bool:
        return self.config.web_parse_enabled

    def _targets(self, url: str) -> tuple[list[str], JSON, JSON]:
        """Check ``url``; return the URL rewritten to each checked address, the headers and httpx extensions."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ConnectorError("bad_request", f"only http and https URLs are fetched, not {parts.scheme or 'none'!r}")
        if not parts.hostname:
            raise ConnectorError("bad_request", f"{url!r} has no host")
        if parts.username or parts.password:
            raise ConnectorError("bad_request", "URLs with credentials are not fetched")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ConnectorError("bad_request", f"{url!r} has an invalid port") from None
        addresses = resolve(parts.hostname, port)
        if not self.config.allow_private_addresses:
            # Every address must be public: a name answering one public and one private address
            # could otherwise be steered to the private one.
            for ip in addresses:
                problem = address_problem(ip)
                if problem:
                    raise ConnectorError(
                        "forbidden_address",
                        f"{parts.hostname} resolves to {ip} ({problem}); only public addresses are fetched",
                    )
        pinned = [
            parts._replace(netloc=f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}").geturl() for ip in addresses
        ]
        host_header = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        # The TLS handshake and certificate check still use the real host name.
        extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
        return pinned, {"Host": host_header, "User-Agent": self.config.user_agent}, extensions

    def _fetch(self, url: str) -> tuple[str, httpx.Response, bytes]:
        current = url
        with httpx.Client(timeout=self.config.timeout_s, follow_redirects=False, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                pinned, headers, extensions = self._targets(current)
                response, body = self._get_first(client, current, pinned, headers, extensions)
                if response.is_redirect and "location" in response.headers:
                    current = urljoin(current, response.headers["location"])
                    continue
                return current, response, body
        raise ConnectorError("upstream_error", f"{url} redirected more than {MAX_REDIRECTS} times")

    def _get_first(
        self, client: httpx.Client, url: str, pinned: list[str], headers: JSON, extensions: JSON
    ) -> tuple[httpx.Response, bytes]:
        """GET from the first checked address that accepts a connection (as browsers try each one)."""
        error: Exception | None = None
        for target in pinned:
            try:
                with client.stream("GET", target, headers=headers, extensions=extensions) as response:
                    body = bytearray()
                    for chunk in response.iter_bytes():
                        body.extend(chunk)
                        if len(body) > self.config.max_web_bytes:
                            break
                    return response, bytes(body[: self.config.max_web_bytes])
            except httpx.ConnectError as exc:
                error = exc
            except httpx.TransportError as exc:
                raise unreachable(url, exc) from None
        raise unreachable(url, error or ConnectionError("no address"))

    @tool(
        "search_web_web_parse",
        "Fetch one public web page and return its title and plain text.",
        PARSE_IN,
        PARSE_OUT,
    )
    def web_parse(self, args: JSON) -> JSON:
        final_url, response, body = self._fetch(args["url"])
        if response.status_code >= 400:
            raise status_error(response.status_code, f"GET {final_url}", body[:300].decode("utf-8", errors="replace"))
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower() or None
        try:
            text = body.decode(response.encoding or "utf-8", errors="replace")
        except LookupError:  # a charset name Python does not know
            text = body.decode("utf-8", errors="replace")
        if content_type is None or content_type in HTML_TYPES:
            title, text = html_to_text(text)
        elif content_type in TEXT_TYPES or content_type.startswith("text/"):
            title = None
        else:
            raise ConnectorError("bad_request", f"{final_url} is {content_type}, not a text or HTML page")
        text, cut = truncate(text, args["max_chars"])
        return {
            "url": args["url"],
            "final_url": final_url,
            "status": response.status_code,
            "content_type": content_type,
            "title": title,
            "text": text,
            "truncated": cut or len(body) >= self.config.max_web_bytes,
        }
