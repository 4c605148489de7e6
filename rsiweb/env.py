"""Reading configuration from the environment, in one place.

Every setting of rsiweb comes from an environment variable (DESIGN.md, "Configuration").
A variable ``NAME_FILE`` pointing to a file is read instead of ``NAME`` so secrets can come
from mounted files (Docker/Kubernetes secrets) rather than the process environment.
"""

from __future__ import annotations

import os
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigurationError(RuntimeError):
    """A setting is missing or malformed; the message says which and how to fix it."""


def get(name: str, default: str | None = None) -> str | None:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        return Path(file_path).read_text().strip()
    return os.environ.get(name, default)


def text(name: str, default: str = "") -> str:
    value = get(name)
    return default if value is None else value


def boolean(name: str, default: bool = False) -> bool:
    value = get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigurationError(f"{name}={value!r} is not a boolean; use 1/0, true/false, yes/no.")


def integer(name: str, default: int) -> int:
    value = get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(f"{name}={value!r} is not an integer.") from None


def number(name: str, default: float) -> float:
    value = get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise ConfigurationError(f"{name}={value!r} is not a number.") from None


def listing(name: str, default: list[str] | None = None) -> list[str]:
    value = get(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]
