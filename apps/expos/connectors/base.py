"""The one interface every external discovery connector implements (DESIGN.md, "External discovery").

A connector names the service it reaches and declares its tools; each tool is a ``ToolSpec``
(name, one-line description, JSON input and output schemas, a callable). Callers see one error
type, ``ConnectorError``, with a small closed set of codes the REST layer maps to statuses.
Nothing here imports Django: configuration arrives as a ``ConnectorConfig``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar

import httpx
import jsonschema

JSON = dict[str, Any]
Handler = Callable[[JSON], JSON]
Method = TypeVar("Method", bound=Callable[..., JSON])

# not_found: a file the call needs is not (yet) in the workspace (e.g. materialize before download).
ERROR_CODES = frozenset(
    {"not_configured", "unreachable", "upstream_error", "bad_request", "forbidden_address", "not_found"}
)


class ConnectorError(Exception):
    """A refusal or failure a calling agent can act on: a stable ``code`` and a message."""

    def __init__(self, code: str, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown connector error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def to_dict(self) -> JSON:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the registry sees it. ``call`` validates ``args`` against ``input_schema``."""

    name: str
    description: str
    input_schema: JSON
    output_schema: JSON
    handler: Handler = field(repr=False, compare=False)
    connector: str = ""
    service: str = ""
    configured: bool = True

    def __call__(self, args: JSON) -> JSON:
        return self.call(args)

    def call(self, args: JSON) -> JSON:
        try:
            jsonschema.validate(args, self.input_schema)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
            raise ConnectorError("bad_request", f"{self.name}: {where}: {exc.message}") from None
        # Handlers read defaults from the schema, so the documented default is the one applied.
        defaults = {k: p["default"] for k, p in self.input_schema.get("properties", {}).items() if "default" in p}
        return self.handler({**defaults, **args})


@dataclass(frozen=True)
class ConnectorConfig:
    """Every knob of the 22 connectors. ``from_env`` reads the ``RSI_*`` variables in docs/connectors.md.

    A connector with nothing configured stays off and answers ``not_configured``, so a fresh
    install reaches no outside service until someone names one. Secrets stay out of ``repr``.
    """

    hf_provider: Literal["local", "hub"] | None = None
    hf_endpoint: str | None = None
    hf_datasets_server_url: str | None = None
    hf_token: str | None = field(default=None, repr=False)
    local_catalog_dir: str | None = None
    github_api_url: str | None = None
    github_token: str | None = field(default=None, repr=False)
    arxiv_api_url: str | None = None
    dblp_api_url: str | None = None
    search_provider: Literal["serpapi"] | None = None
    search_provider_url: str | None = None
    search_api_key: str | None = field(default=None, repr=False)
    web_parse_enabled: bool = False
    allow_private_addresses: bool = False
    # hf_download/hf_materialize write only inside a workspace; if set, it must lie under this root.
    workspace_root: str | None = None
    # ... and never under the datapool: data enters training only through worker_add_data.
    datapool_root: str | None = None
    timeout_s: float = 20.0
    max_download_bytes: int = 2 * 1024**3
    max_web_bytes: int = 5 * 1024**2
    user_agent: str = "rsiweb-expos-connectors/1"

    ENV: ClassVar[dict[str, str]] = {
        "hf_provider": "RSI_HF_PROVIDER",
        "hf_endpoint": "RSI_HF_ENDPOINT",
        "hf_datasets_server_url": "RSI_HF_DATASETS_SERVER_URL",
        "hf_token": "RSI_HF_TOKEN",
        "local_catalog_dir": "RSI_LOCAL_CATALOG_DIR",
        "github_api_url": "RSI_GITHUB_API_URL",
        "github_token": "RSI_GITHUB_TOKEN",
        "arxiv_api_url": "RSI_ARXIV_API_URL",
        "dblp_api_url": "RSI_DBLP_API_URL",
        "search_provider": "RSI_SEARCH_PROVIDER",
        "search_provider_url": "RSI_SEARCH_PROVIDER_URL",
        "search_api_key": "RSI_SEARCH_API_KEY",
        "web_parse_enabled": "RSI_WEB_PARSE_ENABLED",
        "allow_private_addresses": "RSI_WEB_PARSE_ALLOW_PRIVATE",
        "workspace_root": "RSI_WORKSPACE_ROOT",
        "datapool_root": "RSI_DATAPOOL_ROOT",
        "timeout_s": "RSI_CONNECTOR_TIMEOUT_S",
        "max_download_bytes": "RSI_HF_MAX_DOWNLOAD_BYTES",
        "max_web_bytes": "RSI_WEB_PARSE_MAX_BYTES",
    }

    def __post_init__(self) -> None:
        if self.hf_provider not in (None, "local", "hub"):
            raise ValueError(f"RSI_HF_PROVIDER must be 'local' or 'hub', not {self.hf_provider!r}")
        if self.search_provider not in (None, "serpapi"):
            raise ValueError(f"RSI_SEARCH_PROVIDER must be 'serpapi', not {self.search_provider!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ConnectorConfig:
        """Build from a mapping such as ``os.environ``; empty strings count as unset."""
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for attr, var in cls.ENV.items():
            raw = (env.get(var) or "").strip()
            if not raw:
                continue
            kind = str(types[attr])
            try:
                if kind == "bool":
                    values[attr] = raw.lower() in {"1", "true", "yes", "on"}
                elif kind in ("int", "float"):
                    values[attr] = int(raw) if kind == "int" else float(raw)
                else:
                    values[attr] = raw
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not a valid {kind}") from None
        # A site that names only an endpoint or a catalog has chosen its provider implicitly.
        if "hf_provider" not in values:
            if "local_catalog_dir" in values:
                values["hf_provider"] = "local"
            elif "hf_endpoint" in values:
                values["hf_provider"] = "hub"
        if "search_provider" not in values and "search_provider_url" in values:
            values["search_provider"] = "serpapi"
        return cls(**values)


def tool(name: str, description: str, input_schema: JSON, output_schema: JSON) -> Callable[[Method], Method]:
    """Mark a connector method as a tool; ``Connector.tools`` collects the marked methods."""

    def mark(method: Method) -> Method:
        method.__tool__ = (name, description, input_schema, output_schema)  # type: ignore[attr-defined]
        return method

    return mark


class Connector:
    """Base of all connectors: subclasses set ``name``/``service`` and decorate methods with ``@tool``."""

    name: ClassVar[str]
    service: ClassVar[str]
    # Shown in not_configured errors: the exact variables that switch the connector on.
    enable_hint: ClassVar[str]

    def __init__(self, config: ConnectorConfig) -> None:
        self.config = config

    def configured(self, tool_name: str) -> bool:
        raise NotImplementedError

    def require(self, tool_name: str) -> None:
        if not self.configured(tool_name):
            raise ConnectorError("not_configured", f"{tool_name} is disabled; to enable it {self.enable_hint}")

    @property
    def tools(self) -> dict[str, ToolSpec]:
        specs: dict[str, ToolSpec] = {}
        for attr in dir(type(self)):
            meta = getattr(getattr(type(self), attr), "__tool__", None)
            if meta is None:
                continue
            name, description, input_schema, output_schema = meta
            specs[name] = ToolSpec(
                name=name,
                description=description,
                input_schema=input_schema,
                output_schema=output_schema,
                handler=self._guarded(name, getattr(self, attr)),
                connector=self.name,
                service=self.service,
                configured=self.configured(name),
            )
        return specs

    def _guarded(self, name: str, method: Handler) -> Handler:
        def run(args: JSON) -> JSON:
            self.require(name)
            return method(args)

        return run


class HttpClient:
    """httpx with the connector error mapping: no connection -> unreachable, HTTP errors -> codes."""

    def __init__(self, base_url: str, *, timeout_s: float, headers: Mapping[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})

    def get(self, path: str, params: Mapping[str, Any] | None = None, *, check: bool = True) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            with httpx.Client(timeout=self.timeout_s, headers=self.headers, follow_redirects=True) as client:
                response = client.get(url, params={k: v for k, v in (params or {}).items() if v is not None})
        except (httpx.TransportError, OSError) as exc:
            raise unreachable(url, exc) from None
        if check:
            raise_for_upstream(response)
        return response

    def get_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        response = self.get(path, params)
        try:
            return response.json()
        except json.JSONDecodeError:
            raise ConnectorError("upstream_error", f"{response.url} did not answer JSON") from None


def http_client(
    config: ConnectorConfig, base_url: str | None, *, token: str | None = None, headers: Mapping[str, str] | None = None
) -> HttpClient:
    """The client every connector calls its service with: the configured timeout and User-Agent,
    ``headers`` on top, and ``token`` (when set) as a bearer Authorization."""
    sent = {"User-Agent": config.user_agent, **(headers or {})}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    return HttpClient(base_url or "", timeout_s=config.timeout_s, headers=sent)


def unreachable(where: str, exc: BaseException) -> ConnectorError:
    """No answer from ``where`` (no connection, a timeout, a dropped transfer): ``unreachable``."""
    return ConnectorError("unreachable", f"cannot reach {where}: {exc.__class__.__name__}: {first_line(exc)}")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (some libraries' messages run to pages), at most 300 characters."""
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:300]


def raise_for_upstream(response: httpx.Response) -> None:
    """Map an upstream HTTP error: what the caller named wrongly is bad_request, the rest upstream_error."""
    if response.status_code < 400:
        return
    # The query is left out: it can carry an API key (SerpAPI's api_key), and errors get logged.
    where = f"{response.request.method} {response.url.copy_with(query=None)}"
    raise status_error(response.status_code, where, upstream_message(response))


def status_error(status: int, where: str, detail: str) -> ConnectorError:
    code = "bad_request" if status in {400, 404, 422} else "upstream_error"
    return ConnectorError(code, f"{where} -> {status}: {detail}")


def upstream_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        for key in ("message", "error"):
            value = body.get(key)
            if isinstance(value, str):
                return value[:300]
    return json.dumps(body)[:300]


def truncate(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[:limit], True)


def object_schema(properties: JSON, required: list[str] | None = None) -> JSON:
    """A closed JSON object schema: unknown arguments are refused, so typos surface as bad_request."""
    return {"type": "object", "properties": properties, "required": required or [], "additionalProperties": False}


def integer_schema(default: int, minimum: int, maximum: int, description: str) -> JSON:
    return {"type": "integer", "default": default, "minimum": minimum, "maximum": maximum, "description": description}
