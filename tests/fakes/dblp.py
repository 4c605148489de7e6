"""DBLP's search API: ``/search/{publ,author,venue}/api?q=..&format=json&h=..&f=..&c=..``.

The JSON mirrors DBLP's XML (dblp.org/faq/13501473): ``result.status``, ``result.hits`` with
string counters ``@total``/``@sent``/``@first``, and ``hit[].info``. A single author or note is an
object rather than a one-element list, exactly as DBLP renders it; zero hits carry no ``hit`` key.
"""

from __future__ import annotations

from typing import Any

from . import FakeServer, Request, Response, json_response

PUBLICATIONS: list[dict[str, Any]] = [
    {
        "authors": {
            "author": [{"@pid": "81/8329", "text": "Edward J. Hu"}, {"@pid": "212/3812", "text": "Yelong Shen"}]
        },
        "title": "LoRA: Low-Rank Adaptation of Large Language Models.",
        "venue": "ICLR",
        "year": "2022",
        "type": "Conference and Workshop Papers",
        "access": "open",
        "key": "conf/iclr/HuSWALWWC22",
        "ee": "https://openreview.net/forum?id=nZeVKeeFYf9",
        "url": "https://dblp.org/rec/conf/iclr/HuSWALWWC22",
    },
    {
        # One author: DBLP renders it as an object, not a list.
        "authors": {"author": {"@pid": "150/3404", "text": "Tim Dettmers"}},
        "title": "QLoRA: Efficient Finetuning of Quantized LLMs.",
        "venue": ["NeurIPS", "CoRR"],
        "year": "2023",
        "type": "Conference and Workshop Papers",
        "access": "open",
        "key": "conf/nips/DettmersPHZ23",
        "doi": "10.48550/ARXIV.2305.14314",
        "ee": [
            "https://doi.org/10.48550/arXiv.2305.14314",
            "http://papers.nips.cc/paper_files/paper/2023/hash/1feb.html",
        ],
        "url": "https://dblp.org/rec/conf/nips/DettmersPHZ23",
    },
]
AUTHORS: list[dict[str, Any]] = [
    {
        "author": "Geoffrey E. Hinton",
        "url": "https://dblp.org/pid/10/3248",
        "notes": {
            "note": [
                {"@type": "affiliation", "text": "Google DeepMind, London, UK"},
                {"@type": "award", "text": "Turing Award"},
            ]
        },
        "aliases": {"alias": "Geoffrey Hinton"},
    },
    {"author": "Geoffrey Hinton", "url": "https://dblp.org/pid/428/8371"},
]
VENUES: list[dict[str, Any]] = [
    {
        "venue": "International Conference on Learning Representations (ICLR)",
        "acronym": "ICLR",
        "type": "Conference or Workshop",
        "url": "https://dblp.org/db/conf/iclr/",
    },
    {
        "venue": "Transactions on Machine Learning Research",
        "acronym": "TMLR",
        "type": "Journal",
        "url": "https://dblp.org/db/journals/tmlr/",
    },
]


def _text(info: dict[str, Any]) -> str:
    return str(info).lower()


class FakeDblp(FakeServer):
    def route(self, request: Request) -> Response:
        collections = {"/search/publ/api": PUBLICATIONS, "/search/author/api": AUTHORS, "/search/venue/api": VENUES}
        if request.path not in collections:
            return Response(404, b"<html><body>Not Found</body></html>", {"Content-Type": "text/html"})
        if request.arg("format") != "json":
            return Response(200, b"<?xml version='1.0'?><result/>", {"Content-Type": "application/xml"})
        q = request.arg("q", "") or ""
        terms = q.lower().split()
        found = [info for info in collections[request.path] if all(t.rstrip("$") in _text(info) for t in terms)]
        first, h = int(request.arg("f") or 0), int(request.arg("h") or 30)
        page = found[first : first + h]
        hits: dict[str, Any] = {
            "@total": str(len(found)),
            "@computed": str(len(found)),
            "@sent": str(len(page)),
            "@first": str(first),
        }
        if page:
            hits["hit"] = [
                {"@score": "7", "@id": str(1000 + i), "info": info, "url": f"URL#{1000 + i}"}
                for i, info in enumerate(page)
            ]
        return json_response(
            {
                "result": {
                    "query": q + "*",
                    "status": {"@code": "200", "text": "OK"},
                    "time": {"@unit": "msecs", "text": "1.23"},
                    "completions": {"@total": "0", "@computed": "0", "@sent": "0"},
                    "hits": hits,
                }
            }
        )
