"""What MCP adds to a tool call: tools/call against the REST call it wraps (issue 17).

    REDIS_URL=redis://127.0.0.1:6379/6 timeout 900 .venv/bin/python bench/mcp_overhead.py

One web server (``manage.py serve``: uvicorn on rsiweb.asgi, as deployed) on a fresh database
``rsiweb_bench_mcp``; one running run and one Worker token. The same tool call, ``public_check_quota``
(a read: budget and allowance, three queries), is timed three ways, in alternating slices so that all
three see the same load on a shared machine:

- REST: ``POST /api/v1/tools/public_check_quota`` over a keep-alive ``requests.Session``;
- MCP over streamable HTTP: ``tools/call`` to ``/api/v1/mcp`` (stateless, JSON answers) through the
  SDK's ``ClientSession``; the server forwards it in-process to the same REST view;
- MCP over stdio: ``tools/call`` to an ``expos mcp`` subprocess, which makes the REST call over HTTP.

Each figure is the client's wall time per call (p50 and p95); the overhead is MCP minus REST.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _setup import django_on_bench_db, percentile  # noqa: E402
from api_vs_mlflow import SECRET, free_port, stop, wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DB = "rsiweb_bench_mcp"
TOOL = "public_check_quota"


def build_world() -> str:
    """A running run and one Worker token, made by the app's own services."""
    from apps.expos.auth import agent_token_issue
    from apps.research.choices import NodeKind, RunStatus
    from apps.research.services import node_create, run_set_status
    from tests.factories import make_run

    run = run_set_status(run=make_run(name="mcp-overhead"), status=RunStatus.RUNNING, actor="bench")
    node = node_create(run=run, kind=NodeKind.WORKER, task="measure")
    return agent_token_issue(run=run, node=node, role=NodeKind.WORKER)[0]


def start_server(port: int, url: str, log: Path = Path("/tmp/bench-mcp-rsiweb.log")) -> subprocess.Popen:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "rsiweb.settings.base", "DATABASE_URL": url, "SECRET_KEY": SECRET,
           "RSI_LOG_LEVEL": "WARNING", "RSI_TOKEN_RATE": "10000000/min"}  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    wait_for(f"http://127.0.0.1:{port}/healthz", process, log)
    return process


@asynccontextmanager
async def mcp_sessions(base: str, token: str) -> AsyncIterator[tuple[Any, Any]]:
    """Two initialized MCP client sessions with the token: streamable HTTP, and stdio (expos mcp)."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "apps.expos.cli", "mcp"],
                                   env={"RSI_URL": base, "RSI_TOKEN": token}, cwd=ROOT)  # fmt: skip
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        streamable_http_client(f"{base}/api/v1/mcp", http_client=http) as (hr, hw, _),
        ClientSession(hr, hw) as over_http,
        stdio_client(params) as (sr, sw),
        ClientSession(sr, sw) as over_stdio,
    ):
        await over_http.initialize()
        await over_stdio.initialize()
        yield over_http, over_stdio


async def measure(base: str, token: str, *, slices: int, per_slice: int) -> dict[str, list[float]]:
    from mcp import ClientSession

    rest = requests.Session()
    rest.headers.update({"Authorization": f"Bearer {token}", "Content-Type": "application/json"})

    async def rest_call() -> None:
        response = rest.post(f"{base}/api/v1/tools/{TOOL}", data=b"{}", timeout=30)
        if response.status_code != 200:
            raise RuntimeError(response.text[:300])

    times: dict[str, list[float]] = {"REST": [], "MCP streamable HTTP": [], "MCP stdio (expos mcp)": []}
    async with mcp_sessions(base, token) as (over_http, over_stdio):

        def mcp_call(session: ClientSession) -> Any:
            async def call() -> None:
                result = await session.call_tool(TOOL, {})
                if result.isError:
                    raise RuntimeError(result.content[0].text)

            return call

        calls = {"REST": rest_call, "MCP streamable HTTP": mcp_call(over_http),
                 "MCP stdio (expos mcp)": mcp_call(over_stdio)}  # fmt: skip
        for call in calls.values():  # warm-up: connections, code paths, the server's tool cache
            for _ in range(5):
                await call()
        for index in range(slices):
            order = list(calls.items())
            order = order[index % 3 :] + order[: index % 3]  # rotate who goes first
            for name, call in order:
                for _ in range(per_slice):
                    started = time.perf_counter()
                    await call()
                    times[name].append(time.perf_counter() - started)
    rest.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=20)
    parser.add_argument("--per-slice", type=int, default=25)
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    url = django_on_bench_db(DB)
    token = build_world()
    port = free_port()
    server = start_server(port, url)
    try:
        load_before = os.getloadavg()[0]
        times = anyio.run(lambda: measure(f"http://127.0.0.1:{port}", token, slices=args.slices,
                                          per_slice=args.per_slice))  # fmt: skip
        load_after = os.getloadavg()[0]
    finally:
        stop(server)
    rest_p50 = statistics.median(times["REST"]) * 1000
    rest_p95 = percentile(times["REST"], 0.95) * 1000
    print(f"{TOOL}, {args.slices} slices x {args.per_slice} calls each; load {load_before:.1f} -> {load_after:.1f}")
    print(f"{'path':<24} {'calls':>6} {'p50 ms':>8} {'p95 ms':>8} {'p50 over REST':>14} {'p95 over REST':>14}")
    for name, values in times.items():
        p50, p95 = statistics.median(values) * 1000, percentile(values, 0.95) * 1000
        print(f"{name:<24} {len(values):>6} {p50:>8.2f} {p95:>8.2f} {p50 - rest_p50:>+14.2f} {p95 - rest_p95:>+14.2f}")


if __name__ == "__main__":
    main()
