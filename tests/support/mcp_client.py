"""The MCP SDK's own client as an agent of a run, over either transport, for the tests.

stdio: ``expos mcp`` as a subprocess (this checkout's module, since the console script of an editable
install may be another checkout's); streamable HTTP: ``/api/v1/mcp`` of a server serving rsiweb.asgi.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from apps.expos.mcp_server import MCP_PATH

ROOT = Path(__file__).resolve().parents[2]
EXPOS_MCP = [sys.executable, "-m", "apps.expos.cli", "mcp"]


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
