"""Test settings: the real PostgreSQL and Redis on 127.0.0.1 unless the environment says otherwise.

Otherwise only what makes tests faster (STYLE.md).
"""

from __future__ import annotations

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rsiweb")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
os.environ.setdefault("SECRET_KEY", "test-only-secret-key-not-for-production-0123456789")

from rsiweb.settings.base import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
