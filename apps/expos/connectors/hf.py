"""The eight ``hf_*`` tools: one contract, two providers (the Hub here, the local catalog next door).

``DatasetsContract`` holds what both providers share: the schemas, the workspace rules and
``hf_materialize_dataset``. ``HubConnector`` reaches a Hub endpoint with huggingface_hub and a
dataset-viewer server (``/splits``, ``/first-rows``) with httpx.

Downloads land only in a caller-given workspace, never in the datapool: found data enters
training only when someone registers the resulting file with ``worker_add_data``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import socket
import string
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from apps.core.hashing import sha256_file

from .base import (
    JSON,
    Connector,
    ConnectorError,
    HttpClient,
    first_line,
    http_client,
    integer_schema,
    object_schema,
    tool,
    truncate,
    unreachable,
)

# huggingface_hub 1.x+ speaks HTTP through its own fork, httpx2. Where that fork is absent, no
# Hub call can raise its errors, so there is nothing more to catch (nothing is let through).
try:
    import httpx2

    _HTTPX2_ERRORS: tuple[type[BaseException], ...] = (httpx2.TransportError,)
except ImportError:
    _HTTPX2_ERRORS = ()

HUB_DEFAULT_ENDPOINT = "https://huggingface.co"
VIEWER_DEFAULT_URL = "https://datasets-server.huggingface.co"
VIEWER_TOOLS = frozenset({"hf_dataset_configs", "hf_dataset_splits", "hf_dataset_sample"})
DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}

# A part: letters, digits, '_', '-' and single dots ('..' would be a path traversal).
_ID_PART = r"[A-Za-z0-9][\w-]*(?:\.[\w-]+)*\.?"
_ID_RE = re.compile(rf"^{_ID_PART}(/{_ID_PART})?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][\w.-]{0,99}$")

# ---------------------------------------------------------------- schemas, shared by both providers

NULLABLE_STR: JSON = {"type": ["string", "null"]}
NULLABLE_INT: JSON = {"type": ["integer", "null"]}
DATASET_ARG: JSON = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "pattern": _ID_RE.pattern,
    "description": "Dataset id: 'owner/name' on the Hub, or the catalog name for the local provider.",
}
WORKSPACE_ARG: JSON = {
    "type": "string",
    "minLength": 1,
    "description": "Absolute path of the calling Worker's workspace (filled in by ExpOS).",
}
PROVIDER_OUT: JSON = {"type": "string", "enum": ["hub", "local"]}
SUMMARY_OUT: JSON = {
    "type": "object",
    "required": ["id", "tags"],
    "properties": {
        "id": {"type": "string"},
        "author": NULLABLE_STR,
        "description": NULLABLE_STR,
        "tags": {"type": "array", "items": {"type": "string"}},
        "downloads": NULLABLE_INT,
        "likes": NULLABLE_INT,
        "last_modified": NULLABLE_STR,
    },
}
FILE_OUT: JSON = {
    "type": "object",
    "required": ["path", "size"],
    "properties": {"path": {"type": "string"}, "size": NULLABLE_INT, "sha256": {"type": "string"}},
}


def _out(properties: JSON, required: list[str]) -> JSON:
    return {
        "type": "object",
        "properties": {"provider": PROVIDER_OUT, **properties},
        "required": ["provider", *required],
    }


SEARCH_IN = object_schema(
    {
        "query": {"type": "string", "maxLength": 200, "description": "Free-text search over names and descriptions."},
        "author": {"type": "string", "maxLength": 100},
        "limit": integer_schema(20, 1, 100, "Most datasets to return."),
    },
    ["query"],
)
SEARCH_OUT = _out({"query": {"type": "string"}, "datasets": {"type": "array", "items": SUMMARY_OUT}}, ["datasets"])
INSPECT_IN = object_schema({"dataset": DATASET_ARG, "revision": {"type": "string", "maxLength": 100}}, ["dataset"])
INSPECT_OUT = _out(
    {
        **SUMMARY_OUT["properties"],
        "sha": NULLABLE_STR,
        "license": {"type": ["string", "array", "null"]},
        "card_data": {"type": ["object", "null"]},
        "gated": {"type": ["boolean", "string", "null"]},
        "private": {"type": ["boolean", "null"]},
        "files": {"type": "array", "items": FILE_OUT},
    },
    ["id", "sha", "files", "card_data"],
)
CONFIGS_IN = object_schema({"dataset": DATASET_ARG}, ["dataset"])
CONFIGS_OUT = _out(
    {"dataset": {"type": "string"}, "configs": {"type": "array", "items": {"type": "string"}}}, ["configs"]
)
SPLITS_IN = object_schema({"dataset": DATASET_ARG, "config": {"type": "string", "maxLength": 200}}, ["dataset"])
SPLITS_OUT = _out(
    {
        "dataset": {"type": "string"},
        "splits": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["config", "split"],
                "properties": {"config": {"type": "string"}, "split": {"type": "string"}, "num_rows": NULLABLE_INT},
            },
        },
    },
    ["splits"],
)
README_IN = object_schema(
    {
        "dataset": DATASET_ARG,
        "revision": {"type": "string", "maxLength": 100},
        "max_chars": integer_schema(20000, 100, 200000, "Cut the card text after this many characters."),
    },
    ["dataset"],
)
README_OUT = _out(
    {
        "dataset": {"type": "string"},
        "readme": {"type": "string"},
        "card_data": {"type": ["object", "null"]},
        "truncated": {"type": "boolean"},
    },
    ["readme", "card_data", "truncated"],
)
SAMPLE_IN = object_schema(
    {
        "dataset": DATASET_ARG,
        "config": {"type": "string", "maxLength": 200},
        "split": {"type": "string", "maxLength": 100, "default": "train"},
        "n": integer_schema(5, 1, 100, "Rows to return from the start of the split."),
    },
    ["dataset"],
)
SAMPLE_OUT = _out(
    {
        "dataset": {"type": "string"},
        "config": {"type": "string"},
        "split": {"type": "string"},
        "features": {
            "type": "array",
            "items": {"type": "object", "properties": {"name": {"type": "string"}, "dtype": {"type": "string"}}},
        },
        "rows": {"type": "array", "items": {"type": "object"}},
        "truncated": {"type": "boolean"},
    },
    ["config", "split", "features", "rows"],
)
DOWNLOAD_IN = object_schema(
    {
        "dataset": DATASET_ARG,
        "workspace": WORKSPACE_ARG,
        "revision": {"type": "string", "maxLength": 100},
        "allow_patterns": {
            "type": "array",
            "items": {"type": "string", "maxLength": 200},
            "maxItems": 20,
            "description": "Glob patterns of repository files to fetch (default: all but .gitattributes).",
        },
    },
    ["dataset", "workspace"],
)
DOWNLOAD_OUT = _out(
    {
        "dataset": {"type": "string"},
        "revision": NULLABLE_STR,
        "path": {"type": "string", "description": "Download folder, relative to the workspace."},
        "files": {"type": "array", "items": FILE_OUT},
        "total_bytes": {"type": "integer"},
    },
    ["path", "files", "total_bytes"],
)
FIELD_ARG: JSON = {
    "type": "string",
    "minLength": 1,
    "maxLength": 2000,
    "description": "A column name, or a template with {column} placeholders, e.g. 'Q: {question}\\nA:'.",
}
MATERIALIZE_IN = object_schema(
    {
        "dataset": DATASET_ARG,
        "workspace": WORKSPACE_ARG,
        "source": {
            "type": "string",
            "maxLength": 500,
            "description": "Data file or folder relative to the workspace; default: the dataset's download folder.",
        },
        "config": {"type": "string", "maxLength": 200},
        "split": {"type": "string", "maxLength": 100, "default": "train"},
        "prompt": FIELD_ARG,
        "completion": FIELD_ARG,
        "output": {"type": "string", "pattern": _NAME_RE.pattern, "description": "File name without .jsonl."},
        "max_rows": integer_schema(100000, 1, 10_000_000, "Stop after this many written rows."),
    },
    ["dataset", "workspace", "prompt", "completion"],
)
MATERIALIZE_OUT = {
    "type": "object",
    "required": ["path", "rows", "skipped", "sha256", "columns"],
    "properties": {
        "path": {
            "type": "string",
            "description": "JSONL file relative to the workspace; register it with worker_add_data.",
        },
        "rows": {"type": "integer"},
        "skipped": {"type": "integer"},
        "sha256": {"type": "string"},
        "columns": {"type": "array", "items": {"type": "string"}},
        "split": {"type": "string"},
    },
}


# ---------------------------------------------------------------- the shared contract


def check_dataset_id(dataset: str) -> str:
    # The schema pattern already holds (it has no '..'); checked again for callers other than the view.
    if not _ID_RE.match(dataset):
        raise ConnectorError("bad_request", f"invalid dataset id {dataset!r}")
    return dataset


def download_dirname(dataset: str) -> str:
    return "downloads/" + dataset.replace("/", "__")


def matches_patterns(path: str, patterns: list[str] | None) -> bool:
    """huggingface_hub's allow_patterns rule: fnmatch, where '*' also crosses '/'."""
    return not patterns or any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


NAME_MAX = 255  # bytes in one path component (Linux)


class DatasetsContract(Connector):
    """What both providers share; subclasses implement the seven look-ups and downloads."""

    enable_hint = (
        "set RSI_HF_PROVIDER=local with RSI_LOCAL_CATALOG_DIR=<catalog folder>, or RSI_HF_PROVIDER=hub "
        "with RSI_HF_ENDPOINT=https://huggingface.co (configs/splits/sample also need "
        "RSI_HF_DATASETS_SERVER_URL unless the endpoint is huggingface.co)"
    )
    provider: str

    # ------------------------------------------------------------ workspace rules

    def workspace(self, raw: str) -> Path:
        path = Path(raw)
        if not path.is_absolute():
            raise ConnectorError("bad_request", f"workspace must be an absolute path, got {raw!r}")
        path = path.resolve()
        if not path.is_dir():
            raise ConnectorError("bad_request", f"workspace {raw!r} is not an existing directory")
        root = self.config.workspace_root
        if root and not _within(path, Path(root).resolve()):
            raise ConnectorError("bad_request", f"workspace {raw!r} is outside the workspace root")
        pool = self.config.datapool_root
        if pool and _within(path, Path(pool).resolve()):
            raise ConnectorError("bad_request", "downloads never go into the datapool; use worker_add_data")
        return path

    @staticmethod
    def inside(workspace: Path, relative: str, *, existing: bool = False) -> Path:
        # A component no file system can hold (over NAME_MAX) would fail as OSError in resolve/exists.
        # Where the path must already exist, such a name is a missing file (404), like any other.
        if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in Path(relative).parts):
            told = f"a part of {relative[:80]!r}... is over {NAME_MAX} bytes"
            if existing:
                raise ConnectorError("not_found", f"{told}, so it does not exist")
            raise ConnectorError("bad_request", told)
        target = (workspace / relative).resolve()
        if not _within(target, workspace):
            raise ConnectorError("bad_request", f"{relative!r} leaves the workspace")
        return target

    @staticmethod
    def describe_files(workspace: Path, files: list[Path]) -> list[JSON]:
        return [
            {"path": f.relative_to(workspace).as_posix(), "size": f.stat().st_size, "sha256": sha256_file(f)}
            for f in sorted(files)
        ]

    # ------------------------------------------------------------ tools (provider-specific parts abstract)

    @tool(
        "hf_search_datasets", "Search datasets by free text; returns ids, tags and popularity.", SEARCH_IN, SEARCH_OUT
    )
    def search_datasets(self, args: JSON) -> JSON:
        return {"provider": self.provider, "query": args["query"], "datasets": self._search(args)}

    @tool(
        "hf_inspect_dataset", "Show one dataset's metadata, license, card data and file list.", INSPECT_IN, INSPECT_OUT
    )
    def inspect_dataset(self, args: JSON) -> JSON:
        return {"provider": self.provider, **self._inspect(check_dataset_id(args["dataset"]), args.get("revision"))}

    @tool("hf_dataset_configs", "List a dataset's configurations (subsets).", CONFIGS_IN, CONFIGS_OUT)
    def dataset_configs(self, args: JSON) -> JSON:
        dataset = check_dataset_id(args["dataset"])
        return {"provider": self.provider, "dataset": dataset, "configs": self._configs(dataset)}

    @tool("hf_dataset_splits", "List a dataset's splits, optionally for one configuration.", SPLITS_IN, SPLITS_OUT)
    def dataset_splits(self, args: JSON) -> JSON:
        dataset = check_dataset_id(args["dataset"])
        return {"provider": self.provider, "dataset": dataset, "splits": self._splits(dataset, args.get("config"))}

    @tool("hf_dataset_readme", "Read a dataset card (README.md) and its YAML metadata.", README_IN, README_OUT)
    def dataset_readme(self, args: JSON) -> JSON:
        dataset = check_dataset_id(args["dataset"])
        text = self._readme(dataset, args.get("revision"))
        card_data, _ = split_front_matter(text)  # the card is returned whole; front matter parsed too
        readme, cut = truncate(text, args["max_chars"])
        return {
            "provider": self.provider,
            "dataset": dataset,
            "readme": readme,
            "card_data": card_data,
            "truncated": cut,
        }

    @tool("hf_dataset_sample", "Return the first rows of a split with its column types.", SAMPLE_IN, SAMPLE_OUT)
    def dataset_sample(self, args: JSON) -> JSON:
        dataset = check_dataset_id(args["dataset"])
        sample = self._sample(dataset, args.get("config"), args["split"], args["n"])
        return {"provider": self.provider, "dataset": dataset, **sample}

    @tool(
        "hf_download_dataset",
        "Download a dataset's files into the caller's workspace (not the datapool).",
        DOWNLOAD_IN,
        DOWNLOAD_OUT,
    )
    def download_dataset(self, args: JSON) -> JSON:
        dataset = check_dataset_id(args["dataset"])
        workspace = self.workspace(args["workspace"])
        target = self.inside(workspace, download_dirname(dataset))
        revision, files = self._download(dataset, args.get("revision"), args.get("allow_patterns"), target)
        described = self.describe_files(workspace, files)
        return {
            "provider": self.provider,
            "dataset": dataset,
            "revision": revision,
            "path": target.relative_to(workspace).as_posix(),
            "files": described,
            "total_bytes": sum(f["size"] for f in described),
        }

    @tool(
        "hf_materialize_dataset",
        "Convert a downloaded split into prompt/completion JSONL in the workspace, ready for worker_add_data.",
        MATERIALIZE_IN,
        MATERIALIZE_OUT,
    )
    def materialize_dataset(self, args: JSON) -> JSON:
        dataset = check_dataset_id(args["dataset"])
        workspace = self.workspace(args["workspace"])
        source = self.inside(workspace, args.get("source") or download_dirname(dataset), existing=True)
        if not source.exists():
            # The state of the workspace, not the request, is wrong: 404, as for any missing file.
            raise ConnectorError(
                "not_found", f"{source.relative_to(workspace)} is missing; run hf_download_dataset first"
            )
        name = args.get("output") or f"{dataset.replace('/', '__')}-{args['split']}"
        out = self.inside(workspace, f"materialized/{name}.jsonl")
        return materialize(source, out, workspace, args)

    # ------------------------------------------------------------ provider hooks

    def _search(self, args: JSON) -> list[JSON]:
        raise NotImplementedError

    def _inspect(self, dataset: str, revision: str | None) -> JSON:
        raise NotImplementedError

    def _configs(self, dataset: str) -> list[str]:
        raise NotImplementedError

    def _splits(self, dataset: str, config: str | None) -> list[JSON]:
        raise NotImplementedError

    def _readme(self, dataset: str, revision: str | None) -> str:
        raise NotImplementedError

    def _sample(self, dataset: str, config: str | None, split: str, n: int) -> JSON:
        raise NotImplementedError

    def _download(
        self, dataset: str, revision: str | None, patterns: list[str] | None, target: Path
    ) -> tuple[str | None, list[Path]]:
        raise NotImplementedError


def split_front_matter(text: str) -> tuple[JSON | None, str]:
    """A dataset card is YAML front matter between '---' lines, then markdown."""
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not match:
        return None, text
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None, text
    return (data if isinstance(data, dict) else None), text[match.end() :]


# ---------------------------------------------------------------- materialize (datasets-compatible reading)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def template_fields(spec: str, columns: list[str]) -> list[str]:
    """The columns a field spec reads: itself if bare, else its {placeholders}.

    Placeholders must be plain column names: no '!r' conversions, no ':>99999' format specs (a
    memory bomb) and no '.attr' or '[key]' look-ups, which would reach past the row's values.
    """
    if "{" not in spec:
        names = [spec]
    else:
        try:
            parsed = list(string.Formatter().parse(spec))
        except ValueError as exc:
            raise ConnectorError("bad_request", f"bad template {spec!r}: {exc}") from None
        if any(conversion or format_spec for _, name, format_spec, conversion in parsed if name is not None):
            raise ConnectorError("bad_request", f"template {spec!r}: use plain {{column}} placeholders")
        names = [name for _, name, _, _ in parsed if name is not None]
    missing = [n for n in names if n not in columns]
    if missing or not names:
        raise ConnectorError("bad_request", f"unknown column(s) {missing}; the split has {columns}")
    return names


def _render(spec: str, names: list[str], row: dict[str, Any]) -> str | None:
    """Fill one field from a row; None (row skipped) when a column it reads is empty."""
    if any(row.get(n) is None for n in names):
        return None
    if "{" not in spec:
        return _as_text(row[spec])
    return spec.format_map({n: _as_text(row[n]) for n in names})


def load_split(source: Path, split: str, config: str | None, cache_dir: str) -> Any:
    """Read a file or a downloaded repository folder the way ``datasets.load_dataset`` does."""
    import datasets  # noqa: PLC0415 - heavy (seconds); only when a Hub download is read

    datasets.disable_progress_bars()
    try:
        if source.is_dir():
            return datasets.load_dataset(str(source), name=config, split=split, cache_dir=cache_dir)
        builder = DATA_SUFFIXES.get(source.suffix.lower())
        if builder is None:
            raise ConnectorError("bad_request", f"cannot read {source.name}: use one of {sorted(DATA_SUFFIXES)}")
        options = {"delimiter": "\t"} if source.suffix.lower() == ".tsv" else {}
        return datasets.load_dataset(
            builder, data_files={split: str(source)}, split=split, cache_dir=cache_dir, **options
        )
    except ConnectorError:
        raise
    except Exception as exc:  # datasets raises many types for unreadable data; the agent needs the message
        raise ConnectorError("bad_request", f"cannot read split {split!r}: {exc.__class__.__name__}: {exc}") from None


def materialize(source: Path, out: Path, workspace: Path, args: JSON) -> JSON:
    specs = [args["prompt"], args["completion"]]
    written = skipped = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hf-materialize-") as cache_dir:
        table = load_split(source, args["split"], args.get("config"), cache_dir)
        columns = list(table.column_names)
        fields = [template_fields(spec, columns) for spec in specs]
        # Write beside the target and rename: a failed run never leaves a half-written file behind.
        fd, tmp_name = tempfile.mkstemp(dir=out.parent, suffix=".partial")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                for row in table:
                    if written >= args["max_rows"]:
                        break
                    prompt, completion = (_render(s, names, row) for s, names in zip(specs, fields, strict=True))
                    if not prompt or not completion:
                        skipped += 1
                        continue
                    handle.write(json.dumps({"prompt": prompt, "completion": completion}, ensure_ascii=False) + "\n")
                    written += 1
            os.replace(tmp_name, out)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    return {
        "path": out.relative_to(workspace).as_posix(),
        "rows": written,
        "skipped": skipped,
        "sha256": sha256_file(out),
        "columns": columns,
        "split": args["split"],
    }


# ---------------------------------------------------------------- the Hub provider


class HubConnector(DatasetsContract):
    """Datasets on a Hub endpoint (huggingface.co or a mirror) plus its dataset-viewer server."""

    name = "hf_hub"
    service = "huggingface.co"
    provider = "hub"

    @property
    def endpoint(self) -> str:
        return (self.config.hf_endpoint or HUB_DEFAULT_ENDPOINT).rstrip("/")

    @property
    def viewer_url(self) -> str | None:
        if self.config.hf_datasets_server_url:
            return self.config.hf_datasets_server_url.rstrip("/")
        # The public viewer only knows the public Hub's datasets; a mirror must name its own.
        return VIEWER_DEFAULT_URL if self.endpoint == HUB_DEFAULT_ENDPOINT else None

    def configured(self, tool_name: str) -> bool:
        if self.config.hf_provider != "hub":
            return False
        return tool_name not in VIEWER_TOOLS or self.viewer_url is not None

    @property
    def token(self) -> str | bool:
        # False, not None: never let huggingface_hub pick up a token from the host's login.
        return self.config.hf_token or False

    def api(self) -> Any:
        from huggingface_hub import HfApi  # noqa: PLC0415 - heavy; only when the Hub connector is used

        return HfApi(endpoint=self.endpoint, token=self.token, user_agent=self.config.user_agent)

    def viewer(self) -> HttpClient:
        return http_client(self.config, self.viewer_url, token=self.config.hf_token)

    @contextmanager
    def hub_errors(self, what: str) -> Iterator[None]:
        """Translate huggingface_hub's exceptions into the connector codes."""
        from huggingface_hub import errors  # noqa: PLC0415 - heavy; only when the Hub connector is used

        self._probe(what)
        try:
            yield
        except ConnectorError:
            raise
        except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.EntryNotFoundError) as exc:
            raise ConnectorError("bad_request", f"{what}: not found on {self.endpoint}: {first_line(exc)}") from None
        except errors.HFValidationError as exc:
            raise ConnectorError("bad_request", f"{what}: {first_line(exc)}") from None
        except errors.HfHubHTTPError as exc:
            raise ConnectorError("upstream_error", f"{what}: {first_line(exc)}") from None
        except _transport_errors() as exc:
            raise unreachable(f"{self.endpoint} ({what})", exc) from None

    def _probe(self, what: str) -> None:
        """Fail fast when nothing listens at the endpoint.

        huggingface_hub retries a refused connection with backoff for ~20 s before giving up; an
        agent should hear "unreachable" at once. Behind a proxy only the proxy can tell, so skip.
        """
        if any(scheme != "no" for scheme in urllib.request.getproxies()):
            return
        parts = urlsplit(self.endpoint)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname or "", port), timeout=min(self.config.timeout_s, 5)).close()
        except OSError as exc:
            raise unreachable(f"{self.endpoint} ({what})", exc) from None

    def _search(self, args: JSON) -> list[JSON]:
        with self.hub_errors("dataset search"):
            infos = list(
                self.api().list_datasets(search=args["query"] or None, author=args.get("author"), limit=args["limit"])
            )
        return [_summary(info) for info in infos]

    def _inspect(self, dataset: str, revision: str | None) -> JSON:
        with self.hub_errors(dataset):
            info = self.api().dataset_info(dataset, revision=revision, files_metadata=True)
        card = info.card_data.to_dict() if info.card_data is not None else None
        return {
            **_summary(info),
            "sha": info.sha,
            "license": (card or {}).get("license"),
            "card_data": card,
            "gated": info.gated,
            "private": info.private,
            "files": [{"path": s.rfilename, "size": s.size} for s in info.siblings or []],
        }

    def _viewer_splits(self, dataset: str, config: str | None) -> list[JSON]:
        body = self.viewer().get_json("/splits", {"dataset": dataset, "config": config})
        splits = body.get("splits") if isinstance(body, dict) else None
        if not isinstance(splits, list):
            raise ConnectorError("upstream_error", f"/splits for {dataset} has no 'splits' list")
        return splits

    def _configs(self, dataset: str) -> list[str]:
        # /splits without a config lists every (config, split) pair; configs keep their order.
        return list(dict.fromkeys(s["config"] for s in self._viewer_splits(dataset, None)))

    def _splits(self, dataset: str, config: str | None) -> list[JSON]:
        return [
            {"config": s["config"], "split": s["split"], "num_rows": None} for s in self._viewer_splits(dataset, config)
        ]

    def _readme(self, dataset: str, revision: str | None) -> str:
        from huggingface_hub import hf_hub_download  # noqa: PLC0415 - heavy; only when the Hub connector is used

        with tempfile.TemporaryDirectory(prefix="hf-readme-") as tmp, self.hub_errors(f"{dataset} README.md"):
            # Ask for the file list first: it fails fast when the Hub is down (hf_hub_download
            # would retry for ~20 s) and tells a missing card apart from a missing dataset.
            info = self.api().dataset_info(dataset, revision=revision)
            if "README.md" not in {s.rfilename for s in info.siblings or []}:
                raise ConnectorError("bad_request", f"{dataset} has no README.md")
            path = hf_hub_download(
                dataset,
                "README.md",
                repo_type="dataset",
                revision=info.sha,
                endpoint=self.endpoint,
                token=self.token,
                local_dir=tmp,
                etag_timeout=self.config.timeout_s,
            )
            return Path(path).read_text(encoding="utf-8", errors="replace")

    def _sample(self, dataset: str, config: str | None, split: str, n: int) -> JSON:
        if config is None:
            candidates = [s["config"] for s in self._viewer_splits(dataset, None) if s["split"] == split]
            if not candidates:
                raise ConnectorError("bad_request", f"{dataset} has no split {split!r}")
            config = candidates[0]
        body = self.viewer().get_json("/first-rows", {"dataset": dataset, "config": config, "split": split})
        rows = [r["row"] for r in body.get("rows", [])]
        features = [{"name": f["name"], "dtype": _dtype(f.get("type"))} for f in body.get("features", [])]
        return {
            "config": config,
            "split": split,
            "features": features,
            "rows": rows[:n],
            "truncated": bool(body.get("truncated")) or len(rows) > n,
        }

    def _download(
        self, dataset: str, revision: str | None, patterns: list[str] | None, target: Path
    ) -> tuple[str | None, list[Path]]:
        from huggingface_hub import hf_hub_download  # noqa: PLC0415 - heavy; only when the Hub connector is used

        # huggingface_hub.utils exports lazily, which type checkers cannot follow.
        from huggingface_hub.utils import disable_progress_bars  # type: ignore[attr-defined]  # noqa: PLC0415 - heavy; only when a file is downloaded

        disable_progress_bars()
        with self.hub_errors(dataset):
            info = self.api().dataset_info(dataset, revision=revision, files_metadata=True)
            wanted = [
                s
                for s in info.siblings or []
                if s.rfilename != ".gitattributes" and matches_patterns(s.rfilename, patterns)
            ]
            if not wanted:
                raise ConnectorError("bad_request", f"no file of {dataset} matches {patterns}")
            total = sum(s.size or 0 for s in wanted)
            if total > self.config.max_download_bytes:
                raise ConnectorError(
                    "bad_request",
                    f"{dataset} selection is {total} bytes, over the {self.config.max_download_bytes}-byte limit; "
                    "narrow it with allow_patterns",
                )
            paths = [
                Path(
                    hf_hub_download(
                        dataset,
                        s.rfilename,
                        repo_type="dataset",
                        # Pin every file to the commit just inspected, so one download is one revision.
                        revision=info.sha,
                        endpoint=self.endpoint,
                        token=self.token,
                        local_dir=target,
                        etag_timeout=self.config.timeout_s,
                    )
                )
                for s in wanted
            ]
        # hf_hub_download keeps resume metadata in <local_dir>/.cache; it is not part of the dataset.
        shutil.rmtree(target / ".cache", ignore_errors=True)
        return info.sha, paths


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection failures as huggingface_hub raises them.

    huggingface_hub 1.x+ speaks HTTP through its own fork, httpx2, whose errors are not httpx's;
    hf_hub_download reports a lost connection as LocalEntryNotFoundError, an OSError.
    """
    return (httpx.TransportError, *_HTTPX2_ERRORS, OSError)


def _summary(info: Any) -> JSON:
    return {
        "id": info.id,
        "author": info.author,
        "description": info.description,
        "tags": list(info.tags or []),
        "downloads": info.downloads,
        "likes": info.likes,
        "last_modified": info.last_modified.isoformat() if info.last_modified else None,
    }


def _dtype(feature_type: Any) -> str:
    """The viewer describes a column as a datasets Feature dict: {"dtype": "string", "_type": "Value"}."""
    if isinstance(feature_type, dict):
        if feature_type.get("_type") == "Value":
            return str(feature_type.get("dtype"))
        return str(feature_type.get("_type", "unknown"))
    if isinstance(feature_type, list):
        return "list"
    return "unknown"
