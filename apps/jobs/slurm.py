"""The Slurm executor: accelerator jobs become Slurm batch jobs (``RSI_EXECUTOR=slurm``).

On a cluster run by Slurm, long-lived workers on the GPU nodes are not allowed: work arrives as
batch jobs. With this executor the ``gpu`` queue's jobs are submitted with ``sbatch`` instead of
being sent to a Celery queue; the agents, the web server and the default queue stay on Celery.
The row stays the truth, as on Celery: the batch job runs ``python -m workers.gpu.batch JOB_ID``,
which claims the row and runs the same task body a Celery ``gpu`` worker runs.

Why ``sbatch`` directly and not submitit: submitit pickles a Python callable onto a shared folder
and unpickles it on the node, which would put the job's identity in a pickle rather than in the
row; our batch job needs only a job id, a command line and Slurm's own options, and the
reconciliation below needs Slurm's states, which ``squeue`` gives as text. Three commands, no
pickles.

Identity: each attempt's Slurm job is named ``rsi-<celery_id>`` (one id per attempt, the same
every time its message is sent), and submitted with ``--dependency=singleton``, so two copies of
one attempt (two reapers re-sending at once) never run at the same time; the second finds the
row no longer queued and exits, exactly as a duplicate Celery message does. A send first asks
``squeue`` whether Slurm still holds the attempt, so the reaper's re-sends do not submit twice.

Reconciliation (``apps.jobs.services.jobs_reconcile_slurm``, in every reaper sweep): a queued row whose Slurm job is
gone (lost, preempted, cancelled behind our back) is submitted again through the re-send path
(recorded as ``job.republished``), up to ``RSI_SLURM_MAX_SUBMITS`` times; a running row whose
Slurm job ended is lost (attempt N+1, below the attempt limit) or, at Slurm's time limit, failed
— once, under the row's lock, after Slurm's answer was read, so a job that recorded its own end
just before is left alone. A Slurm job still running for a row that already ended is cancelled.

Output: Slurm writes the batch job's stdout and stderr to ``<RSI_SLURM_DIR>/<celery_id>.out``;
its last lines are copied into the job's log (the job page's log tail) when the job ends.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from apps.core.errors import ApplicationError
from apps.core.queues import Queue
from apps.jobs.choices import JobKind
from apps.jobs.models import Job, JobLogLine
from rsiweb import env

logger = logging.getLogger(__name__)

# Slurm job states in which the batch job may still run (squeue's %T names).
LIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
     "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"}
)  # fmt: skip
# Lines of the batch job's output copied into the job's log when it ends.
OUTPUT_TAIL_LINES = 40
OUTPUT_HEADER = "slurm: output of batch job"
SUBMIT_PREFIX = "slurm: submitted as batch job"
COMMAND_TIMEOUT_SECONDS = 30


class SlurmError(ApplicationError):
    """A Slurm command failed (the controller is down, a bad option): said in Slurm's own words."""

    def __init__(self, message: str) -> None:
        super().__init__("slurm_unavailable", message)


@dataclass(frozen=True)
class SlurmConfig:
    """Where and how batch jobs are submitted (docs/deployment.md, "Slurm")."""

    folder: Path  # scripts' output files; on a file system the nodes share
    python: str  # the project's Python on the nodes
    workdir: Path  # the project checkout on the nodes
    partition: str = ""
    account: str = ""
    memory: str = ""  # --mem, e.g. "32G"; empty: the partition's default
    gpus_per_device: bool = True  # ask --gpus=N for a job on N accelerators (off on CPU-only clusters)
    train_args: tuple[str, ...] = ()  # extra sbatch options for training jobs
    eval_args: tuple[str, ...] = ()  # ... for evaluation jobs (where the sealed root is mounted)
    extra_args: tuple[str, ...] = ()  # ... for every job
    max_submits: int = 3  # submissions of one attempt before it fails (a batch job that dies before its claim)
    bin_dir: str = ""  # folder of sbatch/squeue/scancel when not on PATH
    environment: dict[str, str] = field(default_factory=dict)  # added to the batch job's environment

    def command(self, name: str) -> str:
        return str(Path(self.bin_dir) / name) if self.bin_dir else name


def executor() -> str:
    """``celery`` (the default) or ``slurm``: who runs the ``gpu`` queue's jobs."""
    name = str(getattr(settings, "RSI_EXECUTOR", None) or env.text("RSI_EXECUTOR", "celery")).strip().lower()
    if name not in ("celery", "slurm"):
        raise ApplicationError("invalid_executor", f"RSI_EXECUTOR must be 'celery' or 'slurm', got {name!r}.")
    return name


def slurm_config() -> SlurmConfig:
    folder = Path(env.text("RSI_SLURM_DIR", str(Path(settings.DATA_DIR) / "slurm")))
    return SlurmConfig(
        folder=folder,
        python=env.text("RSI_SLURM_PYTHON", sys.executable),
        workdir=Path(env.text("RSI_SLURM_WORKDIR", str(settings.BASE_DIR))),
        partition=env.text("RSI_SLURM_PARTITION", ""),
        account=env.text("RSI_SLURM_ACCOUNT", ""),
        memory=env.text("RSI_SLURM_MEM", ""),
        gpus_per_device=env.boolean("RSI_SLURM_GPUS", True),
        train_args=tuple(shlex.split(env.text("RSI_SLURM_TRAIN_ARGS", ""))),
        eval_args=tuple(shlex.split(env.text("RSI_SLURM_EVAL_ARGS", ""))),
        extra_args=tuple(shlex.split(env.text("RSI_SLURM_ARGS", ""))),
        max_submits=env.integer("RSI_SLURM_MAX_SUBMITS", 3),
        bin_dir=env.text("RSI_SLURM_BIN", ""),
    )


def runs_on_slurm(job: Job) -> bool:
    """Whether ``job`` is submitted to Slurm rather than sent to a Celery queue."""
    return job.queue == Queue.GPU and executor() == "slurm"


def job_name(job: Job) -> str:
    return f"rsi-{job.celery_id}"


def output_path(job: Job, config: SlurmConfig | None = None) -> Path:
    return (config or slurm_config()).folder / f"{job.celery_id}.out"


def _run(config: SlurmConfig, name: str, *args: str) -> str:
    argv = [config.command(name), *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{name} could not run: {exc}") from exc
    if done.returncode != 0:
        raise SlurmError(f"{name} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done.stdout


def slurm_states(config: SlurmConfig | None = None) -> dict[str, tuple[str, str]]:
    """Our batch jobs Slurm still knows: job name -> (Slurm job id, state), the newest per name."""
    config = config or slurm_config()
    out = _run(config, "squeue", "--noheader", "--states=all", "--format=%j|%i|%T")
    states: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        name, _, rest = line.strip().partition("|")
        slurm_id, _, state = rest.partition("|")
        if not name.startswith("rsi-") or not slurm_id:
            continue
        known = states.get(name)
        # A re-submitted attempt has two entries: the live one (or else the newer) speaks for it.
        if (
            known is None
            or (state in LIVE_STATES) > (known[1] in LIVE_STATES)
            or ((state in LIVE_STATES) == (known[1] in LIVE_STATES) and int(slurm_id) > int(known[0]))
        ):
            states[name] = (slurm_id, state.strip())
    return states


def sbatch_argv(job: Job, config: SlurmConfig) -> list[str]:
    """The ``sbatch`` command line for ``job`` (what it needs: time, devices, memory, its node class)."""
    minutes = max(1, -(-(job.time_limit_seconds + 60) // 60))  # the soft limit plus a minute of grace
    argv = [
        "--parsable",
        f"--job-name={job_name(job)}",
        f"--output={output_path(job, config)}",
        "--open-mode=append",
        f"--time={minutes}",
        "--dependency=singleton",
        "--export=ALL",
        f"--chdir={config.workdir}",
    ]
    if config.partition:
        argv.append(f"--partition={config.partition}")
    if config.account:
        argv.append(f"--account={config.account}")
    if config.memory:
        argv.append(f"--mem={config.memory}")
    devices = int(getattr(job, "accelerators", 1) or 1)
    if config.gpus_per_device:
        argv.append(f"--gpus={devices}")
    evaluation = job.kind in (JobKind.EVALUATE, JobKind.FINAL_EVAL)
    argv += [*config.extra_args, *(config.eval_args if evaluation else config.train_args)]
    command = f"exec {shlex.quote(config.python)} -m workers.gpu.batch {job.pk}"
    return [*argv, f"--wrap={command}"]


def slurm_submit(job: Job) -> str | None:
    """Submit ``job``'s attempt unless Slurm holds it already; its Slurm job id (None: already held).

    Logged on the job (the id a researcher looks up with ``squeue``/``sacct``).
    """
    config = slurm_config()
    held = slurm_states(config).get(job_name(job))
    if held is not None and held[1] in LIVE_STATES:
        logger.info("job %s: Slurm already holds it as %s (%s)", job.uuid, *held)
        return None
    config.folder.mkdir(parents=True, exist_ok=True)
    slurm_id = _run(config, "sbatch", *sbatch_argv(job, config)).strip().split(";")[0]
    slurm_log(job, f"{SUBMIT_PREFIX} {slurm_id} (output {output_path(job, config)})")
    return slurm_id


def slurm_cancel(job: Job) -> None:
    """``scancel`` every batch job of ``job``'s attempt (a queued job cancelled, a leftover)."""
    config = slurm_config()
    try:
        _run(config, "scancel", f"--name={job_name(job)}")
    except SlurmError:
        logger.warning("job %s: scancel failed; the batch job finds the row ended and exits", job.uuid, exc_info=True)


def slurm_log(job: Job, text: str) -> None:
    """A line in ``job``'s log (the job page's log tail)."""
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).first()  # serialises seq with other writers
        seq = (JobLogLine.objects.filter(job=job).aggregate(m=Max("seq"))["m"] or 0) + 1
        JobLogLine.objects.create(job=job, seq=seq, text=text)


def slurm_harvest_output(job: Job, *, state: str = "") -> bool:
    """Copy the last lines of ``job``'s batch output into its log, once; whether anything was copied."""
    path = output_path(job)
    if not path.is_file() or JobLogLine.objects.filter(job=job, text__startswith=OUTPUT_HEADER).exists():
        return False
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-OUTPUT_TAIL_LINES:]
    header = f"{OUTPUT_HEADER} ({state or 'ended'}; last {len(lines)} lines of {path.name}):"
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).first()
        if JobLogLine.objects.filter(job=job, text__startswith=OUTPUT_HEADER).exists():
            return False
        seq = JobLogLine.objects.filter(job=job).aggregate(m=Max("seq"))["m"] or 0
        JobLogLine.objects.bulk_create(
            [JobLogLine(job=job, seq=seq + 1 + i, text=text) for i, text in enumerate([header, *lines])]
        )
    return True
