"""A loopback server speaking the OpenAI chat-completions protocol, with tool calls (STYLE.md 29).

``POST /v1/chat/completions`` answers with a real ``chat.completion`` object: an assistant message
with ``tool_calls`` (``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments a
JSON *string*, as the API sends them), a ``finish_reason`` and ``usage``. Replies come from a
``responder(body) -> Reply`` callable, so a test can script each agent's turns by looking at the
conversation (which agent is talking, what its last tool answered). Faults are injected in order:
``fail_next(429, retry_after=0)`` answers the next request with a rate-limit error, as the API does.
``GET /v1/models`` lists the model.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One assistant turn: text and/or tool calls. ``arguments`` may be a dict or a raw (even broken) string."""

    content: str = ""
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)


Responder = Callable[[dict[str, Any]], Reply]


def agent_handle(body: dict[str, Any]) -> str:
    """Which agent is talking: the handle the role prompt names (main, worker_0001, reviewer_0002)."""
    system = next((m.get("content", "") for m in body.get("messages", []) if m.get("role") == "system"), "")
    match = re.search(r"\b(main|worker_\d{4,}|reviewer_\d{4,})\b", system)
    return match.group(1) if match else "?"


def last_tool_answers(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool messages after the last assistant message, parsed from JSON where possible."""
    answers: list[dict[str, Any]] = []
    for message in reversed(body.get("messages", [])):
        if message.get("role") == "assistant":
            break
        if message.get("role") == "tool":
            try:
                answers.insert(0, json.loads(message.get("content") or "{}"))
            except json.JSONDecodeError:
                answers.insert(0, {"raw": message.get("content")})
    return answers


class FakeChatServer:
    """Start with ``with FakeChatServer(responder) as fake:``; point the SDK at ``fake.base_url``."""

    def __init__(self, responder: Responder, *, model: str = "fake-tool-model") -> None:
        self.responder = responder
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.faults: list[tuple[int, float | None]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") != "/v1/models":
                    self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
                    return
                self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model",
                                                             "owned_by": "fake"}]})  # fmt: skip

            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                with server._lock:
                    server.requests.append(body)
                    fault = server.faults.pop(0) if server.faults else None
                if fault is not None:
                    status, retry_after = fault
                    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
                    kind = "rate_limit_error" if status == 429 else "server_error"
                    self._send(status, {"error": {"message": f"injected {status}", "type": kind, "code": None}},
                               headers)  # fmt: skip
                    return
                try:
                    reply = server.responder(body)
                except Exception as exc:  # a responder bug shows up as a 500, never a hung client
                    self._send(500, {"error": {"message": f"fake responder crashed: {exc!r}", "type": "server_error"}})
                    return
                self._send(200, server._completion(body, reply))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def fail_next(self, status: int = 429, *, times: int = 1, retry_after: float | None = 0) -> None:
        with self._lock:
            self.faults.extend([(status, retry_after)] * times)

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        number = next(self._ids)
        calls = []
        for index, (name, arguments) in enumerate(reply.tool_calls):
            raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
            calls.append({"id": f"call_{number}_{index}", "type": "function",
                          "function": {"name": name, "arguments": raw}})  # fmt: skip
        message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if calls:
            message["tool_calls"] = calls
        prompt_tokens = len(json.dumps(body.get("messages", []))) // 4 + 1
        completion_tokens = len(json.dumps(message)) // 4 + 1
        return {
            "id": f"chatcmpl-fake-{number}",
            "object": "chat.completion",
            "created": 1_700_000_000 + number,
            "model": body.get("model", self.model),
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls" if calls else "stop"}
            ],  # fmt: skip
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },  # fmt: skip
        }

    def start(self) -> FakeChatServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Script:
    """A responder that plays each agent's turns in order (a list per agent handle).

    An entry is a :class:`Reply` or a callable ``(body) -> Reply | None``; a callable returning None
    is asked again on the agent's next request (it is waiting for something) and meanwhile the agent
    sends ``wait`` (by default a ``state_sync_results`` call), so a script can say "poll until the
    experiment has succeeded, then finalize". When an agent's list is used up, it answers with text
    only (no tool call).
    """

    def __init__(self, turns: dict[str, list[Reply | Callable[[dict[str, Any]], Reply | None]]], *,
                 wait: Reply | None = None) -> None:  # fmt: skip
        self.turns = {agent: list(entries) for agent, entries in turns.items()}
        self.wait = wait or Reply(tool_calls=[("state_sync_results", {})])
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        agent = agent_handle(body)
        with self.lock:
            entries = self.turns.get(agent) or self.turns.get("*") or []
            while entries:
                entry = entries[0]
                if isinstance(entry, Reply):
                    entries.pop(0)
                    return entry
                reply = entry(body)
                if reply is None:
                    return self.wait
                entries.pop(0)
                return reply
        return Reply(content="done")
