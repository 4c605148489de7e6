"""A harness run's call overhead per tool: the expos CLI, MCP (streamable HTTP, stdio) and REST (issue 31).

    REDIS_URL=redis://127.0.0.1:6379/3 timeout 900 .venv/bin/python bench/harness_call_overhead.py

One web server (``manage.py serve``: uvicorn on rsiweb.asgi, as deployed) on a fresh database
``rsiweb_bench_harness``; one running run in external (harness) mode, so every call is also written
as the node's transcript turn, as in a harness run; one Worker token and one datapool entry. Each
tool is called four ways, in rotating slices so all see the same load on a shared machine:

- REST: ``POST /api/v1/tools/<tool>`` over a keep-alive ``requests.Session``;
- MCP streamable HTTP: ``tools/call`` to ``/api/v1/mcp`` through the SDK's ``ClientSession``;
- MCP stdio: ``tools/call`` to an ``expos mcp`` subprocess (what Claude Code / Codex launch);
- CLI: one ``python -m apps.expos.cli <tool> --flags`` process per call, as an agent with a shell
  runs it (interpreter start, the tool definitions fetched, the call, JSON printed).

Tools: ``public_check_quota`` (a small read), ``worker_show_datapool`` (a listing),
``events_tail`` (20 events) and ``worker_update_readme`` (a write: an append-only note). Figures
are the client's wall time per call (p50, p95) and the overhead over REST at p50.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _setup import django_on_bench_db, percentile  # noqa: E402
from api_vs_mlflow import free_port, stop  # noqa: E402
from mcp_overhead import mcp_sessions, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DB = "rsiweb_bench_harness"
PATHS = ("REST", "MCP streamable HTTP", "MCP stdio", "CLI")


def build_world() -> tuple[str, dict[str, dict[str, Any]]]:
    """An external-mode running run, a Worker token and a datapool entry; the calls to time."""
    from apps.datapool.services import data_register_upload
    from apps.expos.auth import agent_token_issue
    from apps.research.choices import AgentMode, NodeKind, RunStatus
    from apps.research.services import node_create, run_set_status
    from tests.factories import make_run

    run = make_run(name="harness-overhead")
    run.agent_mode = AgentMode.EXTERNAL
    run.save(update_fields=["agent_mode"])
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="bench")
    node = node_create(run=run, kind=NodeKind.WORKER, task="measure")
    rows = b'{"prompt": "Question: 2 + 3?\\nAnswer:", "completion": " 5"}\n'
    entry = data_register_upload(content=rows, sha256=hashlib.sha256(rows).hexdigest(), size=len(rows),
                                 name="bench rows", generator="bench", run=run, node=node)  # fmt: skip
    token = agent_token_issue(run=run, node=node, role=NodeKind.WORKER)[0]
    calls = {
        "public_check_quota": {},
        "worker_show_datapool": {"limit": 5},
        "events_tail": {"limit": 20},
        "worker_update_readme": {"data": entry.handle, "text": "bench note"},
    }
    return token, calls


def cli_flags(args: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    for key, value in args.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


async def measure(base: str, token: str, calls: dict[str, dict[str, Any]], *, slices: int, per_slice: int,
                  cli_per_slice: int) -> dict[tuple[str, str], list[float]]:  # fmt: skip
    rest = requests.Session()
    rest.headers.update({"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    cli_env = {**os.environ, "RSI_URL": base, "RSI_TOKEN": token}
    times: dict[tuple[str, str], list[float]] = {(tool, path): [] for tool in calls for path in PATHS}
    async with mcp_sessions(base, token) as (over_http, over_stdio):

        async def call(path: str, tool: str, args: dict[str, Any]) -> None:
            if path == "REST":
                response = rest.post(f"{base}/api/v1/tools/{tool}", json=args, timeout=30)
                if response.status_code != 200:
                    raise RuntimeError(response.text[:300])
            elif path == "CLI":
                done = subprocess.run([sys.executable, "-m", "apps.expos.cli", tool, *cli_flags(args)], cwd=ROOT,
                                      env=cli_env, capture_output=True, text=True, timeout=60)  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(done.stderr[-300:])
            else:
                session = over_http if path == "MCP streamable HTTP" else over_stdio
                result = await session.call_tool(tool, args)
                if result.isError:
                    raise RuntimeError(result.content[0].text)

        for tool, args in calls.items():  # warm-up: connections, code paths, the server's caches
            for path in PATHS:
                for _ in range(2):
                    await call(path, tool, args)
        for index in range(slices):
            order = list(PATHS[index % 4 :] + PATHS[: index % 4])  # rotate who goes first
            for tool, args in calls.items():
                for path in order:
                    for _ in range(cli_per_slice if path == "CLI" else per_slice):
                        started = time.perf_counter()
                        await call(path, tool, args)
                        times[(tool, path)].append(time.perf_counter() - started)
    rest.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=6)
    parser.add_argument("--per-slice", type=int, default=10)
    parser.add_argument("--cli-per-slice", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    url = django_on_bench_db(DB)
    token, calls = build_world()
    port = free_port()
    server = start_server(port, url)
    try:
        load_before = os.getloadavg()[0]
        times = anyio.run(lambda: measure(f"http://127.0.0.1:{port}", token, calls, slices=args.slices,
                                          per_slice=args.per_slice, cli_per_slice=args.cli_per_slice))  # fmt: skip
        load_after = os.getloadavg()[0]
    finally:
        stop(server)
    print(f"{args.slices} slices; per slice {args.per_slice} calls per tool and path, {args.cli_per_slice} for the "
          f"CLI; load {load_before:.1f} -> {load_after:.1f}")  # fmt: skip
    print(f"{'tool':<22} {'path':<20} {'calls':>5} {'p50 ms':>8} {'p95 ms':>8} {'p50 over REST':>14}")
    for tool in calls:
        rest_p50 = statistics.median(times[(tool, "REST")]) * 1000
        for path in PATHS:
            values = times[(tool, path)]
            p50, p95 = statistics.median(values) * 1000, percentile(values, 0.95) * 1000
            print(f"{tool:<22} {path:<20} {len(values):>5} {p50:>8.1f} {p95:>8.1f} {p50 - rest_p50:>+14.1f}")


if __name__ == "__main__":
    main()
