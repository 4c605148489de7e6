"""Building task environments end to end: a real gpu worker runs RSI-Craft on the minibench variants.

Offline the base is θ0 and the strong model is the arithmetic reference. Each generated variant
is built to fail one filter (variants.py `expect`); the build must reject it for that reason,
and record every decision, with its numbers, as an event.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.benchmarks.minibench.variants import build_task_variants, write_task_variants
from apps.core.errors import ApplicationError
from apps.dojo.choices import BUILD_TERMINAL_STATES
from apps.dojo.models import EnvironmentBuild, TaskEnvironment
from apps.dojo.services import environment_build_create
from apps.experiments.models import Event
from apps.jobs.choices import JobStatus
from tests.apps.jobs.conftest import wait_for

# What each arithmetic variant must become (kept, or the rejection reason); the mixed pool is
# split by metric first, and its lettered-option subset is unknown to the reference.
EXPECTED = {
    "arithmetic-sealed-forms": "",
    "arithmetic-catalog-forms": "",
    "arithmetic-large": "",
    "arithmetic-tiny": "too_small",
    "arithmetic-sampled": "unstable",
    "arithmetic-blind-metric": "metric_ignores_output",
    "arithmetic-three-digit": "too_hard",
    "arithmetic-extended-vocab": "too_hard",
    "arithmetic-mixed/sum": "",
    "arithmetic-mixed/choice": "too_hard",
}


@pytest.mark.django_db(transaction=True)
def test_a_gpu_worker_builds_the_variants_and_rejects_each_for_its_reason(celery_worker, minibench_dir: Path):
    worker = celery_worker(queues="gpu", wait=False)
    worker.wait_ready(timeout=300)  # importing torch and TRL on a loaded 2-core box takes minutes
    build = environment_build_create(
        source="minibench-variants:arithmetic",
        base_dir=minibench_dir / "theta0",
        strong_dir=minibench_dir / "references" / "arithmetic",
        config={"repeats": 3},
    )
    assert build.job is not None
    assert build.job.queue == "gpu"

    def finished() -> bool:
        build.refresh_from_db()
        return build.status in BUILD_TERMINAL_STATES

    wait_for(finished, timeout=1200, what="the dojo build", logs=worker.log)
    assert build.status == "succeeded", build.error

    def job_ended() -> bool:
        # The build row is finished inside the job; the job's own success is recorded just after.
        build.job.refresh_from_db()
        return build.job.status != JobStatus.RUNNING

    wait_for(job_ended, timeout=120, what="the build job to record its end", logs=worker.log)
    assert build.job.status == JobStatus.SUCCEEDED

    envs = {env.name: env for env in TaskEnvironment.objects.filter(build=build)}
    assert {name: env.reason for name, env in envs.items()} == EXPECTED
    assert {name for name, env in envs.items() if env.status == "kept"} == {n for n, r in EXPECTED.items() if not r}

    # The size filter's downsample is frozen on the row; the rejected tasks stop at their step.
    large = envs["arithmetic-large"]
    size = next(d for d in large.decisions if d["step"] == "size")
    assert (size["items"], size["kept_items"], size["downsampled"]) == (400, 300, True)
    assert len(large.sample_ids) == 300 == len(set(large.sample_ids))
    assert envs["arithmetic-tiny"].rejected_at == "size"
    sampled = envs["arithmetic-sampled"].decisions[-1]
    assert sampled["step"] == "reliability"
    assert sampled["flip_rate"] > 0.05
    blind = envs["arithmetic-blind-metric"].decisions[-1]
    assert blind["step"] == "mutation"
    assert blind["move"] == 0
    kept = envs["arithmetic-sealed-forms"].decisions
    assert [d["step"] for d in kept] == ["subset_split", "size", "reliability", "mutation", "discriminability"]
    assert kept[-1]["gap"] >= 0.10
    assert kept[2]["score_range"] == 0
    hard = envs["arithmetic-three-digit"].decisions[-1]
    assert hard["step"] == "discriminability"
    assert hard["strong"] < 0.20
    assert hard["base"] < 0.20

    # Every decision is an event carrying its numbers, and the build's summary counts the reasons.
    events = Event.objects.filter(type="dojo.decision", arguments__build=str(build.uuid))
    assert events.count() == sum(len(env.decisions) for env in envs.values())
    recorded = {(e.arguments["task"], e.arguments["step"]): e.arguments for e in events}
    assert recorded[("arithmetic-large", "size")]["ids_sha256"] == size["ids_sha256"]
    assert build.summary["rejected"] == {"too_small": 1, "unstable": 1, "metric_ignores_output": 1, "too_hard": 3}


@pytest.mark.django_db
def test_dojo_build_inline_rejects_a_task_both_models_find_easy(minibench_dir: Path, tmp_path: Path, capsys):
    # Offline θ0 scores 0 everywhere, so "too easy" needs a strong base: the reference itself,
    # on the catalog-form sums it answers 87.5 % of (docs/benchmarks.md, "Task variants").
    variant = next(v for v in build_task_variants(seed=0) if v.name == "arithmetic-catalog-forms")
    write_task_variants(tmp_path / "tasks", [variant])
    reference = minibench_dir / "references" / "arithmetic"
    call_command("dojo_build", source=f"folder:{tmp_path / 'tasks'}", base=reference, strong=reference,
                 config='{"repeats": 2}', inline=True)  # fmt: skip
    env = TaskEnvironment.objects.get(name="arithmetic-catalog-forms")
    assert (env.status, env.reason, env.rejected_at) == ("rejected", "too_easy", "discriminability")
    assert env.base_score == env.strong_score > 0.80
    assert "arithmetic-catalog-forms: rejected too_easy at discriminability" in capsys.readouterr().out


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"source": "minibench-variants:poetry"}, "needs task names"), ({"source": "hub:x"}, "unknown task source"),
     ({"config": {"repeats": 1}}, "at least 2"), ({"strong_dir": Path("/nonexistent")}, "not a checkpoint folder")],
)  # fmt: skip
def test_a_bad_build_request_is_refused_before_anything_is_written(minibench_dir: Path, kwargs, message):
    request = {"source": "minibench-variants:arithmetic", "base_dir": minibench_dir / "theta0",
               "strong_dir": minibench_dir / "references" / "arithmetic", **kwargs}  # fmt: skip
    with pytest.raises(ApplicationError, match=message) as caught:
        environment_build_create(**request)
    assert caught.value.status_code == 400
    assert not EnvironmentBuild.objects.exists()
    with pytest.raises(CommandError, match=message):
        call_command("dojo_build", source=request["source"], base=request["base_dir"], strong=request["strong_dir"],
                     config=json.dumps(kwargs.get("config", {})))  # fmt: skip
