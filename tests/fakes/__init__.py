"""Loopback stand-ins for the remote services the discovery connectors reach (STYLE.md 29).

Each fake is a real HTTP server on 127.0.0.1 in a daemon thread, answering the real service's
wire protocol (paths, query parameters, JSON/XML shapes, headers), so a connector under test
runs its real HTTP client end to end. Subclasses implement ``route``.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased: HTTP header names are case-insensitive

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        status, json.dumps(data).encode(), {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
    )


def text_response(text: str, content_type: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(status, text.encode(), {"Content-Type": content_type, **(headers or {})})


class FakeServer:
    """Start with ``with FakeX(...) as fake:``; ``fake.url`` is its base URL, ``fake.requests`` the log."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._server: ThreadingHTTPServer | None = None

    def route(self, request: Request) -> Response:
        raise NotImplementedError

    @property
    def url(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                request = Request(
                    self.command, parts.path, parse_qs(parts.query), {k.lower(): v for k, v in self.headers.items()}
                )
                fake.requests.append(request)
                try:
                    response = fake.route(request)
                except Exception as exc:  # a fake bug must show up as a 500, not a hung client
                    response = json_response({"error": f"fake crashed: {exc!r}"}, 500)
                self.send_response(response.status)
                for name, value in response.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(response.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(response.body)

            do_GET = do_HEAD = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest output clean

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def closed_port_url() -> str:
    """A loopback URL nobody listens on: bind a port, then let it go."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
