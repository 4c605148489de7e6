"""Fixtures of the dashboard tests: one person per role and a complete little run."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.apps.dashboard.world import build_world, make_people


@pytest.fixture
def anyio_backend():
    # Channels is asyncio code.
    return "asyncio"


@pytest.fixture
def people(db):
    return make_people()


@pytest.fixture
def world(people):
    return build_world(people=people)


@pytest.fixture
def as_role(people):
    """A test client signed in as ``role`` (viewer, operator, admin, nobody) or anonymous (None)."""

    def make(role: str | None, **client_kwargs) -> Client:
        client = Client(**client_kwargs)
        if role is not None:
            client.force_login(people[role])
        return client

    return make
