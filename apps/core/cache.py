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
from django.utils.functional import cached_property

_CLIENTS: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


class RedisCache(DjangoRedisCache):
    @cached_property
    def _cache(self) -> Any:
        key = (self._class, tuple(self._servers), repr(sorted(self._options.items())))
        with _LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = self._class(self._servers, **self._options)
        return client
