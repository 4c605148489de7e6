"""Fixtures for the RSI-Dojo tests: the shared ci minibench and real gpu workers (tests/apps/jobs)."""

from __future__ import annotations

from tests.apps.jobs.conftest import _empty_broker_db, artifact_root, celery_worker, minibench_dir

__all__ = ["_empty_broker_db", "artifact_root", "celery_worker", "minibench_dir"]
