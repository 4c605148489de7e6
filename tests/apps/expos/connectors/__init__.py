"""Connector tests: each tool end to end against a loopback fake of its service (tests/fakes)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from apps.expos.connectors import ConnectorConfig, ConnectorError, build_connectors


def call(config: ConnectorConfig, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one tool as the registry would, and hold the answer to its declared output schema."""
    spec = build_connectors(config)[tool]
    result = spec(args)
    jsonschema.validate(result, spec.output_schema)
    return result


def error_of(config: ConnectorConfig, tool: str, args: dict[str, Any]) -> ConnectorError:
    with pytest.raises(ConnectorError) as caught:
        build_connectors(config)[tool](args)
    return caught.value
