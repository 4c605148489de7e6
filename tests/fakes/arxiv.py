"""arXiv's export API: ``GET /api/query?search_query=..&start=..&max_results=..`` -> an Atom 1.0 feed.

The feed follows info.arxiv.org/help/api/user-manual: opensearch totals, one ``entry`` per paper
with ``arxiv:primary_category``, ``arxiv:doi``/``arxiv:comment``/``arxiv:journal_ref`` and
``link`` elements (abs page rel=alternate, PDF title=pdf). A malformed query is answered the way
arXiv does it: HTTP 200 and a single entry titled ``Error`` whose id is under ``/api/errors``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from . import FakeServer, Request, Response, text_response

ATOM = "application/atom+xml; charset=utf-8"


@dataclass
class Paper:
    arxiv_id: str  # with version, e.g. 2106.09685v2
    title: str
    summary: str
    authors: list[str]
    categories: list[str]
    published: str = "2021-06-17T17:37:18Z"
    updated: str = "2021-10-16T18:40:34Z"
    doi: str | None = None
    comment: str | None = None
    journal_ref: str | None = None
    affiliations: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        return f"{self.title} {self.summary} {' '.join(self.authors)}".lower()


PAPERS = [
    Paper(
        "2106.09685v2",
        "LoRA: Low-Rank Adaptation of Large\n  Language Models",
        "An important paradigm of natural language processing consists of large-scale pre-training\n  and adaptation.",
        ["Edward J. Hu", "Yelong Shen", "Phillip Wallis"],
        ["cs.CL", "cs.AI", "cs.LG"],
        comment="Draft V2 includes better baselines",
    ),
    Paper(
        "2305.14314v1",
        "QLoRA: Efficient Finetuning of Quantized LLMs",
        "We present QLoRA, an efficient finetuning approach.",
        ["Tim Dettmers", "Artidoro Pagnoni"],
        ["cs.LG"],
        doi="10.48550/arXiv.2305.14314",
        journal_ref="NeurIPS 2023",
        affiliations={"Tim Dettmers": "University of Washington"},
    ),
]


def _entry(p: Paper) -> str:
    authors = "".join(
        f"<author><name>{escape(a)}</name>"
        + (f"<arxiv:affiliation>{escape(p.affiliations[a])}</arxiv:affiliation>" if a in p.affiliations else "")
        + "</author>"
        for a in p.authors
    )
    optional = "".join(
        f"<arxiv:{tag}>{escape(value)}</arxiv:{tag}>"
        for tag, value in (("doi", p.doi), ("comment", p.comment), ("journal_ref", p.journal_ref))
        if value
    )
    categories = "".join(f'<category term="{c}" scheme="http://arxiv.org/schemas/atom"/>' for c in p.categories)
    return (
        "<entry>"
        f"<id>http://arxiv.org/abs/{p.arxiv_id}</id>"
        f"<updated>{p.updated}</updated><published>{p.published}</published>"
        f"<title>{escape(p.title)}</title><summary>{escape(p.summary)}</summary>"
        f"{authors}{optional}"
        f'<link href="http://arxiv.org/abs/{p.arxiv_id}" rel="alternate" type="text/html"/>'
        f'<link title="pdf" href="http://arxiv.org/pdf/{p.arxiv_id}" rel="related" type="application/pdf"/>'
        f'<arxiv:primary_category xmlns:arxiv="http://arxiv.org/schemas/atom" term="{p.categories[0]}" '
        'scheme="http://arxiv.org/schemas/atom"/>'
        f"{categories}"
        "</entry>"
    )


def feed(query: str, entries: list[str], total: int, start: int, per_page: int) -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<feed xmlns="http://www.w3.org/2005/Atom" xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/" '
        'xmlns:arxiv="http://arxiv.org/schemas/atom">'
        f'<link href={quoteattr("http://arxiv.org/api/query?search_query=" + query)} rel="self" '
        'type="application/atom+xml"/>'
        f'<title type="html">ArXiv Query: {escape("search_query=" + query)}</title>'
        "<id>http://arxiv.org/api/Zm9vYmFy</id><updated>2024-06-01T00:00:00-04:00</updated>"
        f"<opensearch:totalResults>{total}</opensearch:totalResults>"
        f"<opensearch:startIndex>{start}</opensearch:startIndex>"
        f"<opensearch:itemsPerPage>{per_page}</opensearch:itemsPerPage>" + "".join(entries) + "</feed>"
    )


def error_feed(query: str, message: str) -> str:
    anchor = re.sub(r"\W+", "_", message)
    entry = (
        f"<entry><id>http://arxiv.org/api/errors#{anchor}</id><title>Error</title>"
        f"<summary>{escape(message)}</summary><updated>2024-06-01T00:00:00-04:00</updated>"
        f'<link href="http://arxiv.org/api/errors#{anchor}" rel="alternate" type="text/html"/>'
        "<author><name>arXiv api core</name></author></entry>"
    )
    return feed(query, [entry], 1, 0, 1)


# Field prefixes and terms as the user manual documents them; parentheses are left out so an
# unbalanced query takes arXiv's error path.
_CLAUSE = re.compile(r'(all|au|ti|abs):("([^"]+)"|[^\s()"]+)')


class FakeArxiv(FakeServer):
    def route(self, request: Request) -> Response:
        if request.path != "/api/query":
            return text_response("Not Found", "text/plain", 404)
        query = request.arg("search_query", "") or ""
        try:
            start, per_page = int(request.arg("start", "0") or 0), int(request.arg("max_results", "10") or 10)
        except ValueError:
            return text_response(error_feed(query, "start must be an integer"), ATOM)
        clauses = [c for c in re.split(r"\s+AND\s+", query) if c]
        if not clauses or not all(_CLAUSE.fullmatch(c) for c in clauses):
            return text_response(error_feed(query, f"malformed search_query: {query!r}"), ATOM)
        found = PAPERS
        for clause in clauses:
            match = _CLAUSE.fullmatch(clause)
            assert match is not None
            field_, term = match[1], (match[3] or match[2]).lower().replace("_", " ")
            if field_ == "au":
                found = [p for p in found if any(term in a.lower() for a in p.authors)]
            else:
                found = [p for p in found if term in p.text()]
        page = found[start : start + per_page]
        return text_response(feed(query, [_entry(p) for p in page], len(found), start, per_page), ATOM)
