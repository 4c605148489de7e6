"""Private PostgreSQL and Redis servers for tests that break them (STYLE.md 31b).

Each runs as a child of the test process on a free port (never 5432 or 6379), with its data under
a temporary folder, and dies with the test process however it ends (``Lifeline``). ``stop()`` is a
clean shutdown, ``kill()`` a crash (SIGKILL of the whole process group), ``restart()`` a clean
stop and a start; a stopped or killed server starts again on the same port with the same data
(Redis keeps its data only with ``appendonly=True``). ``start()`` returns once the server answers.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import redis

from tests.support.procs import Lifeline

# initdb and postgres refuse to run as root; the package's own account runs them.
PG_USER = "postgres"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pg_bin_dir() -> Path:
    """The newest installed PostgreSQL's binaries (Debian layout), else those on PATH."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    if versions:
        return versions[-1].parent
    found = shutil.which("postgres")
    if not found:
        raise RuntimeError("no PostgreSQL server binaries found (postgres, initdb)")
    return Path(found).resolve().parent


def _wait(ready, *, timeout: float, what: str, process: subprocess.Popen[bytes], log: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout:.0f}s:\n{log.read_text(errors='replace')[-3000:]}")


class _Server:
    """One server process in its own process group, tied to the test process by a Lifeline."""

    name = "server"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.log_path = base / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._lifeline: Lifeline | None = None

    # Subclasses: the command line, how to run it, and when it answers.
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _popen_options(self) -> dict[str, object]:
        return {}

    def _answers(self) -> bool:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 60) -> None:
        """Start the server (a no-op when it runs) and wait until it answers."""
        if self.running:
            return
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, **self._popen_options(),  # type: ignore[arg-type]
            )  # fmt: skip
        self._lifeline = Lifeline([self.process.pid])
        _wait(self._answers, timeout=timeout, what=self.name, process=self.process, log=self.log_path)

    def _stop_signal(self) -> signal.Signals:
        return signal.SIGTERM

    def stop(self, timeout: float = 60) -> None:
        """A clean shutdown (the server's own, on its usual signal); a no-op when it is down."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(self._stop_signal())
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._release()

    def kill(self) -> None:
        """SIGKILL the server and every process of its group: a crash, nothing flushed or said."""
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._release()

    def restart(self, timeout: float = 60) -> None:
        self.stop()
        self.start(timeout=timeout)

    def _release(self) -> None:
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class PostgresCluster(_Server):
    """A private PostgreSQL cluster (initdb on first start; trust auth on 127.0.0.1).

    Its folder must be reachable by the postgres account (pytest's own temporary folders are
    root's alone): by default a fresh one under the system's temporary folder; ``remove()``
    deletes it once the cluster is down.

    fsync is off: a commit still writes its WAL to the OS before it returns, so SIGKILL of the
    server loses no committed row (tests never crash the OS). synchronous_commit stays on: off,
    a commit returns before its WAL is written and a SIGKILL would lose it.
    """

    name = "postgres"

    def __init__(self, base: Path | None = None) -> None:
        base = base or Path(tempfile.mkdtemp(prefix="rsi-pg-"))
        super().__init__(base)
        self.bin = pg_bin_dir()
        self.data_dir = base / "data"
        self.socket_dir = base / "socket"
        account = pwd.getpwnam(PG_USER)
        for path in (base, self.socket_dir):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, account.pw_uid, account.pw_gid)
        self.log_path.touch()
        os.chown(self.log_path, account.pw_uid, account.pw_gid)

    def _popen_options(self) -> dict[str, object]:
        return {"user": PG_USER, "group": PG_USER, "extra_groups": [], "cwd": self.base}

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        result = subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
             "--no-sync", "--locale=C"],
            capture_output=True, text=True, **self._popen_options(),  # type: ignore[call-overload]
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def _command(self) -> list[str]:
        return [
            str(self.bin / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.socket_dir}",
            "-c", "fsync=off", "-c", "full_page_writes=off",
            "-c", "max_connections=200", "-c", "shared_buffers=32MB",
        ]  # fmt: skip

    def start(self, timeout: float = 60) -> None:
        self._initdb()
        super().start(timeout=timeout)

    def _stop_signal(self) -> signal.Signals:
        return signal.SIGINT  # "fast" shutdown: ends sessions, checkpoints, exits

    def _answers(self) -> bool:
        try:
            with psycopg.connect(self.url_for("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    def url_for(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def create_database(self, name: str) -> str:
        """Create ``name`` (dropping an earlier one) and return its URL."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)


class RedisServer(_Server):
    """A private redis-server; ``appendonly=True`` keeps its data across a crash or a restart
    (fsync every write), without it a restart comes back empty as an unpersisted Redis does."""

    name = "redis"

    def __init__(self, base: Path | None = None, *, appendonly: bool = False) -> None:
        super().__init__(base or Path(tempfile.mkdtemp(prefix="rsi-redis-")))
        self.base.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly

    def _command(self) -> list[str]:
        return [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "always",
            "--dir", str(self.base), "--daemonize", "no", "--protected-mode", "no",
        ]  # fmt: skip

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=2).ping())
        except redis.RedisError:
            return False

    def wipe(self) -> None:
        """Forget the data on disk (the server must be down): the next start is empty."""
        assert not self.running
        for path in [*self.base.glob("*.aof"), *self.base.glob("*.rdb"), self.base / "appendonlydir"]:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    def url_for(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @property
    def url(self) -> str:
        return self.url_for(0)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)
