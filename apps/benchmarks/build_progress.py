"""The minibench build as a child process whose progress the terminal and the dashboard show.

``minibench_build`` runs ``python -m apps.benchmarks.minibench OUT --verbose`` in a session of its
own (tied to this process by a Lifeline, so it never outlives it) and follows it from the
outside: the folders it writes tell the stage (θ0 is saved before the tasks, the catalog and the
references), and the reference trainer's log lines (``[task] step N loss L``, printed every 10
steps) tell how far each reference is. Following from the outside keeps the builder untouched:
its source is hashed into every built cache's manifest, so an edit there would rebuild them all.

Progress is a small JSON file beside the build folder (``.minibench.build.json`` next to
``RSI_MINIBENCH_ROOT``), replaced atomically on each change; the dashboard's pages read it with
:func:`build_progress_read` and show a bar while a build is on. A file left by a build whose
process is gone reads as ``interrupted``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.core.procs import Lifeline

ROOT = Path(__file__).resolve().parents[2]
# The share of the bar before the references train: data, tokenizer and θ0's 60 pre-training
# steps, about a minute on two loaded cores against ten or more for one 1,000-step reference.
PREPARE_SHARE = 0.1
PREPARE_EXPECTED_SECONDS = 90.0
STEP_LINE = re.compile(r"^\[(?P<task>[a-z0-9_-]+)\] step (?P<step>\d+) loss ")
BUILDING, INSTALLING, READY, FAILED, INTERRUPTED = "building", "installing", "ready", "failed", "interrupted"


def progress_path(root: Path | str | None = None) -> Path:
    """Where the progress of a build into ``root`` (default: RSI_MINIBENCH_ROOT) is written."""
    root = Path(root or settings.MINIBENCH_ROOT)
    return root.parent / f".{root.name}.build.json"


@dataclass
class BuildProgress:
    """One snapshot of a build: what the bar and the line under it say."""

    state: str
    stage: str
    fraction: float = 0.0
    detail: str = ""
    eta_seconds: int | None = None
    profile: str = ""
    seed: int = 0
    pid: int = 0
    log: str = ""
    started_at: str = field(default_factory=lambda: timezone.now().isoformat())
    updated_at: str = ""

    def line(self) -> str:
        """One terminal line: ``[#####.....]  42%  training the reference: arithmetic 420/1000, about 4 min left``."""
        width = 30
        filled = round(self.fraction * width)
        eta = f", about {_duration(self.eta_seconds)} left" if self.eta_seconds else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"[{'#' * filled}{'.' * (width - filled)}] {self.fraction:4.0%}  {self.stage}{detail}{eta}"


def _duration(seconds: int) -> str:
    return f"{seconds} s" if seconds < 90 else f"{round(seconds / 60)} min"


def build_progress_write(progress: BuildProgress, *, path: Path) -> None:
    progress.updated_at = timezone.now().isoformat()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(asdict(progress)), encoding="utf-8")
    partial.replace(path)  # readers see the old snapshot or the new one, never half of one


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build_progress_read(path: Path | None = None) -> dict[str, Any] | None:
    """The last snapshot of the build, or None when no build was ever followed here."""
    path = path or progress_path()
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if data.get("state") in (BUILDING, INSTALLING) and not _alive(int(data.get("pid") or 0)):
        data["state"] = INTERRUPTED
        data["detail"] = "the build's process is gone; run `./dev demo` (or manage.py build_minibench) again"
        data["eta_seconds"] = None
    return data


class _Follower:
    """Turns what the child wrote (folders, log lines) into BuildProgress snapshots."""

    def __init__(self, out: Path, *, tasks: list[str], steps: int, progress: BuildProgress) -> None:
        self.out, self.tasks, self.steps, self.progress = out, tasks, steps, progress
        self.started = time.monotonic()
        self.reference_started: float | None = None
        self.done: dict[str, int] = {}
        self.lock = threading.Lock()

    def read_lines(self, stream: Any, log: Any) -> None:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            match = STEP_LINE.match(raw.decode(errors="replace"))
            if match and match["task"] in self.tasks:
                with self.lock:
                    self.done[match["task"]] = min(self.steps, int(match["step"]))

    def snapshot(self) -> BuildProgress:
        progress, now = self.progress, time.monotonic()
        if not (self.out / "references").is_dir():
            progress.fraction = PREPARE_SHARE * min(0.95, (now - self.started) / PREPARE_EXPECTED_SECONDS)
            if (self.out / "theta0" / "config.json").exists():
                progress.stage, progress.detail = "writing the sealed tasks and the datapool catalog", ""
            else:
                progress.stage = "generating the tasks, training the tokenizer, pre-training θ0"
                progress.detail = f"{now - self.started:.0f} s so far (about a minute on two cores)"
            return progress
        if self.reference_started is None:
            self.reference_started = now
        with self.lock:
            done = [self.done.get(task, 0) for task in self.tasks]
        share = sum(done) / (self.steps * len(self.tasks))
        progress.fraction = PREPARE_SHARE + (1 - PREPARE_SHARE) * share
        progress.stage = "training the reference" + ("s" if len(self.tasks) > 1 else "")
        progress.detail = ", ".join(
            f"{task} step {step}/{self.steps}" for task, step in zip(self.tasks, done, strict=True)
        )
        elapsed = now - self.reference_started
        progress.eta_seconds = round(elapsed / share * (1 - share)) if share > 0.02 else None
        return progress


def minibench_build(
    out: Path,
    *,
    seed: int,
    profile: str,
    log_path: Path,
    on_update: Callable[[BuildProgress], None] | None = None,
    poll: float = 1.0,
) -> BuildProgress:
    """Build the minibench into ``out`` in a child process, reporting progress; raises on failure.

    The progress file is written on every change; ``on_update`` (the terminal) is called with
    the same snapshot. Ends in state ``installing``: the caller registers what was built and
    then writes ``ready`` (or ``failed``).
    """
    path = progress_path(out)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    progress = BuildProgress(state=BUILDING, stage="starting", profile=profile, seed=seed, log=str(log_path))
    progress.pid = os.getpid()  # the follower: when it is gone, so is the child (the Lifeline below)
    build_progress_write(progress, path=path)  # before the imports below, which take seconds
    if on_update is not None:
        on_update(progress)
    from apps.benchmarks.minibench.build import CI_TASKS, REFERENCE_HPARAMS  # noqa: PLC0415 - heavy (torch)
    from apps.benchmarks.minibench.demo import DEMO_REFERENCE_HPARAMS  # noqa: PLC0415 - beside the line above
    from apps.benchmarks.minibench.task_specs import TASKS  # noqa: PLC0415 - beside the line above

    tasks = list(CI_TASKS if profile in ("ci", "demo") else TASKS)
    steps = int((DEMO_REFERENCE_HPARAMS if profile == "demo" else REFERENCE_HPARAMS)["max_steps"])
    follower = _Follower(out, tasks=tasks, steps=steps, progress=progress)
    if profile == "demo":  # its own builder (a subpackage: the ci and full digests do not move)
        command = [sys.executable, "-m", "apps.benchmarks.minibench.demo", str(out), "--seed", str(seed), "--verbose"]
    else:
        command = [sys.executable, "-m", "apps.benchmarks.minibench", str(out), "--seed", str(seed),
                   "--profile", profile, "--verbose"]  # fmt: skip
    lifeline = Lifeline()
    with log_path.open("ab") as log:
        child = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
            stderr=log, start_new_session=True,
        )  # fmt: skip
        lifeline.add(child.pid)
        reader = threading.Thread(target=follower.read_lines, args=(child.stdout, log), daemon=True)
        reader.start()
        try:
            last = ""
            while child.poll() is None:
                snapshot = follower.snapshot()
                if snapshot.line() != last:
                    last = snapshot.line()
                    build_progress_write(snapshot, path=path)
                    if on_update is not None:
                        on_update(snapshot)
                time.sleep(poll)
            reader.join(timeout=10)
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(timeout=30)
            lifeline.forget(child.pid)
            lifeline.close()
    if child.returncode != 0:
        progress.state, progress.stage, progress.eta_seconds = FAILED, "build failed", None
        progress.detail = f"exit status {child.returncode}; see {log_path}"
        build_progress_write(progress, path=path)
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the minibench build failed (exit {child.returncode}); the end of {log_path}:\n{tail}")
    progress.state, progress.fraction, progress.detail, progress.eta_seconds = INSTALLING, 1.0, "", None
    progress.stage = "registering θ0, the benchmark and the reference"
    build_progress_write(progress, path=path)
    if on_update is not None:
        on_update(progress)
    return progress


def build_progress_finish(progress: BuildProgress, *, out: Path, error: str | None = None) -> None:
    """Record the end after the install: ``ready``, or ``failed`` with the reason."""
    progress.state = FAILED if error else READY
    progress.stage = "install failed" if error else "built and installed"
    progress.detail = error or ""
    build_progress_write(progress, path=progress_path(out))
