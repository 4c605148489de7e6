"""The MCP SDK's own client as an agent of a run, over either transport, for the tests.

stdio: ``expos mcp`` as a subprocess (this checkout's module, since the console script of an editable
install may be another checkout's); streamable HTTP: ``/api/v1/mcp`` of a server serving rsiweb.asgi.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from apps.expos.mcp_server import MCP_PATH

ROOT = Path(__file__).resolve().parents[2]
EXPOS_MCP = [sys.executable, "-m", "apps.expos.cli", "mcp"]
TRANSPORTS = ("stdio", "http")


@contextlib.asynccontextmanager
async def mcp_session(transport: str, base_url: str, token: str) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session as the token's agent."""
    if transport == "stdio":
        params = StdioServerParameters(
            command=EXPOS_MCP[0], args=EXPOS_MCP[1:], env={"RSI_URL": base_url, "RSI_TOKEN": token}, cwd=ROOT
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session
        return
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(base_url + MCP_PATH, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def as_agent(transport: str, base_url: str, token: str, script: Any) -> Any:
    """Run ``await script(session)`` in a fresh session; returns what it returned."""

    async def main() -> Any:
        async with mcp_session(transport, base_url, token) as session:
            return await script(session)

    return anyio.run(main)


def command_sections(output: str) -> dict[str, str]:
    """start_run --harness's output by its ``--- title ---`` lines ("head" before the first)."""
    sections: dict[str, list[str]] = {"head": []}
    current = "head"
    for line in output.splitlines():
        if line.startswith("--- ") and line.endswith(" ---"):
            current = line[4:-4]
            sections[current] = []
        else:
            sections[current].append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


# --- raw JSON-RPC: what the SDK's client cannot send (lone surrogates, invalid UTF-8, deep nesting) ---


class RawStdio:
    """``expos mcp`` as a subprocess spoken to in raw JSON-RPC lines, after the SDK's handshake.

    Each answer is awaited with a deadline, so a request the server never answers fails the test
    instead of hanging it.
    """

    def __init__(self, base_url: str, token: str, *, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            EXPOS_MCP,
            env={**os.environ, "RSI_URL": base_url, "RSI_TOKEN": token, **(env or {})},
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        version = types.LATEST_PROTOCOL_VERSION
        hello = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
        self.ask(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}).encode())
        self.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)

    def send(self, message: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(message + b"\n")
        self.process.stdin.flush()

    def ask(self, message: bytes, timeout: float = 60) -> Any:
        """Send one line; the next line the server writes, as JSON (queue.Empty when none came)."""
        self.send(message)
        return json.loads(self._lines.get(timeout=timeout))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def raw_http(base_url: str, token: str, message: bytes) -> httpx.Response:
    """One raw JSON-RPC message POSTed to the stateless HTTP mount (no handshake needed)."""
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    return httpx.post(base_url + MCP_PATH, content=message, headers=headers, timeout=60)
