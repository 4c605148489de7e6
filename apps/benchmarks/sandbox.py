"""Run model-written code in a bubblewrap sandbox, and score code tasks with a verifier it cannot reach.

Every program runs under Debian's ``bwrap`` (bubblewrap; ``./dev`` installs it like chromium) with

- every namespace unshared (``--unshare-all``): no network interface but a down loopback, its
  own PID/IPC/UTS namespaces, so it cannot see or signal the worker;
- a file system of read-only ``/usr`` (the interpreter and its standard library, with the
  /lib, /bin links), an empty private ``/tmp`` as working folder and nothing else: the sealed
  folder, the artifact store, the project checkout and the home folder do not exist inside;
- an empty environment (no tokens, no ``DATABASE_URL``);
- rlimits set before ``exec``: CPU seconds, address space, file size, open files, and a
  wall-clock timeout enforced from outside (``--die-with-parent`` + kill of the process group).

**Code tasks** (``run_tests``, HumanEval-style) never trust an exit status. Two sandboxes run:

- the *candidate* process runs the prompt and the model's completion, then answers calls of the
  entry point: each call's arguments arrive as plain data, and its return value goes back as
  plain data, encoded by exact builtin type (``type(x) is int``, never a subclass); anything
  else (an object whose ``__eq__`` always answers True, an int or str subclass, a generator) is
  not plain data and the call fails;
- the *tests* process runs the prompt's own definitions and the hidden tests, with the entry
  point replaced by a stand-in that sends each call to the candidate process and rebuilds the
  answer from the plain data, so every comparison the tests make happens here, on builtin
  values, under this process's own untouched ``builtins``, ``operator`` and ``unittest``.

They share only the two pipes of that call channel: the tests, the scorer's nonce and the
verdict pipe exist in the tests process alone, in another PID namespace. After ``check``
returns, the tests process writes the verdict with the nonce on a pipe that only it holds; the
sample passes when that verdict says so, carries the nonce, and at least one call was answered.
Whatever the completion does (``exit(0)``, ``os._exit(0)``, ``SystemExit`` or
``BaseException``, monkeypatching, forking, killing what it can see, printing a verdict,
writing files) it can only end its own process or answer calls with plain data: a candidate
process that ends, or answers what is not a plain value, fails the sample even if the tests
catch the error. Its limits: the tests must pass plain data to the entry point and compare what
it returns (they cannot see the arguments it mutated, nor the completion's other names).

The tests stay with the scorer: programs and tests are piped in on stdin, never written where
the model could read them. No Django imports (the sealed evaluator imports this module); the
harness both sandboxes run is the ``HARNESS`` source below, so it is sealed with this file.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

CPU_SECONDS = 10
MEMORY_BYTES = 512 * 1024 * 1024
WALL_SECONDS = 15.0
FILE_BYTES = 16 * 1024 * 1024
OPEN_FILES = 64
OUTPUT_CHARS = 4_000
VERDICT_BYTES = 64 * 1024
# The interpreter inside the sandbox: the system Python under /usr (a venv under the project
# checkout is not mounted). RSI_SANDBOX_PYTHON overrides it, and must live under /usr.
DEFAULT_PYTHON = "/usr/bin/python3"


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here: code tasks cannot be scored."""


@dataclass(frozen=True)
class SandboxResult:
    """How one sandboxed program ended. Its exit status is never a code task's verdict (run_tests)."""

    returncode: int | None  # None when killed for the wall-clock limit
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def exited_zero(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass(frozen=True)
class CodeVerdict:
    """A code task's verdict: what the tests process reported after its tests returned."""

    passed: bool
    detail: str  # why, in a sentence (the failing test line, the candidate process ending, ...)
    calls: int  # calls of the entry point the candidate process answered
    timed_out: bool
    candidate_output: str  # the candidate process's stdout and stderr, for diagnosis only
    tests_output: str


# The harness both sandboxes run (``python -I -c HARNESS candidate|tests``); its input, a JSON
# object, arrives on stdin. Kept as source in this file so the sealed copy holds it too.
HARNESS = r'''
import builtins
import json
import os
import re
import sys

MAX_MESSAGE = 16 * 1024 * 1024
MAX_DEPTH = 64
_INT = re.compile(r"-?0x[0-9a-f]+")
_HEX = re.compile(r"(?:[0-9a-f]{2})*")
_COLLECTIONS = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
_BUILDERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


class NotPlain(Exception):
    """Not plain data (exact builtin types only), or a message that does not parse as one."""


class CandidateLost(BaseException):
    """The candidate process cannot answer any more: no test may catch this as an Exception."""


def encode(value, depth=0):
    """Plain data as JSON-ready tagged lists; exact builtin types only, so no subclass passes."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if value is None:
        return ["none"]
    if kind is bool:
        return ["bool", value]
    if kind is int:
        return ["int", hex(value)]
    if kind is float:
        return ["float", value.hex()]
    if kind is complex:
        return ["complex", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["str", value]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind in _COLLECTIONS:
        return [_COLLECTIONS[kind], [encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise NotPlain(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def _float(text):
    try:
        return float.fromhex(text)
    except (ValueError, OverflowError):
        raise NotPlain("a float that does not parse") from None


def decode(node, depth=0):
    """The exact builtin value a tagged list stands for; anything malformed raises NotPlain."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"nested deeper than {MAX_DEPTH}")
    if type(node) is not list or not node or type(node[0]) is not str:
        raise NotPlain("a value that is not a tagged list")
    tag, args = node[0], node[1:]
    if tag == "none" and not args:
        return None
    if tag == "complex" and len(args) == 2 and type(args[0]) is str and type(args[1]) is str:
        return complex(_float(args[0]), _float(args[1]))
    if len(args) == 1:
        arg = args[0]
        if tag == "bool" and type(arg) is bool:
            return arg
        if tag == "int" and type(arg) is str and _INT.fullmatch(arg):
            return int(arg, 16)
        if tag == "float" and type(arg) is str:
            return _float(arg)
        if tag == "str" and type(arg) is str:
            return arg
        if tag == "bytes" and type(arg) is str and _HEX.fullmatch(arg):
            return bytes.fromhex(arg)
        if tag in _BUILDERS and type(arg) is list:
            items = [decode(item, depth + 1) for item in arg]
            try:
                return _BUILDERS[tag](items)
            except TypeError:
                raise NotPlain(f"an unhashable member of a {tag}") from None
        if tag == "dict" and type(arg) is list:
            pairs = []
            for pair in arg:
                if type(pair) is not list or len(pair) != 2:
                    raise NotPlain("a dict entry that is not a pair")
                pairs.append((decode(pair[0], depth + 1), decode(pair[1], depth + 1)))
            try:
                return dict(pairs)
            except TypeError:
                raise NotPlain("an unhashable dict key") from None
    raise NotPlain(f"a malformed value tagged {tag[:20]!r}")


def send(fd, message):
    data = json.dumps(message).encode("ascii")
    if len(data) > MAX_MESSAGE:
        raise NotPlain(f"a message over {MAX_MESSAGE} bytes")
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the other end is closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def receive(fd):
    size = int.from_bytes(_read_exactly(fd, 4), "big")
    if size > MAX_MESSAGE:
        raise NotPlain(f"a message over {MAX_MESSAGE} bytes")
    return json.loads(_read_exactly(fd, size))


def _builtin_exception(kind):
    for cls in kind.__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "Exception"


def serve(spec):
    """The candidate role: load the completion, say so, then answer each call until the tests hang up."""
    requests, replies = spec["requests_fd"], spec["replies_fd"]
    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    exec(compile(spec["program"], "<completion>", "exec"), namespace)
    function = namespace.get(spec["entry_point"])
    # The tests send no call before this: nothing waits in the pipe while the completion loads.
    send(replies, {"ready": True})
    while True:
        try:
            request = receive(requests)
        except EOFError:
            return
        reply = {"id": request.get("id")}
        try:
            args = [decode(a) for a in request["args"]]
            kwargs = {name: decode(value) for name, value in request["kwargs"]}
            result = function(*args, **kwargs)
        except Exception as exc:
            try:
                message = str(exc)[:2000]
            except Exception:
                message = ""
            reply["raised"] = [_builtin_exception(type(exc)), message]
        else:
            try:
                reply["value"] = encode(result)
            except (NotPlain, RecursionError, ValueError) as exc:
                reply["not_plain"] = str(exc)[:500]
        send(replies, reply)


def _failing_line(exc):
    lines, tb = [], exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<tests>":
            lines.append(tb.tb_lineno)
        tb = tb.tb_next
    where = f" at line {lines[-1]} of the tests" if lines else ""
    return f"{type(exc).__name__}{where}: {str(exc)[:300]}"


def judge(spec):
    """The tests role: run the tests against a stand-in for the entry point; write the verdict."""
    requests, replies = spec["requests_fd"], spec["replies_fd"]
    state = {"calls": 0, "lost": None, "ready": False}

    def lose(reason):
        if state["lost"] is None:
            state["lost"] = reason
        raise CandidateLost(state["lost"])

    def candidate(*args, **kwargs):
        if state["lost"] is not None:
            raise CandidateLost(state["lost"])
        call = state["calls"] + 1
        call_id = os.urandom(8).hex()
        try:
            message = {"id": call_id, "args": [encode(a) for a in args],
                       "kwargs": [[name, encode(value)] for name, value in kwargs.items()]}
        except NotPlain as exc:
            lose(f"the tests passed an argument that is not plain data ({exc}); this harness cannot run them")
        try:
            if not state["ready"]:
                hello = receive(replies)
                if hello != {"ready": True}:
                    lose("the candidate process's first message is not the harness's: the completion did not load")
                state["ready"] = True
            send(requests, message)
            reply = receive(replies)
        except (EOFError, OSError):
            when = f"answering call {call}" if state["ready"] else "the completion had loaded"
            lose(f"the candidate process ended before {when} (an exit status is never a verdict)")
        except Exception as exc:
            lose(f"call {call}: the reply does not parse ({type(exc).__name__})")
        if type(reply) is not dict or reply.get("id") != call_id:
            lose(f"call {call}: the reply does not answer this call")
        keys = set(reply) - {"id"}
        if keys == {"value"}:
            try:
                value = decode(reply["value"])
            except (NotPlain, RecursionError) as exc:
                lose(f"call {call} returned what is not plain data ({exc})")
            state["calls"] = call
            return value
        if keys == {"raised"}:
            raised = reply["raised"]
            if type(raised) is list and len(raised) == 2 and all(type(part) is str for part in raised):
                kind = getattr(builtins, raised[0], None)
                if isinstance(kind, type) and issubclass(kind, Exception):
                    state["calls"] = call
                    if issubclass(kind, StopIteration | StopAsyncIteration):
                        kind = RuntimeError  # never ends an iteration in the tests (PEP 479's rule)
                    try:
                        error = kind(raised[1])
                    except Exception:
                        error = Exception(f"{raised[0]}: {raised[1]}")
                    raise error
        if keys == {"not_plain"}:
            lose(f"call {call} returned what is not plain data ({str(reply['not_plain'])[:300]})")
        lose(f"call {call}: a malformed reply")

    detail = ""
    finished = False
    scope = {"__name__": "__main__", "__builtins__": builtins}
    prompt = None
    for source in (spec["prompt"], spec["prompt"] + "\n    pass\n"):
        try:
            prompt = compile(source, "<prompt>", "exec")
            break
        except SyntaxError:
            continue
    try:
        if prompt is not None:
            exec(prompt, scope)
        scope[spec["entry_point"]] = candidate
        exec(compile(spec["test"], "<tests>", "exec"), scope)
        check = scope.get("check")
        if not callable(check):
            detail = "the tests define no check(candidate)"
        else:
            check(candidate)
            finished = True
    except BaseException as exc:
        detail = state["lost"] or f"check() raised {_failing_line(exc)}"
    if finished and state["lost"] is not None:
        detail = f"check() returned, but {state['lost']}"
    elif finished and not state["calls"]:
        detail = "check() returned without calling the entry point once"
    elif finished:
        detail = f"check() returned after {state['calls']} call(s)"
    verdict = {"nonce": spec["nonce"], "passed": finished and state["lost"] is None and state["calls"] > 0,
               "calls": state["calls"], "detail": detail[:1000]}
    data = memoryview(json.dumps(verdict).encode("ascii"))
    while data:
        data = data[os.write(spec["verdict_fd"], data):]
    os.close(spec["verdict_fd"])
    sys.stdout.flush()
    os._exit(0)


# Bound before any completion runs: whatever it patches, the candidate process ends at once
# when serving ends (no interpreter shutdown that a patched builtin could hang).
_exit, _write = os._exit, os.write


def main(role):
    spec = json.loads(sys.stdin.buffer.read())
    if role == "tests":
        judge(spec)
    elif role == "candidate":
        code = 0
        try:
            serve(spec)
        except BaseException as exc:
            code = 1
            try:
                _write(2, f"the candidate process stopped: {type(exc).__name__}: {exc}\n".encode()[:2000])
            except BaseException:
                pass
        try:  # what the completion printed, for diagnosis
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        _exit(code)


if __name__ == "__main__":
    main(sys.argv[1])
'''

# The harness's codec, in this process too: tests and diagnosis use the code the sandboxes run.
_harness: dict[str, Any] = {"__name__": "rsiweb_sandbox_harness"}
exec(compile(HARNESS, "<sandbox harness>", "exec"), _harness)  # noqa: S102 - our own source, above
encode_plain: Callable[[Any], list[Any]] = _harness["encode"]
decode_plain: Callable[[list[Any]], Any] = _harness["decode"]
NotPlain: type[Exception] = _harness["NotPlain"]


def _python() -> str:
    python = os.environ.get("RSI_SANDBOX_PYTHON", DEFAULT_PYTHON)
    if not Path(python).resolve().is_relative_to("/usr"):
        raise SandboxUnavailable(f"sandbox interpreter {python} is not under /usr, which is all the sandbox mounts")
    return python


def bwrap_command(python: str, *arguments: str) -> list[str]:
    """The bubblewrap command line: what the sandboxed program can see is exactly this list.

    ``arguments`` go to the interpreter after ``-I``; by default ``-`` (the program on stdin).
    """
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
    return [*command, python, "-I", *(arguments or ("-",))]


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


def _start_harness(
    python: str,
    role: str,
    spec: dict[str, Any],
    fds: tuple[int, ...],
    log: IO[bytes],
    cpu_seconds: int,
    memory_bytes: int,
) -> tuple[subprocess.Popen[bytes], threading.Thread]:
    """One harness process in its own sandbox, holding exactly ``fds`` besides its stdio."""
    # Unbuffered (-u): both processes are killed as soon as the verdict is read, so what a
    # completion printed must already be in the log, not in a buffer the kill throws away.
    process = subprocess.Popen(  # noqa: S603 - fixed argv; the data arrives on stdin
        bwrap_command(python, "-u", "-c", HARNESS, role),
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        pass_fds=fds,
        start_new_session=True,
        preexec_fn=lambda: _limits(cpu_seconds, memory_bytes),  # noqa: PLW1509 - rlimits must be set in the child
    )
    stdin = process.stdin
    assert stdin is not None  # noqa: S101 - stdin=PIPE

    def feed() -> None:
        try:
            stdin.write(json.dumps(spec).encode("ascii"))
            stdin.close()
        except OSError:  # it ended before reading (bwrap refused, or a limit): its verdict says so
            pass

    feeder = threading.Thread(target=feed, name=f"sandbox-{role}-stdin", daemon=True)
    feeder.start()
    return process, feeder


def _read_verdict(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written on the verdict pipe until its writer closes it: (data, timed out)."""
    data = b""
    while len(data) <= VERDICT_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return data, False
        data += chunk
    return data, False


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL is not refused; never wait forever
        process.wait(timeout=10)


def _log_text(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read(OUTPUT_CHARS * 4).decode(errors="replace")[:OUTPUT_CHARS]


def run_tests(
    *,
    program: str,
    prompt: str,
    test: str,
    entry_point: str,
    cpu_seconds: int = CPU_SECONDS,
    memory_bytes: int = MEMORY_BYTES,
    wall_seconds: float = WALL_SECONDS,
) -> CodeVerdict:
    """Score a code task: ``program`` (prompt + completion) answers calls; ``test``'s ``check`` judges.

    The verdict is the tests process's report, keyed by a nonce only it was given, written after
    ``check`` returned; never an exit status (module docstring). Raises SandboxUnavailable when
    bubblewrap cannot start.
    """
    python = _python()
    nonce = secrets.token_hex(16)
    requests_r, requests_w = os.pipe()  # tests -> candidate: the calls
    replies_r, replies_w = os.pipe()  # candidate -> tests: the plain answers
    verdict_r, verdict_w = os.pipe()  # tests -> scorer: the verdict, held by the tests process alone
    child_ends = [requests_r, requests_w, replies_r, replies_w, verdict_w]
    started: list[tuple[subprocess.Popen[bytes], threading.Thread]] = []
    deadline = time.monotonic() + wall_seconds
    with tempfile.TemporaryFile() as candidate_log, tempfile.TemporaryFile() as tests_log:
        try:
            candidate_spec = {
                "program": program, "entry_point": entry_point, "requests_fd": requests_r, "replies_fd": replies_w,
            }  # fmt: skip
            started.append(
                _start_harness(
                    python,
                    "candidate",
                    candidate_spec,
                    (requests_r, replies_w),
                    candidate_log,
                    cpu_seconds,
                    memory_bytes,
                )  # fmt: skip
            )
            tests_spec = {
                "prompt": prompt, "test": test, "entry_point": entry_point, "nonce": nonce,
                "requests_fd": requests_w, "replies_fd": replies_r, "verdict_fd": verdict_w,
            }  # fmt: skip
            started.append(
                _start_harness(
                    python,
                    "tests",
                    tests_spec,
                    (requests_w, replies_r, verdict_w),
                    tests_log,
                    cpu_seconds,
                    memory_bytes,
                )  # fmt: skip
            )
        finally:
            for fd in child_ends:
                os.close(fd)
        try:
            raw, timed_out = _read_verdict(verdict_r, deadline)
        finally:
            os.close(verdict_r)
            for process, feeder in started:
                _kill(process)
                feeder.join(timeout=5)
        candidate_output, tests_output = _log_text(candidate_log), _log_text(tests_log)
    codes = [process.returncode for process, _ in started]
    try:
        verdict = json.loads(raw) if raw else None
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict) or verdict.get("nonce") != nonce:
        # Only the tests process's output says whether bubblewrap started: the completion
        # writes its own, and must not turn a failing sample into an evaluation that errors.
        if tests_output.startswith("bwrap:"):
            raise SandboxUnavailable(f"bubblewrap could not start the sandbox: {tests_output.strip()[:300]}")
        why = "timed out" if timed_out else "ended without a verdict"
        return CodeVerdict(
            False, f"the tests process {why} (exit statuses {codes}, never a verdict)", 0, timed_out,
            candidate_output, tests_output,
        )  # fmt: skip
    calls = verdict.get("calls")
    return CodeVerdict(
        verdict.get("passed") is True and isinstance(calls, int) and calls > 0,
        str(verdict.get("detail", ""))[:1000],
        calls if isinstance(calls, int) else 0,
        False,
        candidate_output,
        tests_output,
    )
