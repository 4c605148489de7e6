"""GitHub REST v3: ``/search/{repositories,code,issues,users}`` and ``/repos/{owner}/{repo}/readme``.

Shapes follow docs.github.com/rest/search and /rest/repos/contents: a search answers
``{total_count, incomplete_results, items}``; issues and PRs share /search/issues (a PR item carries
a ``pull_request`` object, and GitHub requires an ``is:issue`` or ``is:pr`` qualifier); errors are
``{message, documentation_url, status}``.
"""

from __future__ import annotations

import base64
import re
import zlib
from typing import Any

from . import FakeServer, Request, Response, json_response

API = "https://api.github.com"
DOCS = "https://docs.github.com/rest"


def owner(login: str, kind: str = "User") -> dict[str, Any]:
    return {
        "login": login,
        "id": zlib.crc32(login.encode()) % 10**8,
        "type": kind,
        "html_url": f"https://github.com/{login}",
        "url": f"{API}/users/{login}",
        "site_admin": False,
    }


def repo(full_name: str, description: str, stars: int, language: str, topics: list[str]) -> dict[str, Any]:
    login, name = full_name.split("/")
    return {
        "id": zlib.crc32(full_name.encode()) % 10**9,
        "node_id": "R_kgDO" + name,
        "name": name,
        "full_name": full_name,
        "private": False,
        "owner": owner(login, "Organization"),
        "html_url": f"https://github.com/{full_name}",
        "description": description,
        "fork": False,
        "url": f"{API}/repos/{full_name}",
        "created_at": "2023-02-01T10:00:00Z",
        "updated_at": "2024-06-01T10:00:00Z",
        "pushed_at": "2024-06-01T10:00:00Z",
        "homepage": None,
        "size": 1024,
        "stargazers_count": stars,
        "watchers_count": stars,
        "language": language,
        "forks_count": stars // 10,
        "open_issues_count": 3,
        "default_branch": "main",
        "topics": topics,
        "license": {
            "key": "apache-2.0",
            "name": "Apache License 2.0",
            "spdx_id": "Apache-2.0",
            "url": f"{API}/licenses/apache-2.0",
            "node_id": "MDc6TGljZW5zZTI=",
        },
        "visibility": "public",
        "score": 1.0,
    }


def issue(full_name: str, number: int, title: str, state: str, *, pr: bool, labels: list[str]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "url": f"{API}/repos/{full_name}/issues/{number}",
        "repository_url": f"{API}/repos/{full_name}",
        "html_url": f"https://github.com/{full_name}/{'pull' if pr else 'issues'}/{number}",
        "id": number * 1000,
        "node_id": f"I_{number}",
        "number": number,
        "title": title,
        "user": owner("octocat"),
        "labels": [{"id": i, "name": name, "color": "ededed", "default": False} for i, name in enumerate(labels)],
        "state": state,
        "locked": False,
        "comments": 4,
        "created_at": "2024-03-01T08:00:00Z",
        "updated_at": "2024-03-02T08:00:00Z",
        "closed_at": None if state == "open" else "2024-03-03T08:00:00Z",
        "author_association": "CONTRIBUTOR",
        "body": f"Body of {title}",
        "score": 1.0,
    }
    if pr:
        item["pull_request"] = {
            "url": f"{API}/repos/{full_name}/pulls/{number}",
            "html_url": f"https://github.com/{full_name}/pull/{number}",
            "diff_url": f"https://github.com/{full_name}/pull/{number}.diff",
            "patch_url": f"https://github.com/{full_name}/pull/{number}.patch",
            "merged_at": None,
        }
    return item


REPOS = [
    repo("huggingface/peft", "Parameter-Efficient Fine-Tuning", 15000, "Python", ["lora", "fine-tuning"]),
    repo("microsoft/LoRA", "Code for loralib, an implementation of LoRA", 10000, "Python", ["lora"]),
    repo("rust-lang/rust", "Empowering everyone to build reliable software", 90000, "Rust", []),
]
CODE = [
    {
        "name": "lora.py",
        "path": "src/peft/tuners/lora.py",
        "sha": "d3adb33fd3adb33fd3adb33fd3adb33fd3adb33f",
        "url": f"{API}/repositories/1/contents/src/peft/tuners/lora.py?ref=abc",
        "git_url": f"{API}/repositories/1/git/blobs/d3adb33f",
        "html_url": "https://github.com/huggingface/peft/blob/abc/src/peft/tuners/lora.py",
        "repository": {
            k: REPOS[0][k]
            for k in (
                "id",
                "node_id",
                "name",
                "full_name",
                "private",
                "owner",
                "html_url",
                "description",
                "fork",
                "url",
            )
        },
        "score": 1.0,
    }
]
ISSUES = [
    issue("huggingface/peft", 101, "LoRA merge produces NaN", "open", pr=False, labels=["bug"]),
    issue("huggingface/peft", 102, "Add DoRA support", "closed", pr=True, labels=["enhancement"]),
]
USERS = [
    {**owner("octocat"), "avatar_url": "https://avatars.githubusercontent.com/u/583231", "score": 1.0},
    {
        **owner("huggingface", "Organization"),
        "avatar_url": "https://avatars.githubusercontent.com/u/25720743",
        "score": 1.0,
    },
]
READMES = {"huggingface/peft": "# PEFT\n\nParameter-Efficient Fine-Tuning methods.\n"}


def _matches(text: str, terms: list[str]) -> bool:
    return all(t.lower() in text.lower() for t in terms)


class FakeGitHub(FakeServer):
    """``code_needs_token`` mirrors github.com, where code search refuses anonymous callers."""

    def __init__(self, *, code_needs_token: bool = True) -> None:
        super().__init__()
        self.code_needs_token = code_needs_token

    def route(self, request: Request) -> Response:
        match = re.fullmatch(r"/search/(repositories|code|issues|users)", request.path)
        if match:
            return self._search(match[1], request)
        match = re.fullmatch(r"/repos/([^/]+/[^/]+)/readme", request.path)
        if match:
            text = READMES.get(match[1])
            if text is None:
                return json_response(
                    {
                        "message": "Not Found",
                        "documentation_url": f"{DOCS}/repos/contents#get-a-repository-readme",
                        "status": "404",
                    },
                    404,
                )
            return json_response(
                {
                    "type": "file",
                    "encoding": "base64",
                    "size": len(text),
                    "name": "README.md",
                    "path": "README.md",
                    # GitHub wraps the base64 text at 60 columns; decoders must cope with the newlines.
                    "content": base64.encodebytes(text.encode()).decode(),
                    "sha": "3d21ec53a331a6f037a91c368710b99387d012c1",
                    "url": f"{API}/repos/{match[1]}/contents/README.md?ref=main",
                    "git_url": f"{API}/repos/{match[1]}/git/blobs/3d21ec53",
                    "html_url": f"https://github.com/{match[1]}/blob/main/README.md",
                    "download_url": f"https://raw.githubusercontent.com/{match[1]}/main/README.md",
                    "_links": {"self": f"{API}/repos/{match[1]}/contents/README.md?ref=main"},
                }
            )
        return json_response({"message": "Not Found", "documentation_url": DOCS, "status": "404"}, 404)

    def _search(self, kind: str, request: Request) -> Response:
        q = request.arg("q") or ""
        if not q.strip():
            return json_response(
                {
                    "message": "Validation Failed",
                    "errors": [{"resource": "Search", "field": "q", "code": "missing"}],
                    "documentation_url": f"{DOCS}/search/search",
                    "status": "422",
                },
                422,
            )
        if kind == "code" and self.code_needs_token and "authorization" not in request.headers:
            return json_response(
                {
                    "message": "Requires authentication",
                    "documentation_url": f"{DOCS}/search/search#search-code",
                    "status": "401",
                },
                401,
            )
        terms = [t for t in q.split() if ":" not in t]
        qualifiers = dict(t.split(":", 1) for t in q.split() if ":" in t)
        if kind == "issues" and qualifiers.get("is") not in ("issue", "pr"):
            return json_response(
                {
                    "message": "Query must include 'is:issue' or 'is:pull-request'",
                    "documentation_url": f"{DOCS}/search/search#search-issues-and-pull-requests",
                    "status": "422",
                },
                422,
            )
        if kind == "repositories":
            items = [
                r
                for r in REPOS
                if _matches(f"{r['full_name']} {r['description']} {' '.join(r['topics'])}", terms)
                and qualifiers.get("language", r["language"]).lower() == r["language"].lower()
            ]
            if request.arg("sort") == "stars":
                items.sort(key=lambda r: r["stargazers_count"], reverse=request.arg("order", "desc") == "desc")
        elif kind == "code":
            items = [c for c in CODE if _matches(f"{c['path']} {c['repository']['full_name']}", terms)]
        elif kind == "issues":
            want_pr = qualifiers["is"] == "pr"
            items = [
                i for i in ISSUES if ("pull_request" in i) == want_pr and _matches(f"{i['title']} {i['body']}", terms)
            ]
        else:
            items = [u for u in USERS if _matches(u["login"], terms)]
        per_page, page = int(request.arg("per_page") or 30), int(request.arg("page") or 1)
        return json_response(
            {
                "total_count": len(items),
                "incomplete_results": False,
                "items": items[(page - 1) * per_page : page * per_page],
            }
        )
