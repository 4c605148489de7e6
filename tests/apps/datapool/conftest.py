"""Datapool fixtures: a fresh artifact root and workspace per test."""

from __future__ import annotations

import uuid

import pytest

from tests.apps.benchmarks.minibench_fixture import minibench_root


@pytest.fixture
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.ARTIFACT_CACHE_DIR = str(tmp_path / "artifact-cache")
    return tmp_path / "artifacts"


@pytest.fixture
def memory_root(settings, tmp_path):
    # A fresh prefix per test: fsspec's memory filesystem is one store per process.
    settings.ARTIFACT_ROOT = f"memory://rsi-test/{uuid.uuid4().hex}"
    settings.ARTIFACT_CACHE_DIR = str(tmp_path / "artifact-cache")
    return settings.ARTIFACT_ROOT


@pytest.fixture
def sealed_root(settings, tmp_path):
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    return tmp_path / "sealed"


@pytest.fixture
def workspace(tmp_path):
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def built_minibench(tmp_path_factory):
    return minibench_root(tmp_path_factory)
