"""Channel-layer group names, built only here so publishers and consumers cannot drift apart.

Names are ASCII and far below the layers' 100-character limit: a prefix and a canonical UUID.
"""

from __future__ import annotations

from uuid import UUID


def _group(prefix: str, key: UUID | str) -> str:
    # Parsing through UUID rejects anything that is not a UUID and canonicalises the spelling
    # (case, braces), so "run-<UUID>" from a URL and from a model field name the same group.
    return f"{prefix}-{UUID(str(key))}"


def run_group(run_uuid: UUID | str) -> str:
    """Everything a run's pages show live: run status, research DAG nodes, experiments, guidance."""
    return _group("run", run_uuid)


def job_group(job_uuid: UUID | str) -> str:
    """One job's progress, metrics and log lines."""
    return _group("job", job_uuid)
