"""The Slurm executor's tests run against a real single-node Slurm cluster (tests/support/slurm.py),
started once per test session and stopped when it ends. Without Debian's slurm-wlm and munge these
tests fail, they are not skipped (``./dev test`` installs them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.apps.jobs.conftest import (  # noqa: F401 - the job engine's fixtures, shared
    _empty_broker_db,
    artifact_root,
    data_entry,
    job_runner_env,
    minibench_dir,
    theta0,
)
from tests.support.procs import ROOT
from tests.support.slurm import Cluster, slurm_cluster_running


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with slurm_cluster_running(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture
def slurm_executor(slurm_cluster: Cluster, monkeypatch, transactional_db, artifact_root) -> Cluster:  # noqa: F811
    """The Slurm executor on: this process submits, and its batch jobs see the test database.

    ``sbatch --export=ALL`` hands a batch job the submitter's environment, as in a deployment whose
    web and workers share the nodes' settings: so the test database, artifact store and liveness
    timing go into this process's environment, where the submitting code reads nothing of them.
    """
    env = job_runner_env(
        RSI_EXECUTOR="slurm",
        SLURM_CONF=str(slurm_cluster.conf),
        RSI_SLURM_DIR=str(slurm_cluster.folder / "out"),
        RSI_SLURM_WORKDIR=str(ROOT),
        RSI_SLURM_GPUS="0",
        RSI_SLURM_PARTITION="rsi",
    )
    for name, value in env.items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    return slurm_cluster
