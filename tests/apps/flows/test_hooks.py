"""The job engine reaches the flows above it only through apps.jobs.hooks, filled at app start."""

from apps.jobs import hooks


def test_app_start_registers_the_flows_that_follow_a_job_outcome() -> None:
    registered = hooks.registered()
    # The pipeline advances the job's experiment after every transition; the run's health
    # check counts the ended ones. Registered once each, however often ready() ran.
    assert registered["on_transition"].count("apps.flows.pipeline.experiment_on_job_transition") == 1
    assert any(name.endswith(".run_health_on_job_ended") for name in registered["on_ended"])
    assert len(registered["on_ended"]) == len(set(registered["on_ended"]))
