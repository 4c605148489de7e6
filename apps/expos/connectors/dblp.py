"""DBLP's search API: ``/search/{publ,author,venue}/api?q=..&format=json&h=..&f=..``.

DBLP's JSON is a rendering of its XML: attributes become ``@name`` keys, text becomes ``text``,
and an element that occurs once is an object where several make a list. ``_many`` undoes that.
"""

from __future__ import annotations

from typing import Any

from .base import JSON, Connector, ConnectorError, http_client, integer_schema, object_schema, tool

NULLABLE_STR: JSON = {"type": ["string", "null"]}
SEARCH_IN = object_schema(
    {
        "query": {"type": "string", "minLength": 1, "maxLength": 300, "description": "DBLP search terms."},
        "max_results": integer_schema(10, 1, 100, "Most hits to return."),
        "offset": integer_schema(0, 0, 10000, "First hit to return (0-based)."),
    },
    ["query"],
)


def _out(item: JSON) -> JSON:
    return {
        "type": "object",
        "required": ["total", "hits"],
        "properties": {
            "query": {"type": "string"},
            "total": {"type": "integer"},
            "hits": {"type": "array", "items": item},
        },
    }


PAPER: JSON = {
    "type": "object",
    "required": ["title", "authors", "key"],
    "properties": {
        "title": {"type": "string"},
        "authors": {"type": "array", "items": {"type": "string"}},
        "venue": NULLABLE_STR,
        "year": NULLABLE_STR,
        "type": NULLABLE_STR,
        "doi": NULLABLE_STR,
        "ee": {"type": "array", "items": {"type": "string"}},
        "url": NULLABLE_STR,
        "key": {"type": "string"},
    },
}
AUTHOR: JSON = {
    "type": "object",
    "required": ["name", "url"],
    "properties": {
        "name": {"type": "string"},
        "url": {"type": "string"},
        "affiliations": {"type": "array", "items": {"type": "string"}},
        "aliases": {"type": "array", "items": {"type": "string"}},
    },
}
VENUE: JSON = {
    "type": "object",
    "required": ["venue", "url"],
    "properties": {
        "venue": {"type": "string"},
        "acronym": NULLABLE_STR,
        "type": NULLABLE_STR,
        "url": {"type": "string"},
    },
}


def _many(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _text(value: Any) -> str:
    return str(value.get("text", "")) if isinstance(value, dict) else str(value)


class DblpConnector(Connector):
    name = "dblp"
    service = "dblp.org"
    enable_hint = "set RSI_DBLP_API_URL=https://dblp.org"

    def configured(self, tool_name: str) -> bool:
        return bool(self.config.dblp_api_url)

    def _hits(self, kind: str, args: JSON) -> tuple[int, list[JSON]]:
        client = http_client(self.config, self.config.dblp_api_url)
        # c=0: no auto-completions, which the tools never show.
        params = {"q": args["query"], "format": "json", "h": args["max_results"], "f": args["offset"], "c": 0}
        body = client.get_json(f"/search/{kind}/api", params)
        hits = body.get("result", {}).get("hits") if isinstance(body, dict) else None
        if not isinstance(hits, dict):
            raise ConnectorError("upstream_error", f"/search/{kind}/api answered without result.hits")
        return int(hits.get("@total", 0)), [hit.get("info", {}) for hit in _many(hits.get("hit"))]

    @tool("search_scholar_search_dblp_papers", "Search computer-science publications on DBLP.", SEARCH_IN, _out(PAPER))
    def search_papers(self, args: JSON) -> JSON:
        total, infos = self._hits("publ", args)
        papers = [
            {
                "title": str(info.get("title", "")),
                "authors": [_text(a) for a in _many((info.get("authors") or {}).get("author"))],
                # A paper in several venues (e.g. a journal and CoRR) lists them all.
                "venue": ", ".join(_text(v) for v in _many(info.get("venue"))) or None,
                "year": info.get("year"),
                "type": info.get("type"),
                "doi": info.get("doi"),
                "ee": [_text(e) for e in _many(info.get("ee"))],
                "url": info.get("url"),
                "key": str(info.get("key", "")),
            }
            for info in infos
        ]
        return {"query": args["query"], "total": total, "hits": papers}

    @tool(
        "search_scholar_search_dblp_authors",
        "Search authors on DBLP; returns profile URLs and affiliations.",
        SEARCH_IN,
        _out(AUTHOR),
    )
    def search_authors(self, args: JSON) -> JSON:
        total, infos = self._hits("author", args)
        authors = [
            {
                "name": _text(info.get("author", "")),
                "url": str(info.get("url", "")),
                "affiliations": [
                    _text(n)
                    for n in _many((info.get("notes") or {}).get("note"))
                    if isinstance(n, dict) and n.get("@type") == "affiliation"
                ],
                "aliases": [_text(a) for a in _many((info.get("aliases") or {}).get("alias"))],
            }
            for info in infos
        ]
        return {"query": args["query"], "total": total, "hits": authors}

    @tool("search_scholar_search_dblp_venues", "Search conferences and journals on DBLP.", SEARCH_IN, _out(VENUE))
    def search_venues(self, args: JSON) -> JSON:
        total, infos = self._hits("venue", args)
        venues = [
            {
                "venue": _text(info.get("venue", "")),
                "acronym": info.get("acronym"),
                "type": info.get("type"),
                "url": str(info.get("url", "")),
            }
            for info in infos
        ]
        return {"query": args["query"], "total": total, "hits": venues}
