"""``manage.py serve``: the web server of rsiweb (REST API, dashboard, websockets) under uvicorn.

One command for every deployment (compose.yaml, ``manage.py demo``, the benchmarks), so what
is measured is what runs. It replaces itself with ``python -m uvicorn rsiweb.asgi:application``
(httptools parser, uvloop, websockets), so that rsiweb/asgi.py configures the process from a
fresh start — the pooled database connections of the web process among it.

``--processes`` (``RSI_WEB_PROCESSES``) runs several server processes on one port; the live
dashboard's messages cross processes through the channel layer (Redis), so any process may
serve any browser. Each process answers HTTP on ``RSI_HTTP_THREADS`` threads.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.core.procs import PortInUse, port_check_free
from rsiweb import env


def uvicorn_command(*, host: str, port: int, processes: int = 1, app: str = "rsiweb.asgi:application") -> list[str]:
    """The uvicorn command line that serves ``app`` (also used by the demo's stack and the benchmarks)."""
    return [
        sys.executable, "-m", "uvicorn", app,
        "--host", host, "--port", str(port), "--workers", str(max(1, processes)),
        "--http", "httptools", "--loop", "uvloop", "--ws", "websockets-sansio",
        # Django has no lifespan protocol. Tool calls are recorded as events; the access log
        # would repeat them at a cost per request, so uvicorn logs warnings and errors only.
        "--lifespan", "off", "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip


class Command(BaseCommand):
    help = "Serve rsiweb's web app (API, dashboard, websockets) with uvicorn."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--processes",
            type=int,
            default=env.integer("RSI_WEB_PROCESSES", 1),
            help="server processes on the port (RSI_WEB_PROCESSES; default 1)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["processes"] < 1:
            self.stderr.write("--processes must be at least 1")
            sys.exit(2)
        try:
            # uvicorn would fail to bind too, but only after a client may have reached the stale server.
            port_check_free(options["host"], options["port"])
        except PortInUse as exc:
            raise CommandError(str(exc)) from None
        command = uvicorn_command(host=options["host"], port=options["port"], processes=options["processes"])
        self.stdout.write(f"serving http://{options['host']}:{options['port']}/ ({options['processes']} process(es))")
        self.stdout.flush()
        os.execv(sys.executable, command)  # noqa: S606 - our own interpreter and arguments, no shell
