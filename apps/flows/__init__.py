"""The process layer: the steps that carry one run across the domain apps.

A run moves from step to step through several apps at once: a submission is checked by
integrity, held by the research run's training gate and turned into jobs; a finished job advances
its experiment (train -> evaluate -> integrity) and counts against its run's health; a run starts,
pauses, spends its budget, is evaluated on the final split and finishes. Each of those steps
reads and writes rows of several apps, so it belongs to none of them: it lives here, above them
all (Zulip keeps the same idea in ``zerver/actions``), and the domain apps below keep their
models, their state machines and their selectors, and never import this package.

Why "flows": "process" already means an operating-system process here (the web server, the
workers, apps.core.procs) and "actions" means what an agent does (its tool calls, workers/agents),
so the name of what moves a run along is its flow.

It is a Django app only for ``AppConfig.ready`` (apps.flows.apps), which registers the flows that
follow a job's outcome in apps.jobs.hooks: the job engine never imports its callers. It has no
models, so it has no migrations.
"""
