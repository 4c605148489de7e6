"""The job engine reaches the flows above it only through apps.jobs.hooks, filled at app start."""

from apps.jobs import hooks


def test_app_start_registers_the_flows_that_follow_a_job_outcome() -> None:
    registered = hooks.registered()
    # The pipeline advances the job's experiment after every transition; the run lifecycle
    # charges the run's budget and counts the ended ones. Registered once each, however often
    # ready() ran.
    assert registered["on_transition"].count("apps.flows.pipeline.experiment_on_job_transition") == 1
    assert registered["on_finished"] == ["apps.flows.runs.run_charge_job"]
    assert registered["on_ended"] == ["apps.flows.runs.run_health_on_job_ended"]
