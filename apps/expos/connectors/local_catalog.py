"""The ``hf_*`` contract served offline from a minibench-style catalog folder.

Layout, one folder per dataset::

    <catalog>/<dataset>/meta.json   {"name", "task", "description", "quality", "rows", "format",
                                     "files": ["data.jsonl"], "license", "tags"}
    <catalog>/<dataset>/README.md   dataset card with YAML front matter
    <catalog>/<dataset>/data.jsonl

Each dataset has one configuration, ``default``, and one split, ``train``. ``quality`` and
``format`` are the benchmark's own labels (useful, noisy, honeypot, ...): they are what the agents
are meant to find out, so no tool ever returns them and ``meta.json`` is never copied out.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from apps.core.hashing import sha256_file

from .base import JSON, ConnectorError
from .hf import DatasetsContract, matches_patterns, split_front_matter

CONFIG = "default"
SPLIT = "train"


class LocalCatalogConnector(DatasetsContract):
    name = "hf_local_catalog"
    service = "local catalog (RSI_LOCAL_CATALOG_DIR)"
    provider = "local"

    def configured(self, tool_name: str) -> bool:
        return self.config.hf_provider == "local" and bool(self.config.local_catalog_dir)

    @property
    def root(self) -> Path:
        root = Path(self.config.local_catalog_dir or "")
        if not root.is_dir():
            raise ConnectorError("not_configured", f"RSI_LOCAL_CATALOG_DIR={root} is not a directory")
        return root

    # ------------------------------------------------------------ catalog reading

    def _meta(self, dataset: str) -> JSON:
        # Catalog names are single folder names; an 'owner/name' id cannot name one.
        if "/" in dataset:
            # A well-formed id that names nothing here is not_found (404); a path trick is a bad request.
            code = "bad_request" if ".." in dataset.split("/") else "not_found"
            raise ConnectorError(code, f"no dataset {dataset!r} in the local catalog")
        path = self.root / dataset / "meta.json"
        if not path.is_file():
            raise ConnectorError("not_found", f"no dataset {dataset!r} in the local catalog")
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConnectorError("upstream_error", f"{dataset}/meta.json is not JSON: {exc}") from None
        if not isinstance(meta, dict):
            raise ConnectorError("upstream_error", f"{dataset}/meta.json is not an object")
        return meta

    def _files(self, dataset: str, meta: JSON) -> list[Path]:
        """README.md plus the data files meta.json lists, each checked to stay inside the dataset folder."""
        folder = (self.root / dataset).resolve()
        names = ["README.md", *[str(f) for f in meta.get("files", [])]]
        paths = []
        for name in dict.fromkeys(names):
            path = (folder / name).resolve()
            if folder not in path.parents or not path.is_file():
                continue
            paths.append(path)
        return paths

    def _summary(self, dataset: str, meta: JSON) -> JSON:
        tags = [str(t) for t in meta.get("tags", [])]
        if meta.get("task") and f"task:{meta['task']}" not in tags:
            tags.append(f"task:{meta['task']}")
        return {
            "id": dataset,
            "author": None,
            "description": meta.get("description"),
            "tags": tags,
            "downloads": None,
            "likes": None,
            "last_modified": None,
        }

    def _datasets(self) -> list[str]:
        return sorted(p.parent.name for p in self.root.glob("*/meta.json"))

    # ------------------------------------------------------------ provider hooks

    def _search(self, args: JSON) -> list[JSON]:
        terms = [t for t in args["query"].lower().split() if t]
        scored = []
        for dataset in self._datasets():
            try:
                meta = self._meta(dataset)
            except ConnectorError:
                continue  # one broken entry must not hide the rest of the catalog
            summary = self._summary(dataset, meta)
            haystack = " ".join(
                [dataset, str(meta.get("name", "")), str(summary["description"] or ""), *summary["tags"]]
            )
            score = sum(term in haystack.lower() for term in terms)
            if terms and score == 0:
                continue
            scored.append((-score, dataset, summary))
        scored.sort(key=lambda item: (item[0], item[1]))
        return [summary for _, _, summary in scored[: args["limit"]]]

    def _inspect(self, dataset: str, revision: str | None) -> JSON:
        meta = self._meta(dataset)
        files = self._files(dataset, meta)
        # A content hash stands in for the Hub's commit sha: same files, same revision.
        digest = hashlib.sha256()
        for path in files:
            digest.update(f"{path.name}:{sha256_file(path)}\n".encode())
        readme = self.root / dataset / "README.md"
        card_data = split_front_matter(readme.read_text(encoding="utf-8"))[0] if readme.is_file() else None
        return {
            **self._summary(dataset, meta),
            "sha": digest.hexdigest(),
            "license": meta.get("license"),
            "card_data": card_data,
            "gated": False,
            "private": False,
            "files": [{"path": p.name, "size": p.stat().st_size} for p in files],
        }

    def _configs(self, dataset: str) -> list[str]:
        self._meta(dataset)
        return [CONFIG]

    def _splits(self, dataset: str, config: str | None) -> list[JSON]:
        meta = self._meta(dataset)
        if config not in (None, CONFIG):
            raise ConnectorError("bad_request", f"{dataset} has only the {CONFIG!r} configuration")
        rows = meta.get("rows")
        return [{"config": CONFIG, "split": SPLIT, "num_rows": rows if isinstance(rows, int) else None}]

    def _readme(self, dataset: str, revision: str | None) -> str:
        self._meta(dataset)
        path = self.root / dataset / "README.md"
        if not path.is_file():
            raise ConnectorError("bad_request", f"{dataset} has no README.md")
        return path.read_text(encoding="utf-8", errors="replace")

    def _sample(self, dataset: str, config: str | None, split: str, n: int) -> JSON:
        meta = self._meta(dataset)
        if config not in (None, CONFIG) or split != SPLIT:
            raise ConnectorError("bad_request", f"{dataset} has only {CONFIG}/{SPLIT}")
        data = [p for p in self._files(dataset, meta) if p.suffix == ".jsonl"]
        if not data:
            raise ConnectorError("bad_request", f"{dataset} lists no .jsonl data file")
        rows: list[JSON] = []
        with data[0].open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if len(rows) > n:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = None
                # Show malformed lines as they are: spotting a broken dataset is the agent's job.
                rows.append(row if isinstance(row, dict) else {"_raw": line.rstrip("\n")[:2000]})
        columns: dict[str, str] = {}
        for row in rows[:n]:
            for key, value in row.items():
                columns.setdefault(key, _dtype(value))
        return {
            "config": CONFIG,
            "split": SPLIT,
            "features": [{"name": k, "dtype": v} for k, v in columns.items()],
            "rows": rows[:n],
            "truncated": len(rows) > n,
        }

    def _download(
        self, dataset: str, revision: str | None, patterns: list[str] | None, target: Path
    ) -> tuple[str | None, list[Path]]:
        meta = self._meta(dataset)
        files = [p for p in self._files(dataset, meta) if matches_patterns(p.name, patterns)]
        if not files:
            raise ConnectorError("bad_request", f"no file of {dataset} matches {patterns}")
        total = sum(p.stat().st_size for p in files)
        if total > self.config.max_download_bytes:
            raise ConnectorError("bad_request", f"{dataset} is {total} bytes, over the download limit")
        target.mkdir(parents=True, exist_ok=True)
        copied = []
        for path in files:
            shutil.copyfile(path, target / path.name)
            copied.append(target / path.name)
        return self._inspect(dataset, None)["sha"], copied


def _dtype(value: object) -> str:
    """Column types named as the dataset viewer names them."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "struct"
    return "null"
