"""A Slurm batch job's body: ``python -m workers.gpu.batch JOB_ID`` runs one accelerator job.

The Slurm executor (apps.jobs.slurm) submits this command for each attempt of a ``gpu``-queue
job. It sets Django up with the deployment's settings (the environment ``sbatch`` exported),
runs the job's task in this process — the same task body, claim, heartbeat and failure handler a
Celery ``gpu`` worker runs — and then copies the tail of its own output into the job's log.

It never passes its turn: under Slurm, the order in which batch jobs start is Slurm's (its
priorities and fair share), so the job runs as soon as it is claimed. A copy of an attempt that
finds the row no longer queued (another copy claimed it, or it was cancelled) exits at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.gpu.batch", description=__doc__.splitlines()[0])
    parser.add_argument("job_id", type=int, help="the Job row's id")
    args = parser.parse_args(argv)
    # Into the batch job's output file (Slurm's --output), whose tail reaches the job's log.
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings.base")
    import django  # noqa: PLC0415 - settings first

    django.setup()
    from apps.jobs.choices import JOB_TERMINAL_STATES, JobKind  # noqa: PLC0415
    from apps.jobs.models import Job  # noqa: PLC0415
    from apps.jobs.services import TASK_NAMES  # noqa: PLC0415
    from apps.jobs.slurm import slurm_harvest_output  # noqa: PLC0415
    from rsiweb.celery import app  # noqa: PLC0415
    from workers.runtime import MAX_PASSES, worker_name  # noqa: PLC0415

    job = Job.objects.filter(pk=args.job_id).first()
    if job is None:
        logger.error("job %s does not exist; nothing to run", args.job_id)
        return 2
    logger.info(
        "slurm job %s: job %s (%s, attempt %s)", os.environ.get("SLURM_JOB_ID", "?"), job.uuid, job.kind, job.attempt
    )
    app.loader.import_default_modules()  # the task modules a worker autodiscovers
    task = app.tasks[TASK_NAMES[JobKind(job.kind)]]
    result = task.apply(kwargs={"job_id": job.pk, "passes": MAX_PASSES}, task_id=job.celery_id, throw=False)
    sys.stdout.flush()
    sys.stderr.flush()
    job.refresh_from_db()
    if job.worker == worker_name() and job.status in JOB_TERMINAL_STATES:
        # This copy ran it: its output (a traceback included) belongs on the job's page.
        slurm_harvest_output(job, state=str(job.status))
    return 1 if result.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
