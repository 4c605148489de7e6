"""run_launch: the one service behind ``manage.py start_run`` and the dashboard's "Start a run" form."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from apps.core.errors import ApplicationError
from apps.flows.runs import run_launch
from apps.research.agent_config import llm_config, llm_profiles
from apps.research.choices import RunStatus
from apps.research.models import Run
from tests.factories import BenchmarkFactory, CheckpointFactory

pytestmark = pytest.mark.django_db

FAST = {
    "RSI_LLM_PROFILES": "fast, broken",
    "RSI_LLM_PROFILE_FAST_BASE_URL": "http://127.0.0.1:9/v1",
    "RSI_LLM_PROFILE_FAST_MODEL": "small-model",
    "RSI_LLM_PROFILE_FAST_API_KEY": "sk-fast-secret",
    "RSI_LLM_PROFILE_FAST_MODEL_MAIN": "big-model",
    "RSI_LLM_PROFILE_BROKEN_MODEL": "no-url",
}


@pytest.fixture
def profiles(monkeypatch):
    for name in ("RSI_LLM_BASE_URL", "RSI_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)


def test_named_profiles_read_their_own_variables(profiles):
    assert llm_profiles() == ["fast"]  # default and broken lack a base URL or model
    assert (llm_config("worker", "fast").model, llm_config("main", "fast").model) == ("small-model", "big-model")
    assert llm_config("worker", "fast").api_key == "sk-fast-secret"


def test_the_command_starts_a_run_through_the_service():
    benchmark = BenchmarkFactory(name="test/launch")
    CheckpointFactory(is_base=True)
    call_command("start_run", "--benchmark", "test/launch", "--serial-workers", "--no-reviewer", "--seed", "7",
                 "--parallel", "3", "--name", "from the cli")  # fmt: skip
    run = Run.objects.get(name="from the cli")
    assert run.status == RunStatus.RUNNING
    assert run.benchmark == benchmark
    assert run.max_parallel_workers == 1  # serial Workers
    assert (run.policy["reviewers"], run.policy["serial_workers"], run.policy["seed"]) == (False, True, 7)
    assert "llm_profile" not in run.policy


def test_an_llm_run_names_its_profile_and_is_checked_first(profiles):
    benchmark, base = BenchmarkFactory(), CheckpointFactory(is_base=True)
    run = run_launch(benchmark=benchmark, base_checkpoint=base, policy="llm", llm_profile="fast", llm_tokens=5000)
    assert (run.agent_mode, run.policy["llm_profile"], run.budget_llm_tokens) == ("llm", "fast", 5000)
    with pytest.raises(ApplicationError) as refused:
        run_launch(benchmark=benchmark, base_checkpoint=base, policy="llm", llm_profile="broken")
    assert refused.value.code == "llm_not_configured"
    assert "RSI_LLM_PROFILE_BROKEN_BASE_URL" in refused.value.message
    with pytest.raises(CommandError, match="llm_not_configured"):
        call_command("start_run", "--benchmark", benchmark.name, "--policy", "llm")  # no default profile here


def test_only_a_base_checkpoint_starts_a_run():
    with pytest.raises(ApplicationError) as refused:
        run_launch(benchmark=BenchmarkFactory(), base_checkpoint=CheckpointFactory(is_base=False))
    assert refused.value.code == "not_a_base_checkpoint"


def test_the_search_policy_is_chosen_per_run_and_recorded():
    BenchmarkFactory(name="test/search")
    CheckpointFactory(is_base=True)
    call_command("start_run", "--benchmark", "test/search", "--search-policy", "uct", "--name", "uct run")
    run = Run.objects.get(name="uct run")
    assert run.search_policy == "uct"
    assert run.events.get(type="run.created").arguments["search_policy"] == "uct"
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("start_run", "--benchmark", "test/search", "--search-policy", "random", "--name", "bad")
    with pytest.raises(ApplicationError) as refused:
        run_launch(benchmark="test/search", search_policy="random", name="bad")
    assert refused.value.code == "invalid_search_policy"
    assert not Run.objects.filter(name="bad").exists()
    call_command("start_run", "--benchmark", "test/search", "--name", "default run")
    assert Run.objects.get(name="default run").search_policy == "greedy"


def test_the_learning_rate_schedule_is_a_run_setting_the_heuristic_trains_with():
    BenchmarkFactory(name="test/schedule")
    CheckpointFactory(is_base=True)
    call_command("start_run", "--benchmark", "test/schedule", "--lr-scheduler", "constant", "--name", "constant run")
    assert Run.objects.get(name="constant run").policy["heuristic"]["lr_scheduler_type"] == "constant"
    call_command("start_run", "--benchmark", "test/schedule", "--name", "default schedule")
    assert Run.objects.get(name="default schedule").policy["heuristic"]["lr_scheduler_type"] == "cosine"
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("start_run", "--benchmark", "test/schedule", "--lr-scheduler", "warm", "--name", "bad")
    with pytest.raises(ApplicationError) as refused:
        run_launch(benchmark="test/schedule", lr_scheduler_type="warm", name="bad")
    assert refused.value.code == "invalid_lr_scheduler"
    assert "constant, constant_with_warmup, linear, cosine" in refused.value.message
    assert not Run.objects.filter(name="bad").exists()
