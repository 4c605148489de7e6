from __future__ import annotations

import pytest

from tests.fakes import closed_port_url


@pytest.fixture
def closed_url() -> str:
    """A loopback URL with nothing listening, for the unreachable cases."""
    return closed_port_url()
