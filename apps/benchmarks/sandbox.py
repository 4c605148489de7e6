"""Run model-written code in a bubblewrap sandbox: no network, no project or sealed files, limits.

Code tasks (HumanEval-style) execute the model's completion together with the hidden tests. The
program runs under Debian's ``bwrap`` (bubblewrap; ``./dev`` installs it like chromium) with

- every namespace unshared (``--unshare-all``): no network interface but a down loopback, its
  own PID/IPC/UTS namespaces, so it cannot see or signal the worker;
- a file system of read-only ``/usr`` (the interpreter and its standard library, with the
  /lib, /bin links), an empty private ``/tmp`` as working folder and nothing else: the sealed
  folder, the artifact store, the project checkout and the home folder do not exist inside;
- an empty environment (no tokens, no ``DATABASE_URL``);
- rlimits set before ``exec``: CPU seconds, address space, file size, open files, and a
  wall-clock timeout enforced from outside (``--die-with-parent`` + kill of the process group).

The tests stay with the scorer: the program is piped in on stdin, never written where the model
could have read it. No Django imports (the sealed evaluator imports this module).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

CPU_SECONDS = 10
MEMORY_BYTES = 512 * 1024 * 1024
WALL_SECONDS = 15.0
FILE_BYTES = 16 * 1024 * 1024
OPEN_FILES = 64
OUTPUT_CHARS = 4_000
# The interpreter inside the sandbox: the system Python under /usr (a venv under the project
# checkout is not mounted). RSI_SANDBOX_PYTHON overrides it, and must live under /usr.
DEFAULT_PYTHON = "/usr/bin/python3"


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here: code tasks cannot be scored."""


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None  # None when killed for the wall-clock limit
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _python() -> str:
    python = os.environ.get("RSI_SANDBOX_PYTHON", DEFAULT_PYTHON)
    if not Path(python).resolve().is_relative_to("/usr"):
        raise SandboxUnavailable(f"sandbox interpreter {python} is not under /usr, which is all the sandbox mounts")
    return python


def bwrap_command(python: str) -> list[str]:
    """The bubblewrap command line: what the sandboxed program can see is exactly this list."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed; `./dev setup` installs Debian's package")
    command = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "bin", "sbin"):
        if Path(f"/{name}").is_symlink():
            command += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
        elif Path(f"/{name}").is_dir():
            command += ["--ro-bind", f"/{name}", f"/{name}"]
    # /tmp inside is a fresh private tmpfs, not the host's /tmp.
    command += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp", "--clearenv"]  # noqa: S108
    command += [
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",  # noqa: S108 - the sandbox's own tmpfs
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
    ]
    return [*command, python, "-I", "-"]


def _limits(cpu_seconds: int, memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_python(
    program: str,
    *,
    cpu_seconds: int = CPU_SECONDS,
    memory_bytes: int = MEMORY_BYTES,
    wall_seconds: float = WALL_SECONDS,
) -> SandboxResult:
    """Run ``program`` (Python source) in the sandbox; raise SandboxUnavailable if it cannot start."""
    command = bwrap_command(_python())
    process = subprocess.Popen(  # noqa: S603 - fixed argv; the program arrives on stdin
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: _limits(cpu_seconds, memory_bytes),  # noqa: PLW1509 - rlimits must be set in the child
    )
    try:
        out, err = process.communicate(program.encode("utf-8"), timeout=wall_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return SandboxResult(
            None, out.decode(errors="replace")[:OUTPUT_CHARS], err.decode(errors="replace")[:OUTPUT_CHARS], True
        )
    stderr = err.decode(errors="replace")
    if process.returncode != 0 and stderr.startswith("bwrap:"):
        raise SandboxUnavailable(f"bubblewrap could not start the sandbox: {stderr.strip()[:300]}")
    return SandboxResult(process.returncode, out.decode(errors="replace")[:OUTPUT_CHARS], stderr[:OUTPUT_CHARS], False)
