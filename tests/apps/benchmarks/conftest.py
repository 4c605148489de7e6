"""Benchmark fixtures: private sealed and artifact roots per test, a built minibench per session."""

from __future__ import annotations

import pytest

from tests.apps.benchmarks.minibench_fixture import minibench_root, write_task_dir


@pytest.fixture
def sealed_root(settings, tmp_path):
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    return tmp_path / "sealed"


@pytest.fixture
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.ARTIFACT_CACHE_DIR = str(tmp_path / "artifact-cache")
    return tmp_path / "artifacts"


@pytest.fixture
def task_dir(tmp_path):
    return write_task_dir(tmp_path / "task")


@pytest.fixture(scope="session")
def built_minibench(tmp_path_factory):
    return minibench_root(tmp_path_factory)
