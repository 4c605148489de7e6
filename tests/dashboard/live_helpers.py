"""Helpers of the live tests: the event reducer the browser runs, in Python, and test publishers.

``apply_run_event`` follows static/dashboard/live.js ``applyRunEvent`` rule for rule; the
browser tests check the JavaScript itself against a fresh snapshot, these check the server's
half of the contract (snapshot shape, event payloads, ordering) without a browser.

The ``publish_*`` functions send what the research services are to publish once they are wired
(docs/benchmarks-dashboard.md lists which service publishes which event); until then tests that
grow the DAG through those services publish the events themselves, through the same
``publish_on_commit`` and payload builders the services will use.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from apps.experiments.selectors import experiment_live
from apps.live.events import publish_on_commit
from apps.live.groups import run_group
from apps.research.selectors import decision_live, edge_live, guidance_live, node_live
from apps.reviews.selectors import report_live

COLLECTIONS = {
    "node": "nodes",
    "edge": "edges",
    "decision": "decisions",
    "experiment": "experiments",
    "guidance": "guidance",
    "report": "reports",
    "job": "jobs",
}


def as_json(value: Any) -> Any:
    """What the browser holds: the value after the websocket's JSON encoding."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def key_of(entity: str, record: dict[str, Any]) -> str | None:
    """live.js keyOf: an edge by its two ends, everything else by uuid."""
    if entity == "edge":
        return f"{record['source']}>{record['target']}" if record.get("source") and record.get("target") else None
    return record.get("uuid")


def run_state(snapshot: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = {"run": copy.deepcopy(snapshot["run"])}
    for entity, collection in COLLECTIONS.items():
        state[collection] = {key_of(entity, record): copy.deepcopy(record) for record in snapshot[collection]}
    return state


def apply_run_event(state: dict[str, Any], event: str, payload: dict[str, Any]) -> None:
    entity = event.split(".", 1)[0]
    if entity == "run":
        state["run"].update(payload)
        return
    collection = COLLECTIONS.get(entity)
    if collection is None:
        return
    key = key_of(entity, payload)
    if not key:
        return
    record = state[collection].get(key)
    if event == "job.progress":
        if record is None:
            return
        if "progress" in payload:
            record["progress"] = payload["progress"]
        if payload.get("metrics_point"):
            record["metrics_last"] = {**record.get("metrics_last", {}), **payload["metrics_point"]}
        return
    if record is None:
        state[collection][key] = dict(payload)
    else:
        record.update(payload)


def publish_node(node: Any, event: str = "node.created") -> None:
    publish_on_commit(run_group(node.run.uuid), event, node_live(node))


def publish_edges_of(node: Any) -> None:
    for edge in node.upstream_edges.select_related("upstream", "downstream"):
        publish_on_commit(run_group(node.run.uuid), "edge.created", edge_live(edge))


def publish_decision(decision: Any) -> None:
    publish_on_commit(run_group(decision.run.uuid), "decision.created", decision_live(decision))


def publish_experiment(experiment: Any, event: str = "experiment.created") -> None:
    publish_on_commit(run_group(experiment.run.uuid), event, experiment_live(experiment))


def publish_guidance(guidance: Any, event: str = "guidance.updated") -> None:
    publish_on_commit(run_group(guidance.run.uuid), event, guidance_live(guidance))


def publish_report(report: Any) -> None:
    publish_on_commit(run_group(report.run.uuid), "report.created", report_live(report))
