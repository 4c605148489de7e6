"""A real single-node Slurm cluster (Debian's slurmctld, slurmd and munge), for tests and bench/.

Started in a folder of the caller's, on free ports, as this machine's one node (CPU only: no
GRES), and stopped when the block ends — every daemon in its own process group on a Lifeline, so
none outlives its starter however it ends. ``./dev test`` installs the packages (slurm-wlm,
munge) when they are missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from apps.core.procs import Lifeline
from tests.support.services import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")


@dataclass
class Cluster:
    """The running cluster: its config file, node name and the commands' environment."""

    folder: Path
    conf: Path
    node: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr or done.stdout}"
        return done.stdout

    def state(self, slurm_id: str) -> str:
        out = self.run("squeue", "--noheader", "--states=all", f"--jobs={slurm_id}", "--format=%T")
        return out.strip()

    def show(self, slurm_id: str) -> str:
        return self.run("scontrol", "show", "job", slurm_id)

    def node_state(self, state: str) -> None:
        extra = ["reason=test"] if state == "drain" else []
        self.run("scontrol", "update", f"nodename={self.node}", f"state={state}", *extra)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name} ---\n{path.read_text(errors='replace')[-2000:]}"
            for path in sorted((self.folder / "log").glob("*.log"))
        )


def _binary(name: str) -> str:
    path = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()), None
    )
    assert path, f"{name} is not installed: ./dev test installs Debian's slurm-wlm and munge"
    return path


def _write_config(folder: Path, node: str) -> Path:
    conf = folder / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=rsitest",
                f"SlurmctldHost={node}(127.0.0.1)",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={folder / 'munge' / 'munge.sock'}",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"StateSaveLocation={folder / 'state'}",
                f"SlurmdSpoolDir={folder / 'spool'}",
                f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
                f"SlurmdPidFile={folder / 'slurmd.pid'}",
                f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={folder / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "SchedulerType=sched/backfill",
                "SchedulerParameters=sched_interval=1",
                "ReturnToService=2",
                "MpiDefault=none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "KillWait=5",
                "MinJobAge=600",
                f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
                f"PartitionName=rsi Nodes={node} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    return conf


@contextmanager
def slurm_cluster_running(folder: Path) -> Iterator[Cluster]:
    """A single-node cluster in ``folder`` (empty), up until the block ends; its daemons die with us."""
    for sub in ("state", "spool", "log", "munge", "out"):
        (folder / sub).mkdir()
    (folder / "munge").chmod(0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    conf = _write_config(folder, node)
    cluster = Cluster(folder=folder, conf=conf, node=node)
    munge = folder / "munge"
    commands = {
        "munged": [_binary("munged"), "-F", "-f", f"--socket={munge / 'munge.sock'}", f"--key-file={key}",
                   f"--log-file={folder / 'log' / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
                   f"--seed-file={munge / 'seed'}"],
        "slurmctld": [_binary("slurmctld"), "-D", "-i", "-f", str(conf)],
        "slurmd": [_binary("slurmd"), "-D", "-f", str(conf)],
    }  # fmt: skip
    lifeline = Lifeline()
    procs: list[subprocess.Popen] = []
    try:
        for name in DAEMONS:
            proc = subprocess.Popen(
                commands[name], env=cluster.env(), start_new_session=True,
                stdout=(folder / "log" / f"{name}.out").open("wb"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            lifeline.add(proc.pid)
            procs.append(proc)
            if name == "munged":
                _wait(lambda: (munge / "munge.sock").exists(), what="munged's socket", cluster=cluster)
        _wait(lambda: "idle" in _sinfo(cluster), what="the node to be idle", cluster=cluster)
        yield cluster
    finally:
        subprocess.run(["scancel", "--user=root"], env=cluster.env(), capture_output=True, check=False, timeout=30)
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        lifeline.close()


def _sinfo(cluster: Cluster) -> str:
    done = subprocess.run(["sinfo", "--noheader", "--format=%T"], env=cluster.env(), capture_output=True, text=True,
                          check=False, timeout=30)  # fmt: skip
    return done.stdout


def _wait(predicate, *, what: str, cluster: Cluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.logs()}")
