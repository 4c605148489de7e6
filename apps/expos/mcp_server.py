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

Nothing an agent sends can make the bridge fail before the API has seen it, because then the
request would leave no record. Every message is screened first, on both transports, by the
screening of the REST view's own body (size, UTF-8, JSON, nesting): what the SDK can read goes
to it; a ``tools/call`` it cannot read is sent on to its REST endpoint as it came (its arguments'
bytes, or the whole message), so the API refuses it with its stable code and records it; anything
else is answered with a JSON-RPC error carrying a stable code. Arguments travel to the API as
ASCII JSON (a lone surrogate as its escape, which the API refuses by path), and the retry arguments
as headers only when HTTP can carry them (``header_value``). Over HTTP a token the API does not know
is refused with 401 before any stream opens.

Only httpx, the ``mcp`` SDK and apps.expos.jsontext (the standard library's json) are imported,
never Django: the stdio server runs on a host that has neither the project's settings nor its data.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import McpError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from apps.expos.jsontext import nesting_exceeds, rpc_parts, tail_id

SERVER_NAME = "rsiweb-expos"
MCP_PATH = "/api/v1/mcp"
API_PREFIX = "/api/v1"
TIMEOUT_SECONDS = 120
IDEMPOTENCY_ARGUMENT = "idempotency_key"
IF_MATCH_ARGUMENT = "if_match"

# The API's nesting limit for arguments (apps.core.jsonsafe.MAX_DEPTH, which this module may not
# import; tests/apps/expos/test_mcp_screening.py holds them equal). A message nests its arguments in
# two more levels (the message, its params).
MAX_ARGUMENT_DEPTH = 64
MAX_MESSAGE_DEPTH = MAX_ARGUMENT_DEPTH + 2
# What an MCP message may add to the API's body limit: the JSON-RPC envelope around the arguments.
ENVELOPE_BYTES = 64 * 1024

# The headers of the REST call that stands for the current MCP request (Authorization, Host). Values
# are bytes where they came as bytes: HTTP headers are Latin-1, and httpx encodes a str as ASCII.
# (Typed loosely: httpx takes str or bytes values, its annotations one kind per mapping.)
Credentials = Callable[[Any], dict[str, Any]]

# What HTTP can carry as a header and the API then judges by its own rule: visible ASCII, inner spaces.
_SENDABLE_HEADER = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,998}[\x21-\x7e])?")
_UNSENDABLE_SHOWN = 300
# A name that is a path segment as it is; any other is sent as its JSON form (see tool_path).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")


def header_value(value: str) -> str:
    """A retry argument (idempotency_key, if_match) as a header value the API is sure to judge.

    Visible ASCII goes as it is. Anything else (non-ASCII, a lone surrogate, a control character,
    empty, over 1,000 characters) cannot travel as a header, and is no valid key or ETag either:
    it goes as its escaped JSON form, cut, after a word and a space, so the API refuses it
    (invalid_idempotency_key; If-Match matches no ETag) and records that form.
    """
    if _SENDABLE_HEADER.fullmatch(value):
        return value
    return "unsendable " + json.dumps(value)[:_UNSENDABLE_SHOWN]


def tool_path(name: str) -> str:
    """The REST path of a tool, for any name: one that is no plain name (a registry name is
    ``[a-z_]+``) is sent as its JSON form, ASCII and without ``/``, so it reaches the tool view
    (which refuses it as unknown_tool and records it) rather than another route or none."""
    shown = name if _PLAIN_NAME.fullmatch(name) else json.dumps(name)[:200].replace("/", "\\u002f")
    return f"{API_PREFIX}/tools/{urllib.parse.quote(shown, safe='')}"


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
            "If-Match: the ETag you read (your role's state_get_current_* answer carries it); if the node "
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


async def post_tool(client: httpx.AsyncClient, headers: dict[str, Any], name: str, body: bytes) -> types.CallToolResult:
    """``POST /api/v1/tools/<name>`` with ``body`` as it is, the answer as an MCP tool result."""
    try:
        sent = {**headers, "Content-Type": "application/json"}
        response = await client.post(tool_path(name), content=body, headers=sent)
    except httpx.HTTPError as exc:
        return tool_error("unreachable", f"the API did not answer: {exc}")
    if not response.is_success:
        return tool_error(*_api_error(response))
    answer = response.json() if response.content else {}
    content = [types.TextContent(type="text", text=json.dumps(answer, ensure_ascii=False))]
    meta: dict[str, Any] = {}
    etag = response.headers.get("ETag")
    if etag:
        meta["etag"] = etag
        content.append(types.TextContent(type="text", text=f"ETag: {etag} (send it as if_match to change it)"))
    if response.headers.get("Idempotent-Replayed"):
        meta["idempotent_replayed"] = True
    result = types.CallToolResult(
        content=list(content), structuredContent=answer if isinstance(answer, dict) else None, isError=False
    )
    result.meta = meta or None  # the field's alias, _meta, is no Python keyword argument
    return result


def build_server(*, client: httpx.AsyncClient, credentials: Credentials) -> Server[Any, Any]:
    """The MCP server whose tools are the API's, called with ``credentials(request_context)``."""
    server: Server[Any, Any] = Server(
        SERVER_NAME,
        instructions="The rsiweb Experiment OS: every tool is an ExpOS tool of your token's role. "
        "Errors start with a stable code; state_get_current_main, state_get_current_worker or "
        "state_get_current_reviewer (your role's) tells you where you stand, with your node's ETag.",
    )

    async def get(path: str, headers: dict[str, Any]) -> Any:
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
        headers: dict[str, Any] = dict(credentials(server.request_context))
        for argument, header in ((IDEMPOTENCY_ARGUMENT, "Idempotency-Key"), (IF_MATCH_ARGUMENT, "If-Match")):
            # A value that is no string stays an argument, so the API refuses it by its schema.
            if isinstance(args.get(argument), str):
                headers[header] = header_value(args.pop(argument))
        try:
            # ASCII JSON: a lone surrogate goes as its escape (the API refuses it, naming its path),
            # NaN as its token (refused as no JSON). Screening bounded the nesting.
            body = json.dumps(args).encode()
        except (ValueError, TypeError, RecursionError) as exc:  # not reachable from JSON input
            return tool_error("invalid_input", f"the arguments cannot be sent: {exc}")
        return await post_tool(client, headers, name, body)

    # Registered without decorator syntax: the SDK's decorator factories are unannotated. Its input check is
    # off: the REST path validates, and records the refusal (with any sealed-split request it
    # carried) where a check here would refuse unseen.
    server.list_tools()(list_tools)  # type: ignore[no-untyped-call]
    server.call_tool(validate_input=False)(call_tool)

    return server


# --- screening: what the SDK may read, and the answer to what it may not ------------------------------


@dataclass(frozen=True)
class Screened:
    """One incoming message after screening: for the SDK (``message``), or answered here (``answer``)."""

    message: types.JSONRPCMessage | None = None
    answer: dict[str, Any] | None = None
    status: int = 200  # of ``answer`` over HTTP


def _rpc_error(message_id: Any, kind: int, code: str, message: str) -> dict[str, Any]:
    """A JSON-RPC error whose message starts with a stable code, as the API's errors do."""
    error = {"code": kind, "message": f"{code}: {message}", "data": {"error": {"code": code, "message": message}}}
    return {"jsonrpc": "2.0", "id": message_id, "error": error}


def _sdk_message(raw: bytes, max_bytes: int) -> tuple[types.JSONRPCMessage | None, str, str]:
    """The message, or None with the stable code and message of why the SDK may not read it."""
    if len(raw) > max_bytes:
        return None, "request_too_large", f"The message exceeds the size limit ({max_bytes} bytes)."
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, "invalid_json", f"The message is not valid UTF-8: {exc}."
    if nesting_exceeds(raw, MAX_MESSAGE_DEPTH):
        return (
            None,
            "invalid_input",
            f"The message nests deeper than {MAX_MESSAGE_DEPTH} levels (its arguments: {MAX_ARGUMENT_DEPTH}); "
            "flatten them.",
        )
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, "invalid_json", f"The message is not JSON: {exc}."
    if _SURROGATE_ESCAPE.search(text) and _holds_lone_surrogate(data):
        # The SDK cannot re-encode it (its request check raises): the API refuses it, naming its path.
        return None, "invalid_input", "A string or key holds a lone surrogate."
    params = data.get("params") if isinstance(data, dict) else None
    arguments = params.get("arguments") if isinstance(params, dict) else None
    if isinstance(params, dict) and data.get("method") == "tools/call" and not isinstance(arguments, dict | None):
        return None, "invalid_input", "The arguments must be a JSON object."
    try:
        return types.JSONRPCMessage.model_validate(data), "", ""
    except ValidationError as exc:
        return None, "invalid_request", f"The message is no JSON-RPC message: {exc.errors()[0]['msg']}."


async def screen(
    raw: bytes, *, max_bytes: int, client: httpx.AsyncClient, headers: dict[str, Any], tail: bytes = b""
) -> Screened:
    """Screen one message; a tool call the SDK may not read goes to its REST endpoint as it came.

    What is forwarded is sure to be refused by the API's own screening, never run: a message over
    the limit is forwarded whole (the API refuses its size), else the arguments' bytes when the
    fault is in them, else the whole message (whose fault the API then finds, or which is no
    object of the tool's arguments).
    """
    message, code, why = _sdk_message(raw, max_bytes)
    if message is not None:
        return Screened(message=message)
    parts = rpc_parts(raw[: max_bytes + 1])
    # A message cut at the limit: its id may be past the cut, at its end (``tail``: its last bytes).
    message_id = parts.id if parts.id is not None or code != "request_too_large" else tail_id(tail)
    if parts.method == "tools/call" and parts.name is not None and message_id is not None:
        body = raw
        if code != "request_too_large" and parts.arguments is not None:
            start, end = parts.arguments
            arguments = raw[start:end]
            if _sdk_fault(arguments, code):
                body = arguments
        result = await post_tool(client, headers, parts.name, body)
        answer = {"jsonrpc": "2.0", "id": message_id, "result": result.model_dump(by_alias=True, exclude_none=True)}
        return Screened(answer=answer)
    kind = types.INVALID_REQUEST if code in ("invalid_request", "invalid_input") else types.PARSE_ERROR
    return Screened(answer=_rpc_error(message_id, kind, code, why), status=413 if code == "request_too_large" else 400)


# A \\u escape of a surrogate: an escaped pair (an emoji) matches too, and costs the walk below.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _holds_lone_surrogate(value: Any) -> bool:
    """Whether a string or key in ``value`` (nested at most MAX_MESSAGE_DEPTH levels) is no valid Unicode."""
    if isinstance(value, str):
        return any("\ud800" <= char <= "\udfff" for char in value)
    if isinstance(value, dict):
        return any(_holds_lone_surrogate(k) or _holds_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_lone_surrogate(item) for item in value)
    return False


def _sdk_fault(arguments: bytes, code: str) -> bool:
    """Whether the arguments' bytes alone carry the fault ``code`` named in their message."""
    try:
        text = arguments.decode("utf-8")
    except UnicodeDecodeError:
        return True
    if nesting_exceeds(arguments, MAX_ARGUMENT_DEPTH):
        return True
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return True
    return code == "invalid_input" and (not isinstance(value, dict) or _holds_lone_surrogate(value))


# --- stdio: `expos mcp` -------------------------------------------------------------------------------


TAIL_BYTES = 4096
# Past this, a message is not read to its end (HTTP; over stdio the rest of the line is skipped):
# its id, at its end, goes unread and it is answered with a JSON-RPC error of id null.
MAX_DRAINED_BYTES = 256 * 1024 * 1024


class _StdinLines:
    """stdin as lines of at most ``limit`` + 1 bytes (a longer line is cut there, the rest skipped),
    each with its last TAIL_BYTES (where a cut line's id is)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stdin = sys.stdin.buffer

    async def __anext__(self) -> tuple[bytes, bytes]:
        line = await anyio.to_thread.run_sync(self.stdin.readline, self.limit + 1)
        if not line:
            raise StopAsyncIteration
        tail = line[-TAIL_BYTES:]
        while not tail.endswith(b"\n"):
            # Read on to the line's end, keeping only its tail.
            more = await anyio.to_thread.run_sync(self.stdin.readline, 1 << 16)
            if not more:
                break
            tail = (tail + more)[-TAIL_BYTES:]
        return line, tail

    def __aiter__(self) -> _StdinLines:
        return self


def _encoded(message: dict[str, Any]) -> bytes:
    # ASCII JSON: the SDK's own writer raises on a lone surrogate, and the answer would be lost.
    return json.dumps(message, ensure_ascii=True).encode() + b"\n"


@contextlib.asynccontextmanager
async def screened_stdio(
    *, client: httpx.AsyncClient, headers: dict[str, Any], max_bytes: int
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[SessionMessage]]]:
    """The SDK's stdio transport, with every line screened: every request gets an answer."""
    read_writer: MemoryObjectSendStream[Any]
    read_stream: MemoryObjectReceiveStream[Any]
    write_stream: MemoryObjectSendStream[SessionMessage]
    write_reader: MemoryObjectReceiveStream[SessionMessage]
    read_writer, read_stream = anyio.create_memory_object_stream(0)
    write_stream, write_reader = anyio.create_memory_object_stream(0)
    stdout = anyio.wrap_file(sys.stdout.buffer)
    lock = anyio.Lock()

    async def write(data: bytes) -> None:
        async with lock:  # answers from the screen and from the server, one whole line at a time
            await stdout.write(data)
            await stdout.flush()

    async def reader() -> None:
        async with read_writer:
            async for line, tail in _StdinLines(max_bytes + ENVELOPE_BYTES):
                if not line.strip():
                    continue
                screened = await screen(line.rstrip(b"\r\n"), max_bytes=max_bytes + ENVELOPE_BYTES,
                                        client=client, headers=headers, tail=tail.rstrip(b"\r\n"))  # fmt: skip
                if screened.message is not None:
                    await read_writer.send(SessionMessage(screened.message))
                elif screened.answer is not None:
                    await write(_encoded(screened.answer))

    async def writer() -> None:
        async with write_reader:
            async for session_message in write_reader:
                dumped = session_message.message.model_dump(by_alias=True, exclude_none=True, mode="json")
                await write(_encoded(dumped))

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        yield read_stream, write_stream


async def serve_stdio(*, url: str, token: str, max_request_bytes: int = 2 * 1024 * 1024) -> None:
    """Serve MCP on stdin/stdout for one token, calling the API at ``url``.

    ``max_request_bytes`` only bounds what is read per line; the API's limit is the API's to apply.
    """
    headers = {"Authorization": f"Bearer {token}".encode("latin-1", "replace")}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=TIMEOUT_SECONDS) as client:
        server = build_server(client=client, credentials=lambda _context: headers)
        async with screened_stdio(client=client, headers=headers, max_bytes=max_request_bytes) as (read, write):
            await server.run(read, write, server.create_initialization_options())


def run_stdio(*, url: str, token: str) -> None:
    # The server's body limit, where the harness's host is told it (as the server is: RSI_MAX_REQUEST_BYTES).
    limit = int(os.environ.get("RSI_MAX_REQUEST_BYTES") or 2 * 1024 * 1024)
    anyio.run(lambda: serve_stdio(url=url, token=token, max_request_bytes=limit))


# --- streamable HTTP, mounted in rsiweb/asgi.py -----------------------------------------------------------


def _header(scope: dict[str, Any], name: bytes) -> bytes:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value)
    return b""


def _scope_credentials(scope: dict[str, Any]) -> dict[str, Any]:
    """The request's bearer token and Host (Django checks it against ALLOWED_HOSTS), as the bytes sent."""
    return {"Authorization": _header(scope, b"authorization"), "Host": _header(scope, b"host")}


def _request_credentials(context: Any) -> dict[str, Any]:
    return _scope_credentials(context.request.scope)


def _bearer(scope: dict[str, Any]) -> bool:
    value = _header(scope, b"authorization")
    return value[:7].lower() == b"bearer " and len(value) > 7


TOKEN_CHECK_SECONDS = 60


class McpHttpApp:
    """The ASGI app at MCP_PATH: a stateless streamable-HTTP MCP server over ``api_app`` (Django).

    Before the SDK sees a request, the token is checked (401 at once for one the API does not know,
    so no stream opens for it) and a POST's body is screened (``screen``).

    The SDK's session manager needs a running task group. The web server runs without the ASGI
    lifespan protocol (Django has none; apps/core/management/commands/serve.py), so the group is
    opened on the first request, in a task that lives as long as the event loop.
    """

    def __init__(self, api_app: Any, *, max_request_bytes: int) -> None:
        # The JSON-RPC envelope around a tool's arguments is small: a body the REST view would take
        # fits, with room for it; a larger one is forwarded and the REST view refuses it (413, recorded).
        self.max_request_bytes = max_request_bytes + ENVELOPE_BYTES
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=api_app), base_url="http://rsiweb", timeout=TIMEOUT_SECONDS
        )
        self.server = build_server(client=self.client, credentials=_request_credentials)
        self._manager: StreamableHTTPSessionManager | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = asyncio.Event()
        self._holder: asyncio.Task[None] | None = None
        # Tokens the API knew lately (by digest, until a time): a stream or call of a known token
        # skips the check; the API still authenticates each tool call itself.
        self._known: dict[str, float] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not _bearer(scope):
            await _respond(send, 401, _NOT_AUTHENTICATED, (b"www-authenticate", b'Bearer realm="api"'))
            return
        refused = await self._refused_token(scope)
        if refused is not None:
            status, body = refused
            challenge = [(b"www-authenticate", b'Bearer realm="api"')] if status == 401 else []
            await _respond(send, status, body, *challenge)
            return
        if scope.get("method") == "POST":
            body, tail = await _read_body(receive, self.max_request_bytes)
            credentials = _scope_credentials(scope)
            screened = await screen(
                body, max_bytes=self.max_request_bytes, client=self.client, headers=credentials, tail=tail
            )
            if screened.answer is not None:
                await _respond(send, screened.status, json.dumps(screened.answer).encode())
                return
            receive = _replayed(body, receive)
        manager = await self._running()
        await manager.handle_request(scope, receive, send)

    async def _refused_token(self, scope: dict[str, Any]) -> tuple[int, bytes] | None:
        """The API's refusal (status, body) of the request's token, or None when the API knows it.

        Fails closed: whatever keeps the API from saying yes (an unknown token, the rate limit,
        the database away) is answered at once, so no stream opens on a token nobody checked.
        """
        digest = hashlib.sha256(_header(scope, b"authorization")).hexdigest()
        now = time.monotonic()
        if self._known.get(digest, 0.0) > now:
            return None
        try:
            response = await self.client.get(f"{API_PREFIX}/tools", headers=_scope_credentials(scope))
        except httpx.HTTPError as exc:
            body = {"error": {"code": "api_unreachable", "message": f"The API did not answer: {exc}"}}
            return 503, json.dumps(body).encode()
        if not response.is_success:
            return response.status_code, response.content
        if len(self._known) > 10_000:
            self._known = {k: v for k, v in self._known.items() if v > now}
        self._known[digest] = now + TOKEN_CHECK_SECONDS
        return None

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


async def _read_body(receive: Any, limit: int) -> tuple[bytes, bytes]:
    """The request body, or its first ``limit`` + 1 bytes when it is longer; and its last TAIL_BYTES."""
    chunks: list[bytes] = []
    size = 0
    tail = b""
    while size <= MAX_DRAINED_BYTES:
        event = await receive()
        if event["type"] != "http.request":
            break  # the client went away: what came is screened, and the answer goes nowhere
        chunk = event.get("body", b"")
        if size <= limit:
            chunks.append(chunk)
        size += len(chunk)
        tail = (tail + chunk)[-TAIL_BYTES:]
        if not event.get("more_body", False):
            break
    return b"".join(chunks)[: limit + 1], tail


def _replayed(body: bytes, receive: Any) -> Any:
    """``receive`` for the SDK: the body read for screening first, then the connection's own events."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Any:
        return pending.pop() if pending else await receive()

    return replay


_NOT_AUTHENTICATED = json.dumps(
    {"error": {"code": "not_authenticated", "message": "Send your agent token: Authorization: Bearer <token>."}}
).encode()


async def _respond(send: Any, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
