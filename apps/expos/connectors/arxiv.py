"""arXiv's export API: ``/api/query`` answers an Atom feed (with opensearch and arxiv namespaces)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from .base import JSON, Connector, ConnectorError, http_client, integer_schema, object_schema, raise_for_upstream, tool

NS = {
    "atom": "http://www.w3.org/2005/Atom",
    "opensearch": "http://a9.com/-/spec/opensearch/1.1/",
    "arxiv": "http://arxiv.org/schemas/atom",
}
NULLABLE_STR: JSON = {"type": ["string", "null"]}
PAGING: JSON = {
    "max_results": integer_schema(10, 1, 100, "Most papers to return."),
    "start": integer_schema(0, 0, 10000, "Offset into the result list."),
    "sort_by": {"type": "string", "enum": ["relevance", "lastUpdatedDate", "submittedDate"], "default": "relevance"},
}
CONTENT_IN = object_schema(
    {
        "query": {"type": "string", "minLength": 1, "maxLength": 300, "description": "Words to find in any field."},
        **PAGING,
    },
    ["query"],
)
AUTHOR_IN = object_schema(
    {
        "author": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100,
            "description": "Author name, e.g. 'Yann LeCun'.",
        },
        "query": {"type": "string", "maxLength": 300, "description": "Optional words the papers must also contain."},
        **PAGING,
    },
    ["author"],
)
PAPER: JSON = {
    "type": "object",
    "required": ["id", "title", "authors", "summary"],
    "properties": {
        "id": {"type": "string", "description": "arXiv id with version, e.g. 2106.09685v2"},
        "title": {"type": "string"},
        "summary": {"type": "string"},
        "authors": {"type": "array", "items": {"type": "string"}},
        "published": NULLABLE_STR,
        "updated": NULLABLE_STR,
        "primary_category": NULLABLE_STR,
        "categories": {"type": "array", "items": {"type": "string"}},
        "abs_url": NULLABLE_STR,
        "pdf_url": NULLABLE_STR,
        "doi": NULLABLE_STR,
        "comment": NULLABLE_STR,
        "journal_ref": NULLABLE_STR,
    },
}
SEARCH_OUT: JSON = {
    "type": "object",
    "required": ["total_results", "start", "papers"],
    "properties": {
        "query": {"type": "string"},
        "total_results": {"type": "integer"},
        "start": {"type": "integer"},
        "papers": {"type": "array", "items": PAPER},
    },
}
_TERM_RE = re.compile(r'"[^"]+"|\S+')


class ArxivConnector(Connector):
    name = "arxiv"
    service = "export.arxiv.org"
    enable_hint = "set RSI_ARXIV_API_URL=https://export.arxiv.org"

    def configured(self, tool_name: str) -> bool:
        return bool(self.config.arxiv_api_url)

    def _query(self, search_query: str, args: JSON) -> JSON:
        client = http_client(self.config, self.config.arxiv_api_url)
        params = {
            "search_query": search_query,
            "start": args["start"],
            "max_results": args["max_results"],
            "sortBy": args["sort_by"],
            "sortOrder": "descending",
        }
        response = client.get("/api/query", params, check=False)
        if response.status_code == 400:
            # arXiv explains a malformed query inside an Atom error entry; parse_feed raises with its text.
            try:
                parse_feed(response.text)
            except ConnectorError as exc:
                if exc.code == "bad_request":
                    raise
        raise_for_upstream(response)
        return {"query": search_query, **parse_feed(response.text)}

    @tool(
        "search_scholar_arxiv_search_by_content",
        "Search arXiv papers by words in title, abstract or any field.",
        CONTENT_IN,
        SEARCH_OUT,
    )
    def search_by_content(self, args: JSON) -> JSON:
        return self._query(_all_terms("all", args["query"]), args)

    @tool("search_scholar_arxiv_search_by_author", "List arXiv papers by an author.", AUTHOR_IN, SEARCH_OUT)
    def search_by_author(self, args: JSON) -> JSON:
        name = args["author"].replace('"', "").strip()
        query = f'au:"{name}"' if " " in name else f"au:{name}"
        if args.get("query"):
            query += " AND " + _all_terms("all", args["query"])
        return self._query(query, args)


def _all_terms(field: str, text: str) -> str:
    """'low rank adaptation' -> 'all:low AND all:rank AND all:adaptation'; quoted phrases stay whole."""
    return " AND ".join(f"{field}:{term}" for term in _TERM_RE.findall(text))


def _parse_xml(text: str) -> ET.Element:
    # The feed is plain Atom; refusing any DTD rules out entity-expansion attacks on the parser.
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise ConnectorError("upstream_error", "arXiv answer contains a DTD; refused")
    try:
        return ET.fromstring(text)  # noqa: S314 - DTDs refused above, so no entity expansion
    except ET.ParseError as exc:
        raise ConnectorError("upstream_error", f"arXiv answer is not valid Atom XML: {exc}") from None


def _text(element: ET.Element, path: str) -> str | None:
    found = element.find(path, NS)
    return " ".join(found.text.split()) if found is not None and found.text else None


def parse_feed(text: str) -> JSON:
    root = _parse_xml(text)
    papers = []
    for entry in root.findall("atom:entry", NS):
        entry_id = _text(entry, "atom:id") or ""
        if "/api/errors" in entry_id:
            raise ConnectorError("bad_request", f"arXiv refused the query: {_text(entry, 'atom:summary')}")
        links = {
            (link.get("title") or link.get("rel") or ""): link.get("href") for link in entry.findall("atom:link", NS)
        }
        primary = entry.find("arxiv:primary_category", NS)
        papers.append(
            {
                "id": entry_id.rsplit("/abs/", 1)[-1],
                "title": _text(entry, "atom:title") or "",
                "summary": _text(entry, "atom:summary") or "",
                "authors": [_text(a, "atom:name") or "" for a in entry.findall("atom:author", NS)],
                "published": _text(entry, "atom:published"),
                "updated": _text(entry, "atom:updated"),
                "primary_category": primary.get("term") if primary is not None else None,
                "categories": [c.get("term", "") for c in entry.findall("atom:category", NS)],
                "abs_url": links.get("alternate"),
                "pdf_url": links.get("pdf"),
                "doi": _text(entry, "arxiv:doi"),
                "comment": _text(entry, "arxiv:comment"),
                "journal_ref": _text(entry, "arxiv:journal_ref"),
            }
        )
    return {
        "total_results": int(_text(root, "opensearch:totalResults") or len(papers)),
        "start": int(_text(root, "opensearch:startIndex") or 0),
        "papers": papers,
    }
