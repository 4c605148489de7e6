"""Job engine overhead on the gpu queue: enqueue-to-start latency and the idle gap between jobs.

A real `celery worker` (prefork, concurrency 1, queue gpu — one accelerator slot) runs trivial
jobs enqueued through `job_enqueue`, so every cost of the real path is in the figures: the row
and its event, the on-commit send, the broker, the worker's fetch (prefetch 1, acks late), the
conditional-UPDATE claim, the heartbeat thread, the success transition and the ack. The job body
is a datapool filter of 20 rows that changes nothing (milliseconds), so what is measured is the
engine, not the work.

Two phases, timestamps read back from the Job rows (one clock, one machine):

* **latency** — one job at a time on an idle worker: ``started_at - created_at``;
* **gaps** — a burst queued at once: ``started_at[i+1] - finished_at[i]``, and how busy the slot
  was from the first start to the last finish (the target: over 95% with queued work).

With ``--slurm-jobs N`` the latency phase runs a second time under the Slurm executor
(``RSI_EXECUTOR=slurm``) on a real single-node Slurm cluster the bench starts itself
(tests/support/slurm.py): each job is an ``sbatch`` batch job, so its enqueue-to-start is the
submission, Slurm's scheduling and a fresh interpreter's start-up to the claim, where the Celery
worker above is warm. Both rows print side by side, with their ratio.

    DATABASE_URL is ignored: the bench uses its own database (BENCH_DATABASE_URL, default
    postgres://postgres@127.0.0.1:5432/rsiweb_bench_jobs, dropped and re-created).
    REDIS_URL=redis://127.0.0.1:6379/4 .venv/bin/python bench/job_queue_latency.py --jobs 40
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._setup import ROOT, django_on_bench_db, percentile  # noqa: E402


def start_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "rsiweb", "worker", "-Q", "gpu", "-n", "bench@%h",
         "--pool=prefork", "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--loglevel=INFO"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if " ready." in log_path.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise SystemExit(f"worker did not start:\n{log_path.read_text(errors='replace')[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=40, help="jobs per phase")
    parser.add_argument("--slurm-jobs", type=int, default=0, help="jobs timed under the Slurm executor (0: none)")
    args = parser.parse_args()

    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/4")
    workdir = Path(tempfile.mkdtemp(prefix="rsiweb-jobs-bench-"))
    os.environ.setdefault("RSI_DATA_DIR", str(workdir / "data"))
    url = django_on_bench_db("rsiweb_bench_jobs")

    import redis
    from django.conf import settings

    from apps.datapool.services import data_register_from_workspace
    from apps.jobs.choices import JOB_TERMINAL_STATES, JobKind, JobStatus
    from apps.jobs.models import Job
    from apps.jobs.services import job_enqueue

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    workspace = workdir / "workspace"
    workspace.mkdir()
    rows = [{"prompt": f"Question: what is {i} plus 1?\nAnswer:", "completion": f" {i + 1}"} for i in range(20)]
    (workspace / "tiny.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    entry = data_register_from_workspace(workspace=workspace, path="tiny.jsonl", name="bench-tiny")
    spec = {"op": "filter", "inputs": [entry.handle], "params": {"max_chars": 10_000}}

    env = dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="rsiweb.settings.base", PYTHONPATH=str(ROOT))
    worker = start_worker(env, workdir / "worker.log")

    def enqueue() -> Job:
        # Data jobs normally go to `default`; routed to `gpu` here so the accelerator slot's path is timed.
        return job_enqueue(kind=JobKind.DATA, spec=spec, queue="gpu")

    def wait_all(jobs: list[Job], timeout: float = 300) -> list[Job]:
        deadline = time.monotonic() + timeout
        ids = [j.pk for j in jobs]
        while time.monotonic() < deadline:
            done = list(Job.objects.filter(pk__in=ids, status__in=JOB_TERMINAL_STATES).order_by("started_at"))
            if len(done) == len(ids):
                failed = [j for j in done if j.status != JobStatus.SUCCEEDED]
                if failed:
                    raise SystemExit(f"{len(failed)} jobs did not succeed: {failed[0].error[-500:]}")
                return done
            time.sleep(0.05)
        raise SystemExit(f"jobs did not finish in {timeout}s; see {workdir / 'worker.log'}")

    try:
        wait_all([enqueue()])  # warm-up: the pool child's first task opens its connections
        latencies = []
        for _ in range(args.jobs):
            (job,) = wait_all([enqueue()])
            latencies.append((job.started_at - job.created_at).total_seconds())
        burst = wait_all([enqueue() for _ in range(args.jobs)])
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)

    slurm_latencies = slurm_phase(args.slurm_jobs, workdir, enqueue, wait_all) if args.slurm_jobs else []

    gaps = [(b.started_at - a.finished_at).total_seconds() for a, b in zip(burst, burst[1:], strict=False)]
    busy = sum((j.finished_at - j.started_at).total_seconds() for j in burst)
    span = (burst[-1].finished_at - burst[0].started_at).total_seconds()
    bodies = [(j.finished_at - j.started_at).total_seconds() for j in burst]

    def row(name: str, values: list[float]) -> str:
        return (
            f"| {name} | {len(values)} | {statistics.median(values) * 1000:.0f} | "
            f"{percentile(values, 0.95) * 1000:.0f} | {max(values) * 1000:.0f} |"
        )

    print(f"broker {settings.CELERY_BROKER_URL.split('://')[0]}, database {settings.DATABASES['default']['ENGINE']}")
    print("| measure | n | median ms | p95 ms | max ms |")
    print("|---|---|---|---|---|")
    print(row("enqueue-to-start, idle worker", latencies))
    if slurm_latencies:
        print(row("enqueue-to-start, Slurm batch job (RSI_EXECUTOR=slurm)", slurm_latencies))
    print(row("idle gap between queued jobs", gaps))
    print(row("job body (claim to success)", bodies))
    print(f"slot busy over the burst: {100 * busy / span:.1f}% of {span:.1f}s "
          f"(with these {statistics.median(bodies) * 1000:.0f} ms bodies; a real training job is minutes)")  # fmt: skip
    if slurm_latencies:
        ratio = statistics.median(slurm_latencies) / statistics.median(latencies)
        print(f"Slurm / Celery enqueue-to-start (medians): {ratio:.0f}x")
    # The gap is paid once per job, so with real jobs the slot's busy share is body / (body + gap).
    p95_gap = percentile(gaps, 0.95)
    for body in (10.0, 60.0):
        print(f"implied busy share for {body:.0f} s jobs at the p95 gap: {100 * body / (body + p95_gap):.2f}%")


def slurm_phase(jobs: int, workdir: Path, enqueue, wait_all) -> list[float]:
    """Enqueue-to-start of ``jobs`` jobs, one at a time, as batch jobs of a real Slurm cluster."""
    from tests.support.slurm import slurm_cluster_running

    (workdir / "slurm").mkdir()
    with slurm_cluster_running(workdir / "slurm") as cluster:
        os.environ.update(RSI_EXECUTOR="slurm", SLURM_CONF=str(cluster.conf), RSI_SLURM_GPUS="0",
                          RSI_SLURM_DIR=str(workdir / "slurm-out"), PYTHONPATH=str(ROOT))  # fmt: skip
        try:
            wait_all([enqueue()])  # warm-up: the node's first interpreter reads the packages from disk
            latencies = []
            for _ in range(jobs):
                (job,) = wait_all([enqueue()])
                latencies.append((job.started_at - job.created_at).total_seconds())
        finally:
            os.environ["RSI_EXECUTOR"] = "celery"
    return latencies


if __name__ == "__main__":
    main()
