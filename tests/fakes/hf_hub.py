"""The Hugging Face Hub API and the dataset viewer (datasets-server), for a few in-memory datasets.

Hub (what huggingface_hub's HfApi and hf_hub_download call):
  GET  /api/datasets?search=&author=&limit=      -> [ {id, author, sha, lastModified, tags, ...} ]
  GET  /api/datasets/{id}[/revision/{rev}]       -> {id, sha, cardData, siblings: [{rfilename, size, blobId}], ...}
  HEAD/GET /datasets/{id}/resolve/{rev}/{path}   -> file bytes with ETag and X-Repo-Commit
Dataset viewer (https://huggingface.co/docs/dataset-viewer):
  GET  /splits?dataset=[&config=]                -> {splits: [{dataset, config, split}], pending, failed}
  GET  /first-rows?dataset=&config=&split=       -> {dataset, config, split, features, rows, truncated}
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from . import FakeServer, Request, Response, json_response

NOT_FOUND = {"error": "Repository not found"}
VIEWER_NOT_FOUND = {
    "error": "The dataset does not exist, or is not accessible without authentication (private or gated). "
    "Please check the spelling of the dataset name or retry with authentication."
}


@dataclass
class FakeDataset:
    id: str
    description: str
    tags: list[str]
    card_yaml: str
    card_body: str
    # config -> split -> rows
    rows: dict[str, dict[str, list[dict[str, Any]]]]
    downloads: int = 0
    likes: int = 0
    sha: str = ""
    extra_files: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sha = self.sha or hashlib.sha1(self.id.encode()).hexdigest()

    @property
    def readme(self) -> bytes:
        return f"---\n{self.card_yaml.strip()}\n---\n\n{self.card_body}".encode()

    @property
    def files(self) -> dict[str, bytes]:
        """Repository files: the card and one JSON Lines file per (config, split), as a Hub repo lays them out."""
        files = {"README.md": self.readme, ".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"}
        for config, splits in self.rows.items():
            for split, rows in splits.items():
                prefix = "data" if config == "default" else config
                files[f"{prefix}/{split}.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows).encode()
        return {**files, **self.extra_files}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub(FakeServer):
    def __init__(self, datasets: list[FakeDataset]) -> None:
        super().__init__()
        self.datasets = {d.id: d for d in datasets}

    def _item(self, d: FakeDataset, *, full: bool, blobs: bool = False) -> dict[str, Any]:
        author = d.id.split("/")[0] if "/" in d.id else None
        item: dict[str, Any] = {
            "_id": hashlib.md5(d.id.encode()).hexdigest()[:24],
            "id": d.id,
            "author": author,
            "sha": d.sha,
            "lastModified": "2024-05-01T12:00:00.000Z",
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": d.downloads,
            "likes": d.likes,
            "tags": d.tags,
            "createdAt": "2023-01-15T09:30:00.000Z",
            "trendingScore": 0,
            "description": d.description,
            "key": "",
        }
        if full:
            item["cardData"] = yaml.safe_load(d.card_yaml)
            item["siblings"] = [
                {"rfilename": path, **({"size": len(data), "blobId": git_blob_id(data)} if blobs else {})}
                for path, data in sorted(d.files.items())
            ]
            item["usedStorage"] = sum(len(v) for v in d.files.values())
        return item

    def route(self, request: Request) -> Response:
        path = request.path
        if request.method == "GET" and path == "/api/datasets":
            terms = [t.lower() for t in request.query.get("search", [])]
            author = request.arg("author")
            limit = int(request.arg("limit") or 1000)
            found = [
                self._item(d, full=False)
                for d in self.datasets.values()
                if all(t in d.id.lower() for t in terms) and (author is None or d.id.startswith(f"{author}/"))
            ]
            return json_response(found[:limit])
        match = re.fullmatch(r"/api/datasets/(?P<id>[^/]+(?:/[^/]+)?)(?:/revision/(?P<rev>[^/]+))?", path)
        if match and request.method == "GET":
            d = self.datasets.get(match["id"])
            if d is None or match["rev"] not in (None, "main", d.sha):
                return json_response(NOT_FOUND, 404, {"X-Error-Code": "RepoNotFound"})
            return json_response(self._item(d, full=True, blobs=request.arg("blobs") == "true"))
        match = re.fullmatch(r"/datasets/(?P<id>[^/]+/[^/]+|[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)", path)
        if match:
            d = self.datasets.get(match["id"])
            if d is None:
                return json_response(NOT_FOUND, 404, {"X-Error-Code": "RepoNotFound"})
            data = d.files.get(match["file"])
            if data is None or match["rev"] not in ("main", d.sha):
                return json_response({"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound"})
            return Response(
                200,
                data,
                {
                    "Content-Type": "text/plain; charset=utf-8",
                    "ETag": f'"{git_blob_id(data)}"',
                    "X-Repo-Commit": d.sha,
                    "Accept-Ranges": "bytes",
                },
            )
        return json_response({"error": "Sorry, we can't find the page you are looking for."}, 404)


def _feature_type(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"dtype": "bool", "_type": "Value"}
    if isinstance(value, int):
        return {"dtype": "int64", "_type": "Value"}
    if isinstance(value, float):
        return {"dtype": "float64", "_type": "Value"}
    if isinstance(value, list):
        return {"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"}
    return {"dtype": "string", "_type": "Value"}


class FakeDatasetsServer(FakeServer):
    def __init__(self, datasets: list[FakeDataset]) -> None:
        super().__init__()
        self.datasets = {d.id: d for d in datasets}

    def route(self, request: Request) -> Response:
        d = self.datasets.get(request.arg("dataset") or "")
        if request.path not in ("/splits", "/first-rows"):
            return json_response({"error": "Not Found"}, 404)
        if d is None:
            return json_response(VIEWER_NOT_FOUND, 404, {"X-Error-Code": "DatasetNotFoundError"})
        config = request.arg("config")
        if request.path == "/splits":
            splits = [
                {"dataset": d.id, "config": c, "split": s}
                for c, by_split in d.rows.items()
                if config in (None, c)
                for s in by_split
            ]
            if not splits:
                return json_response({"error": "Not found."}, 404, {"X-Error-Code": "ConfigNamesError"})
            return json_response({"splits": splits, "pending": [], "failed": []})
        rows = d.rows.get(config or "", {}).get(request.arg("split") or "")
        if rows is None:
            return json_response({"error": "Not found."}, 404, {"X-Error-Code": "ResponseNotFound"})
        first = rows[:100]  # the viewer's first-rows page holds at most 100 rows
        names = list(dict.fromkeys(k for r in first for k in r))
        return json_response(
            {
                "dataset": d.id,
                "config": config,
                "split": request.arg("split"),
                "features": [
                    {"feature_idx": i, "name": n, "type": _feature_type(next(r[n] for r in first if n in r))}
                    for i, n in enumerate(names)
                ],
                "rows": [{"row_idx": i, "row": r, "truncated_cells": []} for i, r in enumerate(first)],
                "truncated": len(rows) > len(first),
            }
        )
