"""Shared fixtures. Tests run on the real PostgreSQL and Redis (rsiweb.settings.test)."""

from __future__ import annotations

import pytest

from tests.factories import make_run


@pytest.fixture
def run(db):
    return make_run()
