"""Django's Redis cache with one connection pool per process.

Django keeps a cache object per *context* (``CacheHandler`` is an asgiref ``Local`` that is not
thread-critical), and each object builds its own ``RedisCacheClient`` and with it its own
connection pool. Under the web server every request runs in a fresh context, so every request
opened a new Redis connection for the token throttle — one TCP handshake and HELLO per API
call. The client (pools included) is shared here per process and configuration; redis-py's
pools are thread-safe and re-create their connections in a forked child.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient as DjangoRedisCacheClient
from django.utils.functional import cached_property

_CLIENTS: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


class RedisCacheClient(DjangoRedisCacheClient):
    """Django's client, keeping one ``redis.Redis`` per pool: building one costs ~0.2 ms (a table of
    170 response callbacks), and Django built one per cache call — two per throttled request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._redis_clients: dict[int, Any] = {}

    # The underscored names are Django's own (django/core/cache/backends/redis.py), which its
    # stubs do not declare; tests/apps/core/test_cache.py runs them against the real Redis.
    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        index = self._get_connection_pool_index(write)  # type: ignore[attr-defined]
        client = self._redis_clients.get(index)
        if client is None:
            pool = self._get_connection_pool(write)  # type: ignore[attr-defined]
            client = self._redis_clients[index] = self._client(connection_pool=pool)  # type: ignore[attr-defined]
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = RedisCacheClient

    @cached_property
    def _cache(self) -> Any:
        servers: list[str] = self._servers  # type: ignore[attr-defined]
        options: dict[str, Any] = self._options  # type: ignore[attr-defined]
        key = (self._class, tuple(servers), repr(sorted(options.items())))
        with _LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = self._class(servers, **options)
        return client
