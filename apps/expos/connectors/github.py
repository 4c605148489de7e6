"""GitHub REST v3 search and README look-ups (api.github.com or a GitHub Enterprise ``/api/v3``)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from .base import (
    JSON,
    Connector,
    ConnectorError,
    HttpClient,
    http_client,
    integer_schema,
    object_schema,
    tool,
    truncate,
)

NULLABLE_STR: JSON = {"type": ["string", "null"]}
QUERY_ARG: JSON = {
    "type": "string",
    "minLength": 1,
    "maxLength": 256,
    "description": "GitHub search syntax, qualifiers allowed (e.g. 'lora language:python stars:>100').",
}
PAGING: JSON = {
    "per_page": integer_schema(10, 1, 100, "Results per page."),
    "page": integer_schema(1, 1, 10, "Page number (GitHub serves at most 1000 results)."),
}


def _search_in(sorts: list[str] | None = None) -> JSON:
    properties: JSON = {"query": QUERY_ARG, **PAGING}
    if sorts:
        properties["sort"] = {"type": "string", "enum": sorts}
        properties["order"] = {"type": "string", "enum": ["asc", "desc"], "default": "desc"}
    return object_schema(properties, ["query"])


def _search_out(item: JSON) -> JSON:
    return {
        "type": "object",
        "required": ["total_count", "incomplete_results", "items"],
        "properties": {
            "total_count": {"type": "integer"},
            "incomplete_results": {"type": "boolean"},
            "items": {"type": "array", "items": item},
        },
    }


REPO_ITEM: JSON = {
    "type": "object",
    "required": ["full_name", "html_url"],
    "properties": {
        "full_name": {"type": "string"},
        "html_url": {"type": "string"},
        "description": NULLABLE_STR,
        "language": NULLABLE_STR,
        "stars": {"type": "integer"},
        "forks": {"type": "integer"},
        "topics": {"type": "array", "items": {"type": "string"}},
        "license": NULLABLE_STR,
        "default_branch": NULLABLE_STR,
        "updated_at": NULLABLE_STR,
    },
}
CODE_ITEM: JSON = {
    "type": "object",
    "required": ["repository", "path", "html_url"],
    "properties": {
        "repository": {"type": "string"},
        "path": {"type": "string"},
        "name": {"type": "string"},
        "sha": {"type": "string"},
        "html_url": {"type": "string"},
    },
}
ISSUE_ITEM: JSON = {
    "type": "object",
    "required": ["repository", "number", "title", "state", "html_url"],
    "properties": {
        "repository": {"type": "string"},
        "number": {"type": "integer"},
        "title": {"type": "string"},
        "state": {"type": "string"},
        "html_url": {"type": "string"},
        "user": NULLABLE_STR,
        "labels": {"type": "array", "items": {"type": "string"}},
        "comments": {"type": "integer"},
        "created_at": NULLABLE_STR,
        "updated_at": NULLABLE_STR,
        "body": NULLABLE_STR,
    },
}
USER_ITEM: JSON = {
    "type": "object",
    "required": ["login", "html_url"],
    "properties": {"login": {"type": "string"}, "html_url": {"type": "string"}, "type": {"type": "string"}},
}
README_IN = object_schema(
    {
        "owner": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}$"},
        "repo": {"type": "string", "pattern": r"^[A-Za-z0-9._-]{1,100}$"},
        "ref": {"type": "string", "maxLength": 200, "description": "Branch, tag or commit; default branch if absent."},
        "max_chars": integer_schema(20000, 100, 200000, "Cut the README after this many characters."),
    },
    ["owner", "repo"],
)
README_OUT: JSON = {
    "type": "object",
    "required": ["repository", "path", "content", "truncated"],
    "properties": {
        "repository": {"type": "string"},
        "path": {"type": "string"},
        "html_url": NULLABLE_STR,
        "content": {"type": "string"},
        "truncated": {"type": "boolean"},
    },
}
BODY_CHARS = 1000


class GitHubConnector(Connector):
    name = "github"
    service = "api.github.com"
    enable_hint = (
        "set RSI_GITHUB_API_URL=https://api.github.com (and RSI_GITHUB_TOKEN for code search and higher rate limits)"
    )

    def configured(self, tool_name: str) -> bool:
        return bool(self.config.github_api_url)

    def client(self) -> HttpClient:
        # GitHub refuses requests without a User-Agent (http_client always sends one).
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
        return http_client(self.config, self.config.github_api_url, token=self.config.github_token, headers=headers)

    def _search(self, kind: str, args: JSON, query: str | None = None) -> JSON:
        params = {
            "q": query or args["query"],
            "per_page": args["per_page"],
            "page": args["page"],
            "sort": args.get("sort"),
            "order": args.get("order") if args.get("sort") else None,
        }
        body = self.client().get_json(f"/search/{kind}", params)
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            raise ConnectorError("upstream_error", f"/search/{kind} answered without an items list")
        return body

    @staticmethod
    def _page(body: JSON, items: list[JSON]) -> JSON:
        return {
            "total_count": int(body.get("total_count", len(items))),
            "incomplete_results": bool(body.get("incomplete_results", False)),
            "items": items,
        }

    @tool(
        "search_github_search_repositories",
        "Search GitHub repositories; returns names, stars, language and topics.",
        _search_in(["stars", "forks", "help-wanted-issues", "updated"]),
        _search_out(REPO_ITEM),
    )
    def search_repositories(self, args: JSON) -> JSON:
        body = self._search("repositories", args)
        return self._page(body, [_repo(item) for item in body["items"]])

    @tool(
        "search_github_search_code",
        "Search code on GitHub (needs RSI_GITHUB_TOKEN on github.com); returns file paths per repository.",
        _search_in(),
        _search_out(CODE_ITEM),
    )
    def search_code(self, args: JSON) -> JSON:
        body = self._search("code", args)
        items = [
            {
                "repository": item.get("repository", {}).get("full_name", ""),
                "path": item.get("path", ""),
                "name": item.get("name", ""),
                "sha": item.get("sha", ""),
                "html_url": item.get("html_url", ""),
            }
            for item in body["items"]
        ]
        return self._page(body, items)

    @tool(
        "search_github_search_issues",
        "Search GitHub issues (not pull requests); returns titles, states and repositories.",
        _search_in(["comments", "reactions", "created", "updated"]),
        _search_out(ISSUE_ITEM),
    )
    def search_issues(self, args: JSON) -> JSON:
        # GitHub's issue search covers PRs too; the qualifier keeps the two tools apart.
        body = self._search("issues", args, f"{args['query']} is:issue")
        return self._page(body, [_issue(item) for item in body["items"]])

    @tool(
        "search_github_search_pull_requests",
        "Search GitHub pull requests; returns titles, states and repositories.",
        _search_in(["comments", "reactions", "created", "updated"]),
        _search_out(ISSUE_ITEM),
    )
    def search_pull_requests(self, args: JSON) -> JSON:
        body = self._search("issues", args, f"{args['query']} is:pr")
        return self._page(body, [_issue(item) for item in body["items"]])

    @tool(
        "search_github_search_users",
        "Search GitHub users and organisations.",
        _search_in(["followers", "repositories", "joined"]),
        _search_out(USER_ITEM),
    )
    def search_users(self, args: JSON) -> JSON:
        body = self._search("users", args)
        items = [
            {"login": item.get("login", ""), "html_url": item.get("html_url", ""), "type": item.get("type", "User")}
            for item in body["items"]
        ]
        return self._page(body, items)

    @tool(
        "search_github_get_repository_readme",
        "Read a repository's README as text.",
        README_IN,
        README_OUT,
    )
    def get_repository_readme(self, args: JSON) -> JSON:
        repository = f"{args['owner']}/{args['repo']}"
        body = self.client().get_json(f"/repos/{repository}/readme", {"ref": args.get("ref")})
        if not isinstance(body, dict) or body.get("encoding") != "base64" or "content" not in body:
            raise ConnectorError("upstream_error", f"README of {repository} came without base64 content")
        try:
            text = base64.b64decode(body["content"]).decode("utf-8", errors="replace")
        except (binascii.Error, ValueError):
            raise ConnectorError("upstream_error", f"README of {repository} is not valid base64") from None
        content, cut = truncate(text, args["max_chars"])
        return {
            "repository": repository,
            "path": body.get("path", "README.md"),
            "html_url": body.get("html_url"),
            "content": content,
            "truncated": cut,
        }


def _repo(item: dict[str, Any]) -> JSON:
    license_info = item.get("license") or {}
    return {
        "full_name": item.get("full_name", ""),
        "html_url": item.get("html_url", ""),
        "description": item.get("description"),
        "language": item.get("language"),
        "stars": int(item.get("stargazers_count", 0)),
        "forks": int(item.get("forks_count", 0)),
        "topics": list(item.get("topics", [])),
        "license": license_info.get("spdx_id") or license_info.get("name"),
        "default_branch": item.get("default_branch"),
        "updated_at": item.get("updated_at"),
    }


def _issue(item: dict[str, Any]) -> JSON:
    # repository_url is ".../repos/{owner}/{repo}"; the search item carries no other repository name.
    repository = "/".join(str(item.get("repository_url", "")).rstrip("/").split("/")[-2:])
    body, _ = truncate(item.get("body") or "", BODY_CHARS)
    return {
        "repository": repository,
        "number": int(item.get("number", 0)),
        "title": item.get("title", ""),
        "state": item.get("state", ""),
        "html_url": item.get("html_url", ""),
        "user": (item.get("user") or {}).get("login"),
        "labels": [label.get("name", "") for label in item.get("labels", []) if isinstance(label, dict)],
        "comments": int(item.get("comments", 0)),
        "created_at": item.get("created_at"),
        "updated_at": item.get("updated_at"),
        "body": body or None,
    }
