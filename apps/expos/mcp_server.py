"""The Experiment OS as an MCP server (Model Context Protocol), for harnesses such as Claude Code and Codex.

The server declares no tool of its own: it is the REST API seen through MCP, for the caller's token.

- ``tools/list`` is ``GET /api/v1/tools/definitions`` (and ``GET /api/v1/tools`` for which tools take
  an Idempotency-Key or If-Match) with the caller's token: exactly the tools its role may call, with
  the registry's input schemas and descriptions (apps/expos/registry.py).
- ``tools/call`` is ``POST /api/v1/tools/<name>`` with the caller's token, so the role check, schema
  check, idempotency, If-Match, visibility rules, rate limit, ``tool.called`` events and blocked-attempt
  records are the REST path's own. A refusal comes back as an MCP tool error (``isError``) whose text
  starts with the API's error code and message; ``structuredContent`` holds the API's error body.

Two transports serve it:

- stdio: ``expos mcp`` (apps/expos/cli.py) reads RSI_URL and RSI_TOKEN and talks to the API over
  HTTP, so it runs wherever the harness does, with nothing but the API within reach;
- streamable HTTP at ``/api/v1/mcp`` of the web app (rsiweb/asgi.py), authenticated by the request's
  ``Authorization: Bearer`` header. It is stateless (no MCP session outlives a request), so any web
  process serves any request, and its REST calls never leave the process: they go to Django's
  handler through httpx's ASGI transport.

MCP has no request headers of its own, so the two HTTP headers that make agent retries safe become
arguments: ``idempotency_key`` on creating tools and ``if_match`` on tools that change a research node
(the ``expos`` CLI's ``--idempotency-key`` / ``--if-match``). An answer's ETag is in ``_meta.etag``
and in a second text block, where a model reads it.

Only httpx and the ``mcp`` SDK are imported, never Django: the stdio server runs on a host that has
neither the project's settings nor its data.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

import anyio
import httpx
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import McpError

SERVER_NAME = "rsiweb-expos"
MCP_PATH = "/api/v1/mcp"
API_PREFIX = "/api/v1"
TIMEOUT_SECONDS = 120
IDEMPOTENCY_ARGUMENT = "idempotency_key"
IF_MATCH_ARGUMENT = "if_match"

# The headers of the REST call that stands for the current MCP request (Authorization, Host).
Credentials = Callable[[Any], dict[str, str]]


def mcp_tool(function: dict[str, Any], summary: dict[str, Any]) -> types.Tool:
    """One registry definition (as the API serves it) as an MCP tool, with the retry headers as arguments."""
    schema = json.loads(json.dumps(function["parameters"]))  # a copy: the extra arguments stay ours
    properties = schema.setdefault("properties", {})
    extras = {
        IDEMPOTENCY_ARGUMENT: (
            summary.get("idempotent_create"),
            "Idempotency-Key: a retry with the same key and arguments returns the first answer "
            "instead of creating a second record (always send one).",
        ),
        IF_MATCH_ARGUMENT: (
            summary.get("if_match"),
            "If-Match: the ETag you read (state_get_current_worker's answer carries it); if the node "
            "changed since, the call is refused (precondition_failed) and changes nothing.",
        ),
    }
    for name, (wanted, description) in extras.items():
        if not wanted:
            continue
        if name in properties:
            # A tool argument of that name would be taken for the header: refuse to serve it ambiguously.
            raise RuntimeError(f"tool {function['name']} declares {name!r}, which the MCP server uses for a header")
        properties[name] = {"type": "string", "minLength": 1, "maxLength": 200, "description": description}
    return types.Tool(name=function["name"], description=function["description"], inputSchema=schema)


def _api_error(response: httpx.Response) -> tuple[str, str, Any]:
    """(code, message, body) of a refused REST call, whatever shape its body has."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("code", "error")), str(error.get("message", "")), body
    return f"http_{response.status_code}", response.text[:500], body


def tool_error(code: str, message: str, body: Any = None) -> types.CallToolResult:
    text = f"{code}: {message}"
    detail = body.get("error", {}).get("detail") if isinstance(body, dict) else None
    if detail:
        text += "\n" + json.dumps(detail, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent=body if isinstance(body, dict) else {"error": {"code": code, "message": message}},
        isError=True,
    )


def build_server(*, client: httpx.AsyncClient, credentials: Credentials) -> Server[Any, Any]:
    """The MCP server whose tools are the API's, called with ``credentials(request_context)``."""
    server: Server[Any, Any] = Server(
        SERVER_NAME,
        instructions="The rsiweb Experiment OS: every tool is an ExpOS tool of your token's role. "
        "Errors start with a stable code; state_get_current_worker or main_* tools tell you where you stand.",
    )

    async def get(path: str, headers: dict[str, str]) -> Any:
        try:
            response = await client.get(f"{API_PREFIX}{path}", headers=headers)
        except httpx.HTTPError as exc:
            raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message=f"unreachable: {exc}")) from None
        if not response.is_success:
            code, message, body = _api_error(response)
            kind = types.INTERNAL_ERROR if response.status_code >= 500 else types.INVALID_REQUEST
            raise McpError(types.ErrorData(code=kind, message=f"{code}: {message}", data=body))
        return response.json()

    async def list_tools() -> list[types.Tool]:
        headers = credentials(server.request_context)
        definitions = await get("/tools/definitions", headers)
        summaries = {item["name"]: item for item in (await get("/tools", headers))["tools"]}
        return [mcp_tool(d["function"], summaries.get(d["function"]["name"], {})) for d in definitions["tools"]]

    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        args = dict(arguments or {})
        headers = {**credentials(server.request_context), "Content-Type": "application/json"}
        for argument, header in ((IDEMPOTENCY_ARGUMENT, "Idempotency-Key"), (IF_MATCH_ARGUMENT, "If-Match")):
            # A value that is no string stays an argument, so the API refuses it by its schema.
            if isinstance(args.get(argument), str):
                headers[header] = args.pop(argument)
        url = f"{API_PREFIX}/tools/{urllib.parse.quote(name, safe='')}"
        try:
            response = await client.post(url, content=json.dumps(args, ensure_ascii=False), headers=headers)
        except httpx.HTTPError as exc:
            return tool_error("unreachable", f"the API did not answer: {exc}")
        if not response.is_success:
            return tool_error(*_api_error(response))
        body = response.json() if response.content else {}
        content = [types.TextContent(type="text", text=json.dumps(body, ensure_ascii=False))]
        meta: dict[str, Any] = {}
        etag = response.headers.get("ETag")
        if etag:
            meta["etag"] = etag
            content.append(types.TextContent(type="text", text=f"ETag: {etag} (send it as if_match to change it)"))
        if response.headers.get("Idempotent-Replayed"):
            meta["idempotent_replayed"] = True
        result = types.CallToolResult(
            content=list(content), structuredContent=body if isinstance(body, dict) else None, isError=False
        )
        result.meta = meta or None  # the field's alias, _meta, is no Python keyword argument
        return result

    # Registered without decorator syntax: the SDK's decorator factories are unannotated. Its input check is
    # off: the REST path validates, and records the refusal (with any sealed-split request it
    # carried) where a check here would refuse unseen.
    server.list_tools()(list_tools)  # type: ignore[no-untyped-call]
    server.call_tool(validate_input=False)(call_tool)

    return server


# --- stdio: `expos mcp` -------------------------------------------------------------------------------


async def serve_stdio(*, url: str, token: str) -> None:
    """Serve MCP on stdin/stdout for one token, calling the API at ``url``."""
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=TIMEOUT_SECONDS) as client:
        server = build_server(client=client, credentials=lambda _context: {"Authorization": f"Bearer {token}"})
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def run_stdio(*, url: str, token: str) -> None:
    anyio.run(lambda: serve_stdio(url=url, token=token))


# --- streamable HTTP, mounted in rsiweb/asgi.py -----------------------------------------------------------


def _request_credentials(context: Any) -> dict[str, str]:
    """The current HTTP request's bearer token and Host (Django checks it against ALLOWED_HOSTS)."""
    request = context.request
    return {"Authorization": request.headers.get("authorization", ""), "Host": request.headers.get("host", "")}


def _bearer(scope: dict[str, Any]) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            return value[:7].lower() == b"bearer " and len(value) > 7
    return False


class McpHttpApp:
    """The ASGI app at MCP_PATH: a stateless streamable-HTTP MCP server over ``api_app`` (Django).

    The SDK's session manager needs a running task group. The web server runs without the ASGI
    lifespan protocol (Django has none; apps/core/management/commands/serve.py), so the group is
    opened on the first request, in a task that lives as long as the event loop.
    """

    def __init__(self, api_app: Any, *, max_request_bytes: int) -> None:
        # The JSON-RPC envelope around a tool's arguments is small: a body the REST view would take
        # fits, with room for it, and the REST view still refuses an oversized one (413, recorded).
        self.max_request_bytes = max_request_bytes + 64 * 1024
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=api_app), base_url="http://rsiweb", timeout=TIMEOUT_SECONDS
        )
        self.server = build_server(client=self.client, credentials=_request_credentials)
        self._manager: StreamableHTTPSessionManager | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = asyncio.Event()
        self._holder: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not _bearer(scope):
            await _unauthorized(send)
            return
        manager = await self._running()
        await manager.handle_request(scope, receive, send)

    async def _running(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A manager runs once, in one loop: a server that serves this app again in a new loop
            # (a test's second server) gets a new one. No await since the check: one per loop.
            self._loop, self._ready = loop, asyncio.Event()
            self._manager = StreamableHTTPSessionManager(
                app=self.server, stateless=True, json_response=True, max_request_body_size=self.max_request_bytes
            )
            self._holder = loop.create_task(self._hold(self._manager, self._ready))
        await self._ready.wait()
        assert self._manager is not None
        return self._manager

    @staticmethod
    async def _hold(manager: StreamableHTTPSessionManager, ready: asyncio.Event) -> None:
        async with manager.run():
            ready.set()
            await asyncio.Event().wait()  # until the loop closes


async def _unauthorized(send: Any) -> None:
    body = json.dumps(
        {"error": {"code": "not_authenticated", "message": "Send your agent token: Authorization: Bearer <token>."}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b'Bearer realm="api"'),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
