"""SerpAPI: ``GET /search.json?engine=google|google_scholar&q=..&api_key=..``.

Shapes follow serpapi.com/search-api and /google-scholar-organic-results: ``search_metadata``,
``search_parameters``, ``search_information.total_results`` and ``organic_results``. Failures are
``{"error": "..."}`` (401 for a bad key); an empty result page is HTTP 200 with an ``error`` too.
"""

from __future__ import annotations

from typing import Any

from . import FakeServer, Request, Response, json_response

GOOGLE = [
    {
        "position": 1,
        "title": "LoRA: Low-Rank Adaptation of Large Language Models - arXiv",
        "link": "https://arxiv.org/abs/2106.09685",
        "redirect_link": "https://www.google.com/url?sa=t&url=https://arxiv.org/abs/2106.09685",
        "displayed_link": "https://arxiv.org › cs",
        "snippet": "We propose Low-Rank Adaptation, or LoRA, which freezes the pre-trained model weights ...",
        "snippet_highlighted_words": ["LoRA"],
        "source": "arXiv",
    },
    {
        "position": 2,
        "title": "PEFT - Hugging Face",
        "link": "https://huggingface.co/docs/peft",
        "displayed_link": "https://huggingface.co › docs › peft",
        "snippet": "Parameter-Efficient Fine-Tuning (PEFT) methods enable efficient adaptation ...",
        "source": "Hugging Face",
    },
]
SCHOLAR = [
    {
        "position": 0,
        "title": "Lora: Low-rank adaptation of large language models.",
        "result_id": "Zk9_8O0CnGsJ",
        "link": "https://arxiv.org/abs/2106.09685",
        "snippet": "An important paradigm of natural language processing consists of large-scale pre-training ...",
        "publication_info": {
            "summary": "EJ Hu, Y Shen, P Wallis, Z Allen-Zhu, Y Li… - ICLR, 2022 - arxiv.org",
            "authors": [
                {"name": "EJ Hu", "link": "https://scholar.google.com/citations?user=abc", "author_id": "abc"},
                {"name": "Y Shen", "link": "https://scholar.google.com/citations?user=def", "author_id": "def"},
            ],
        },
        "resources": [{"title": "arxiv.org", "file_format": "PDF", "link": "https://arxiv.org/pdf/2106.09685"}],
        "inline_links": {
            "serpapi_cite_link": "https://serpapi.com/search.json?engine=google_scholar_cite&q=Zk9_8O0CnGsJ",
            "cited_by": {"total": 12000, "link": "https://scholar.google.com/scholar?cites=123", "cites_id": "123"},
            "versions": {"total": 9, "link": "https://scholar.google.com/scholar?cluster=123", "cluster_id": "123"},
        },
    }
]


class FakeSerpApi(FakeServer):
    def __init__(self, api_key: str = "test-key") -> None:
        super().__init__()
        self.api_key = api_key

    def route(self, request: Request) -> Response:
        if request.path != "/search.json":
            return json_response({"error": "Unsupported path"}, 404)
        if request.arg("api_key") != self.api_key:
            return json_response(
                {"error": "Invalid API key. Your API key should be here: https://serpapi.com/manage-api-key"}, 401
            )
        engine, q = request.arg("engine"), request.arg("q")
        if not q:
            return json_response({"error": "Missing query `q` parameter."}, 400)
        pool: list[dict[str, Any]] = {"google": GOOGLE, "google_scholar": SCHOLAR}.get(engine or "", [])
        if engine not in ("google", "google_scholar"):
            return json_response({"error": f"Unsupported `{engine}` search engine."}, 400)
        found = [r for r in pool if all(t in (r["title"] + r["snippet"]).lower() for t in q.lower().split())]
        body: dict[str, Any] = {
            "search_metadata": {
                "id": "665f0c0ffee",
                "status": "Success",
                "json_endpoint": "https://serpapi.com/searches/x.json",
                "total_time_taken": 0.42,
            },
            "search_parameters": {"engine": engine, "q": q},
            "search_information": {"total_results": len(found) * 1000, "time_taken_displayed": 0.31},
        }
        if not found:
            body["search_information"] = {"organic_results_state": "Fully empty"}
            body["error"] = "Google hasn't returned any results for this query."
            return json_response(body)
        return json_response({**body, "organic_results": found})
