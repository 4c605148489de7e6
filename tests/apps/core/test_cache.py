"""The Redis cache keeps one connection pool per process, whatever context a request runs in."""

from __future__ import annotations

import threading

import redis
from django.conf import settings
from django.core.cache import caches


def _in_fresh_contexts(count: int) -> list[tuple[object, object]]:
    """(cache object, its client) as seen by ``count`` threads, one after another — each thread a
    new context, as each request is under the web server."""
    seen = []

    def use_cache() -> None:
        cache = caches["default"]
        cache.set("rsiweb-test-cache-probe", 1, timeout=5)
        seen.append((cache, cache._cache))

    for _ in range(count):
        thread = threading.Thread(target=use_cache)
        thread.start()
        thread.join()
    return seen


def test_requests_in_fresh_contexts_reuse_one_redis_connection():
    assert settings.CACHES["default"]["BACKEND"] == "apps.core.cache.RedisCache"
    server = redis.Redis.from_url(settings.REDIS_URL)
    _in_fresh_contexts(1)  # the pool's first connection
    before = len(server.client_list())
    seen = _in_fresh_contexts(20)
    after = len(server.client_list())
    # Django gives each context its own cache object (the premise) ...
    assert len({id(cache) for cache, _ in seen}) > 1
    # ... and they share one client, so 20 "requests" opened no new connection.
    assert len({id(client) for _, client in seen}) == 1
    assert after - before <= 0, f"{after - before} new Redis connections for 20 requests"
