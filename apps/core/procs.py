"""Child processes that die with their parent, and ports that a stale server still holds.

Whoever starts servers and workers (``manage.py demo``, the test fixtures) ties them to itself
with a :class:`Lifeline`, so none outlives it however it ends — SIGTERM, SIGKILL or a crash — and
checks a port with :func:`port_check_free` before a server is started on it, so a start never
talks to a server left running by an earlier one. Linux only (``/proc``), like the stack.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

# The watcher reads "+<pgid>" (watch this group) and "-<pgid>" (forget it: its owner ended it)
# lines until the pipe reads EOF — every write end closed: the owner ended, however it ended —
# then kills each group still watched, pool children and all.
_WATCHER = """
import os, signal, sys
groups = set(int(g) for g in sys.argv[2:])
with os.fdopen(int(sys.argv[1]), "r") as pipe:
    for line in pipe:
        line = line.strip()
        if line.startswith("+"):
            groups.add(int(line[1:]))
        elif line.startswith("-"):
            groups.discard(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


class Lifeline:
    """Process groups that die with this process: on ``close()``, or when this process exits by
    SIGTERM, SIGKILL or a crash (STYLE.md 31b).

    A small watcher process holds the read end of a pipe whose only write end is here. The
    kernel closes that end when this process ends in any way, the watcher reads EOF and kills
    the groups. The write end is not inheritable (PEP 446), so no other child keeps it open.
    Give it the pids of children started with ``start_new_session=True`` (each leads its group),
    at once or later with ``add``; ``forget`` a group once it was ended and reaped, since its
    number may then be reused by an unrelated group.
    """

    def __init__(self, pgids: list[int] | None = None) -> None:
        read, self._write = os.pipe()
        self.watcher = subprocess.Popen(
            [sys.executable, "-c", _WATCHER, str(read), *map(str, pgids or [])],
            pass_fds=(read,),
            start_new_session=True,
        )
        os.close(read)

    def _send(self, line: str) -> None:
        if self._write >= 0:
            os.write(self._write, f"{line}\n".encode())

    def add(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Kill the groups still watched now (a no-op for those already gone) and end the watcher."""
        if self._write >= 0:
            os.close(self._write)
            self._write = -1
        self.watcher.wait(timeout=30)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """A process pool's initializer (``ProcessPoolExecutor(initializer=die_with_parent,
    initargs=(os.getpid(),))``): the child is killed when the process that started it ends.

    A pool's children are not a group of their own to hand to a :class:`Lifeline`, and a busy
    one does not notice its parent is gone: killed by SIGTERM or SIGKILL mid-task, a test session
    left its training children running for minutes. The kernel sends SIGKILL instead
    (PR_SET_PDEATHSIG) when the thread that started the child ends; a parent that ended before
    the call is caught by the check after it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


class PortInUse(RuntimeError):
    """A server is already listening on the port a start was asked to serve on."""


def _listening_inodes(port: int) -> set[str]:
    """The sockets listening on TCP ``port`` (any address), as /proc/<pid>/fd links name them."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; field 9 is the socket's inode.
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    return inodes


def port_listened(port: int) -> bool:
    """Whether anything listens on TCP ``port``. Unlike a failed bind, an outgoing connection that
    happens to use the port as its local (ephemeral) port does not count: no server is there."""
    return bool(_listening_inodes(port))


def port_holder(port: int) -> int | None:
    """The pid of a process listening on TCP ``port`` (any address), when /proc tells it."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return None


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def port_check_free(host: str, port: int) -> None:
    """Raise PortInUse, naming the holder's pid when it can be found, if ``host:port`` is taken.

    A server left running by an earlier start (its starter killed) would otherwise answer in
    place of the new one, with old code and another database.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As uvicorn binds: SO_REUSEADDR, so a port in TIME_WAIT is free, a listening one is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return
        except OSError:
            pass
    pid = port_holder(port)
    holder = f"process {pid} ({_command_line(pid)[:200]})" if pid is not None else "another process"
    stop = f"stop it (kill {pid})" if pid is not None else "stop it"
    raise PortInUse(
        f"port {port} on {host} is already in use by {holder}: a server left running by an earlier start? "
        f"{stop} or choose another port; a new start will not talk to a stale server."
    )
