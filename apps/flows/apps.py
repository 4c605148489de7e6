from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "apps.flows"
    label = "flows"

    def ready(self) -> None:
        # The job engine (apps.jobs) reports outcomes through its hook registry; the flows that
        # follow them sit above it and register here, once the app registry is ready.
        from apps.flows.pipeline import experiment_on_job_transition  # noqa: PLC0415 - once apps are ready
        from apps.flows.runs import run_charge_job, run_health_on_job_ended  # noqa: PLC0415 - once apps are ready
        from apps.jobs import hooks  # noqa: PLC0415 - once apps are ready

        hooks.on_transition(experiment_on_job_transition)
        hooks.on_finished(run_charge_job)
        hooks.on_ended(run_health_on_job_ended)
