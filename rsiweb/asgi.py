"""ASGI entry point: HTTP through Django's WSGI handler on a thread pool, websockets through Channels.

Django's own ASGI handler runs a synchronous view by hopping between the event loop and a
worker thread several times per request (middleware, view, response, connection clean-up);
measured here it costs ~3 ms a request on top of the view — more than a whole ExpOS tool call.
Every view of rsiweb is synchronous, so HTTP requests go to the WSGI handler instead, run on a
pool of ``RSI_HTTP_THREADS`` threads by a2wsgi; websockets (the live dashboard) stay on Channels.
One server, one port, either way (docs/benchmarks.md, "API vs MLflow").

The MCP server (apps/expos/mcp_server.py) is mounted at ``/api/v1/mcp`` beside the Django app: the
SDK's streamable-HTTP server is ASGI, stateless, and calls the REST tool endpoints in-process.

The process that serves this module borrows its PostgreSQL connections from a pool sized to
those threads (``RSI_DB_POOL``, rsiweb/settings/base.py) unless the environment sets one.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from django.conf import settings

from rsiweb import env

HTTP_THREADS = max(1, env.integer("RSI_HTTP_THREADS", 8))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings.base")
if not settings.configured:
    # This process is the server (nothing has read the settings yet, as a test process or a
    # management command would have): a pool for the threads, Channels' database thread and one
    # spare. Only for this process: Celery workers are started separately and keep plain
    # connections (their forked children must not share a pool's sockets).
    os.environ.setdefault("RSI_DB_POOL", str(HTTP_THREADS + 2))
    # Events its calls insert unsealed are sealed by a thread of this process, not by the call
    # before it answers (apps.experiments.events._BackgroundSealer); it borrows the spare connection.
    os.environ.setdefault("RSI_EVENT_SEAL_BACKGROUND", "1")

from a2wsgi import WSGIMiddleware  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

django_http_app = WSGIMiddleware(get_wsgi_application(), workers=HTTP_THREADS)

from apps.core.dbpool import pool_check_install  # noqa: E402

# A dead pooled connection found on checkout clears out the other dead ones (apps.core.dbpool).
pool_check_install()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from apps.expos.mcp_server import MCP_PATH, McpHttpApp  # noqa: E402
from rsiweb.routing import websocket_urlpatterns  # noqa: E402

mcp_http_app = McpHttpApp(django_http_app, max_request_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


async def http_app(scope: Any, receive: Any, send: Any) -> None:
    """MCP requests to the MCP server, everything else to Django."""
    if scope["path"].rstrip("/") == MCP_PATH:
        await mcp_http_app(scope, receive, send)
    else:
        await django_http_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Everything loaded so far (Django, the apps, their modules and settings) lives as long as the
# server: out of the collector's sight, a full collection no longer walks it. Without this, a
# request that allocates many objects (a 1,000-record listing) set off full collections that
# walked the whole process: a fifth of that request's CPU in the profile (bench/profile_append.py).
gc.freeze()
