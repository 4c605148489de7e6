"""Google Scholar through the SerpAPI-compatible search provider (``engine=google_scholar``)."""

from __future__ import annotations

from typing import Any

from .base import JSON, Connector, integer_schema, object_schema, tool
from .web import SERPAPI_HINT, search_configured, serpapi_search, total_results

NULLABLE_STR: JSON = {"type": ["string", "null"]}
SCHOLAR_IN = object_schema(
    {
        "query": {"type": "string", "minLength": 1, "maxLength": 500},
        "num": integer_schema(10, 1, 20, "Results to return (Scholar serves at most 20 a page)."),
        "start": integer_schema(0, 0, 1000, "Result offset, for paging."),
        "year_low": {"type": "integer", "minimum": 1900, "maximum": 2100, "description": "Earliest publication year."},
        "year_high": {"type": "integer", "minimum": 1900, "maximum": 2100, "description": "Latest publication year."},
    },
    ["query"],
)
SCHOLAR_OUT: JSON = {
    "type": "object",
    "required": ["query", "results"],
    "properties": {
        "query": {"type": "string"},
        "total_results": {"type": ["integer", "null"]},
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["position", "title"],
                "properties": {
                    "position": {"type": "integer"},
                    "title": {"type": "string"},
                    "link": NULLABLE_STR,
                    "snippet": NULLABLE_STR,
                    "publication": NULLABLE_STR,
                    "authors": {"type": "array", "items": {"type": "string"}},
                    "cited_by": {"type": ["integer", "null"]},
                    "pdf_link": NULLABLE_STR,
                    "result_id": NULLABLE_STR,
                },
            },
        },
    },
}


class GoogleScholarConnector(Connector):
    name = "google_scholar"
    service = "serpapi.com (engine=google_scholar)"
    enable_hint = SERPAPI_HINT

    def configured(self, tool_name: str) -> bool:
        return search_configured(self.config)

    @tool(
        "search_scholar_google_scholar_search",
        "Search Google Scholar; returns papers with citation counts.",
        SCHOLAR_IN,
        SCHOLAR_OUT,
    )
    def google_scholar_search(self, args: JSON) -> JSON:
        params = {
            "q": args["query"],
            "num": args["num"],
            "start": args["start"],
            "as_ylo": args.get("year_low"),
            "as_yhi": args.get("year_high"),
        }
        body = serpapi_search(self.config, "google_scholar", params)
        results = [_result(i, item) for i, item in enumerate(body.get("organic_results") or [])]
        return {"query": args["query"], "total_results": total_results(body), "results": results}


def _result(index: int, item: dict[str, Any]) -> JSON:
    publication = item.get("publication_info") or {}
    cited_by = ((item.get("inline_links") or {}).get("cited_by") or {}).get("total")
    pdf = next((r.get("link") for r in item.get("resources") or [] if r.get("file_format") == "PDF"), None)
    return {
        "position": int(item.get("position", index)),
        "title": str(item.get("title", "")),
        "link": item.get("link"),
        "snippet": item.get("snippet"),
        "publication": publication.get("summary"),
        "authors": [str(a.get("name", "")) for a in publication.get("authors") or []],
        "cited_by": int(cited_by) if isinstance(cited_by, int) else None,
        "pdf_link": pdf,
        "result_id": item.get("result_id"),
    }
