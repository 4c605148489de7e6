"""The first minutes (issue 15 point 5, issue 36 item 8): ``./dev demo`` on a fresh clone, timed from outside.

    .venv/bin/python bench/demo_first_minutes.py [--venv PATH] [--clone /tmp/democlone] [--port 8790]

Clones this checkout (``git clone``: committed files only, no ``var/``, no built minibench) into
``--clone``, runs ``./dev demo`` there on the embedded default (SQLite, no services) with a fresh
data folder, and records from outside, against the command's start:

- **first response**: the first answer of the dashboard (its sign-in page, HTTP 200);
- **bar shown**: the first answer that carries the minibench build's progress bar;
- **build installed**: the build line "benchmark minibench.../... registered" in the terminal
  (the default `demo` profile registers ``minibench-demo/arithmetic``);
- **run started**, **first result** (the first experiment's feedback score), **reviewer report**
  (the first "review:" line: a Reviewer's report is on record), **decision on the review** (the
  first decision the Main Agent took on a report) and **run finished** ("run ended:"), each as the
  demo prints it while it follows the run;
- **result**: the terminal's "result:" line (the run's final-split result);
- **still serving**: the dashboard answers 10 s after the result (keep-serving is the default),
  then SIGINT (Ctrl-C) ends the demo and the exit is timed;
- the **load average** (1 min) every 10 s, since the machine is shared.

``--venv`` points ``./dev`` at an installed environment (``RSI_VENV``), so the install is not
redone: a thin folder whose ``bin/python`` execs that environment's Python, with the install
stamp of the clone's pyproject.toml. The environment install itself is timed separately (the
``setup`` phase of ``./dev``), not here. The transcript goes to ``--clone``/demo-console.txt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]


def _thin_venv(python: Path, clone: Path, where: Path) -> Path:
    """A venv folder for ./dev whose python is ``python`` and whose install stamp matches the clone."""
    shutil.rmtree(where, ignore_errors=True)
    (where / "bin").mkdir(parents=True)
    wrapper = where / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {python} "$@"\n')
    wrapper.chmod(0o755)
    stamp = hashlib.sha256((clone / "pyproject.toml").read_bytes()).hexdigest()
    (where / ".rsiweb-installed").write_text(stamp + "\n")
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clone", type=Path, default=Path("/tmp/democlone"))
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="an installed environment")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--timeout", type=float, default=3600, help="give up after this many seconds")
    args = parser.parse_args()

    shutil.rmtree(args.clone, ignore_errors=True)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(args.clone)], check=True)
    venv = _thin_venv(args.venv / "bin" / "python", args.clone, args.clone.parent / f"{args.clone.name}-venv")
    data = args.clone / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "RSI_MINIBENCH_CACHE")}
    env.update(RSI_VENV=str(venv), RSI_DATA_DIR=str(data))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    console = args.clone / "demo-console.txt"
    url = f"http://127.0.0.1:{args.port}"

    marks: dict[str, float] = {}
    loads: list[float] = []
    lines: list[tuple[float, str]] = []
    started = time.monotonic()
    demo = subprocess.Popen(
        ["./dev", "demo", "--port", str(args.port)], cwd=args.clone, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
        # A shell's background job ignores SIGINT, and the ignore is inherited: restore Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip

    def read() -> None:
        assert demo.stdout is not None
        for raw in iter(demo.stdout.readline, b""):
            at = time.monotonic() - started
            for part in raw.decode(errors="replace").replace("\r", "\n").splitlines():
                if part.strip():
                    lines.append((at, part))
                    if part.startswith("dashboard:"):
                        marks.setdefault("dashboard_line", at)
                    if re.match(r"benchmark minibench(-[a-z]+)?/\S+ \(registered", part):
                        marks.setdefault("build_installed", at)
                    if part.startswith("run ") and " started: " in part:
                        marks.setdefault("run_started", at)
                    if part.startswith("first result:"):
                        marks.setdefault("first_result", at)
                    if part.startswith("review: "):
                        marks.setdefault("reviewer_report", at)
                    if part.startswith("decision on the review:"):
                        marks.setdefault("decision_on_review", at)
                    if part.startswith("run ended:"):
                        marks.setdefault("run_finished", at)
                    if part.startswith("result:"):
                        marks.setdefault("result", at)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    last_load = 0.0
    try:
        while demo.poll() is None and time.monotonic() - started < args.timeout and "result" not in marks:
            now = time.monotonic()
            if now - last_load >= 10:
                loads.append(os.getloadavg()[0])
                last_load = now
            try:
                page = requests.get(f"{url}/accounts/login/", timeout=5)
                if page.status_code == 200:
                    marks.setdefault("first_response", time.monotonic() - started)
                    if "Building the minibench" in page.text:
                        marks.setdefault("bar_shown", time.monotonic() - started)
            except requests.RequestException:
                pass
            time.sleep(0.5)
        if "result" in marks:
            time.sleep(10)
            try:
                marks["still_serving"] = float(requests.get(f"{url}/healthz", timeout=5).status_code == 200)
            except requests.RequestException:
                marks["still_serving"] = 0.0
        interrupted = time.monotonic()
        if demo.poll() is None:
            os.kill(demo.pid, signal.SIGINT)  # Ctrl-C: the demo alone; it stops its stack itself
        code = demo.wait(timeout=120)
        marks["exit_after_sigint_s"] = time.monotonic() - interrupted
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        reader.join(timeout=5)
    console.write_text("".join(f"{at:7.1f}s  {text}\n" for at, text in lines))
    summary = {
        "marks_s": {k: round(v, 1) for k, v in marks.items()},
        "exit_code": code,
        "load_avg_1min": {
            "min": min(loads, default=0),
            "mean": round(sum(loads) / max(1, len(loads)), 2),
            "max": max(loads, default=0),
            "samples": len(loads),
        },  # fmt: skip
        "cores": os.cpu_count(),
        "console": str(console),
    }
    print(json.dumps(summary, indent=2))  # noqa: T201
    if "result" not in marks:
        sys.exit("no result line: see the console transcript")


if __name__ == "__main__":
    main()
