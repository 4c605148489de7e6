"""Resident memory and start time of the web server, the agents worker and the default worker.

Each process is started alone, as compose.yaml starts it (``manage.py serve``; ``celery -A rsiweb
worker --without-gossip --without-mingle -Q <queue>``, prefork pool) with production settings,
and measured once it is ready: the web server when ``/healthz`` has answered 200 (that first
request imports the URLconf and every view), a worker when it logs ``ready.`` (its task modules
imported, its pool children forked). Memory is read from /proc for the process and all its
descendants: RSS (each process's resident pages; a forked child's pages shared with its parent
are counted in both) and PSS (shared pages divided among the processes sharing them: the sum is
what the tree really holds). Then the process gets SIGTERM and the next one starts.

Several checkouts may be measured side by side in one run (``--tree``, repeated): their runs
alternate, so a busy machine slows each the same. Every tree runs on this interpreter (its
virtual environment) with that tree first on PYTHONPATH.

    DATABASE_URL is ignored: the bench uses its own database (BENCH_DATABASE_URL, default
    postgres://postgres@127.0.0.1:5432/rsiweb_bench_procs, dropped and re-created).
    git worktree add --detach ../before 8a6d7a8
    REDIS_URL=redis://127.0.0.1:6379/4 .venv/bin/python bench/process_memory.py --tree ../before --tree .
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._setup import ROOT, django_on_bench_db  # noqa: E402

PROCESSES = ("web", "agents", "default")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(name: str, port: int, concurrency: int) -> list[str]:
    if name == "web":
        return [sys.executable, "manage.py", "serve", "--port", str(port)]
    return [sys.executable, "-m", "celery", "-A", "rsiweb", "worker", "--without-gossip", "--without-mingle",
            "-Q", name, "--concurrency", str(concurrency), "-n", f"{name}-bench@%h", "--loglevel=INFO"]  # fmt: skip


def descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
    tree, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def kib(path: Path, field: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"{field} not in {path}")


def memory(pid: int) -> dict[str, float]:
    """RSS of the main process, and RSS and PSS summed over it and its descendants (MiB)."""
    pids = [pid, *descendants(pid)]
    rss = [kib(Path(f"/proc/{p}/status"), "VmRSS") for p in pids]
    pss = [kib(Path(f"/proc/{p}/smaps_rollup"), "Pss") for p in pids]
    return {"processes": len(pids), "rss_main": rss[0] / 1024, "rss_tree": sum(rss) / 1024, "pss_tree": sum(pss) / 1024}


def measure(tree: Path, name: str, env: dict[str, str], concurrency: int, workdir: Path) -> dict[str, float]:
    port = free_port()
    log_path = workdir / f"{tree.name}-{name}.log"
    with log_path.open("wb") as log:
        began = time.monotonic()
        proc = subprocess.Popen(
            command(name, port, concurrency), cwd=tree, env={**env, "PYTHONPATH": str(tree)},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = began + 180
            while time.monotonic() < deadline and proc.poll() is None:
                if name == "web":
                    try:
                        if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                elif " ready." in log_path.read_text(errors="replace"):
                    break
                time.sleep(0.05)
            else:
                raise SystemExit(f"{name} in {tree} did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            ready = time.monotonic() - began
            time.sleep(2)  # pool children finish their own start-up
            return {"start_s": ready, **memory(proc.pid)}
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to measure (repeatable; default: .)")
    parser.add_argument("--repeats", type=int, default=3, help="starts of each process per tree (medians shown)")
    parser.add_argument("--concurrency", type=int, default=2, help="pool children per worker (compose: 8, 2)")
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]

    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
    workdir = Path(tempfile.mkdtemp(prefix="rsiweb-procs-bench-"))
    os.environ.setdefault("RSI_DATA_DIR", str(workdir / "data"))
    django_on_bench_db("rsiweb_bench_procs")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "rsiweb.settings.base", "RSI_LOG_LEVEL": "WARNING"}

    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.repeats):
        for name in PROCESSES:
            for tree in trees:
                runs.setdefault((str(tree), name), []).append(measure(tree, name, env, args.concurrency, workdir))

    print("| process | tree | start (s) | RSS main (MiB) | RSS, all (MiB) | PSS, all (MiB) | procs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    summary = []
    for (tree, name), samples in runs.items():
        row = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
        summary.append({"tree": tree, "process": name, **row, "samples": samples})
        print(f"| {name} | {Path(tree).name} | {row['start_s']:.1f} | {row['rss_main']:.0f} | {row['rss_tree']:.0f} "
              f"| {row['pss_tree']:.0f} | {row['processes']:.0f} |")  # fmt: skip
    (workdir / "process_memory.json").write_text(json.dumps(summary, indent=2))
    print(f"\n{args.repeats} starts per process and tree, medians; every sample in {workdir / 'process_memory.json'}")


if __name__ == "__main__":
    main()
