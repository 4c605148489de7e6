"""A small sealed benchmark, a local catalog and a run with Workers, for the ExpOS tool tests.

Everything is real: the benchmark is sealed by ``benchmark_register`` (files hashed under a tmp
SEALED_ROOT), data is registered through ``worker_add_data`` into a tmp artifact store, and the
handlers are called with ``ToolContext`` objects built from real rows.

``call`` runs a handler the way the REST layer does (apps.expos.views): inside one transaction,
and — when the handler refuses — records the evidence the refusal carries *after* that
transaction has rolled back (``record_after_rollback``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from django.db import transaction

from apps.benchmarks.services import benchmark_register
from apps.core.errors import ApplicationError
from apps.expos.auth import agent_token_issue
from apps.expos.registry import Role, ToolContext, load_all
from apps.research.choices import NodeKind
from apps.research.models import ResearchNode, Run
from apps.research.services import node_create
from tests.factories import CheckpointFactory, make_run

TEMPLATE = "Question: {question}\nAnswer:"
FEEDBACK = [
    ("f1", "Lena keeps 37 marbles in a jar and buys 45 more at the corner shop. How many marbles now?", "82"),
    ("f2", "A farmer plants 58 trees along the river and another 26 trees by the barn. How many trees?", "84"),
    ("f3", "Omar reads 19 pages on Monday and 64 pages on Tuesday of his long novel. How many pages?", "83"),
]
FINAL = [
    ("x1", "The library lends 71 books in the morning and 18 books in the evening today. How many books?", "89"),
    ("x2", "Priya walks 33 blocks to school and 48 blocks to the park after class. How many blocks in all?", "81"),
]
CLEAN = [
    (f"Question: A shop sells {a} pens and then {b} more pens to a school. How many pens?\nAnswer:", f" {a + b}")
    for a, b in [(11, 12), (13, 14), (15, 16), (21, 22), (23, 24), (25, 26), (31, 32), (41, 42)]
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _catalog_dataset(root: Path, name: str, rows: list[dict[str, Any]], fmt: str = "sft") -> None:
    folder = root / name
    write_jsonl(folder / "data.jsonl", rows)
    meta = {"name": name, "task": "arithmetic", "description": f"{name} rows", "quality": "?", "rows": len(rows),
            "format": fmt, "files": ["data.jsonl"], "license": "CC-BY-4.0", "tags": ["synthetic"]}  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    (folder / "README.md").write_text(f"---\nlicense: cc-by-4.0\n---\n\n# {name}\n", encoding="utf-8")


def sft(prompt: str, completion: str) -> dict[str, str]:
    return {"prompt": prompt, "completion": completion}


@dataclass
class World:
    run: Run
    main: ResearchNode
    worker: ResearchNode
    other: ResearchNode
    reviewer: ResearchNode
    theta0: Any
    reference: Any
    clean: str = ""  # datapool handles, filled by the fixture
    honeypot: str = ""

    def ctx(self, node: ResearchNode, *, key: str | None = None) -> ToolContext:
        role = {NodeKind.MAIN: Role.MAIN, NodeKind.WORKER: Role.WORKER, NodeKind.REVIEWER: Role.REVIEWER}[node.kind]
        node.refresh_from_db()
        run = Run.objects.get(pk=self.run.pk)
        return ToolContext(run=run, node=node, role=role, idempotency_key=key)

    def set_policy(self, **policy: Any) -> None:
        run = Run.objects.get(pk=self.run.pk)
        run.policy = {**run.policy, **policy}
        run.save(update_fields=["policy", "updated_at"])


def call(ctx: ToolContext, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Call a registered tool as the REST layer does: one transaction, refusal evidence after rollback."""
    registered = load_all()[tool]
    assert ctx.role in registered.roles, f"{ctx.role} may not call {tool}"
    try:
        with transaction.atomic():
            return registered.handler(ctx, args)
    except ApplicationError as exc:
        record = getattr(exc, "record_after_rollback", None)
        if record is not None:
            record()
        raise


@pytest.fixture
def roots(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.ARTIFACT_CACHE_DIR = str(tmp_path / "artifact-cache")
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    settings.WORKSPACE_ROOT = str(tmp_path / "workspaces")
    settings.MINIBENCH_ROOT = str(tmp_path / "minibench")
    task = tmp_path / "task"
    task.mkdir()
    (task / "task.json").write_text(
        json.dumps(
            {
                "name": "arithmetic",
                "evaluator": "exact_match",
                "description": "addition",
                "prompt_template": TEMPLATE,
                "decoding": {"max_new_tokens": 8, "do_sample": False},
                "stop": ["\n"],
                "use_chat_template": False,
            }
        ),  # fmt: skip
        encoding="utf-8",
    )
    write_jsonl(task / "feedback.jsonl", [{"id": i, "prompt": q, "answer": a} for i, q, a in FEEDBACK])
    write_jsonl(task / "final.jsonl", [{"id": i, "prompt": q, "answer": a} for i, q, a in FINAL])
    catalog = tmp_path / "minibench" / "catalog"
    _catalog_dataset(catalog, "arith-clean", [sft(p, c) for p, c in CLEAN])
    # The honeypot: clean rows plus one feedback and one final item verbatim, in the task template.
    _catalog_dataset(
        catalog,
        "arith-honeypot",
        [sft(p, c) for p, c in CLEAN[:3]]
        + [sft(TEMPLATE.format(question=FEEDBACK[0][1]), f" {FEEDBACK[0][2]}")]
        + [sft(p, c) for p, c in CLEAN[3:5]]
        + [sft(TEMPLATE.format(question=FINAL[1][1]), f" {FINAL[1][2]}")],
    )
    prefs = [{"prompt": p, "chosen": c, "rejected": " 7"} for p, c in CLEAN]
    _catalog_dataset(catalog, "arith-prefs", prefs, fmt="dpo")
    return {"task": task, "catalog": catalog, "tmp": tmp_path}


def build_world(roots: dict[str, Path], **policy: Any) -> World:
    benchmark = benchmark_register(name="test/arith", task_dir=roots["task"])
    theta0 = CheckpointFactory(is_base=True)
    reference = CheckpointFactory(is_reference=True)
    run = make_run(benchmark=benchmark, base_checkpoint=theta0, policy=policy)
    main = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
    worker = node_create(run=run, kind=NodeKind.WORKER, task="sft on clean data")
    other = node_create(run=run, kind=NodeKind.WORKER, task="another direction")
    reviewer = node_create(run=run, kind=NodeKind.REVIEWER, task="check data", upstream=[worker])
    world = World(run=run, main=main, worker=worker, other=other, reviewer=reviewer, theta0=theta0, reference=reference)
    ctx = world.ctx(worker)
    world.clean = call(ctx, "worker_add_data", {"catalog": "arith-clean"})["entry"]["handle"]
    world.honeypot = call(ctx, "worker_add_data", {"catalog": "arith-honeypot"})["entry"]["handle"]
    return world


@pytest.fixture
def world(db, roots) -> World:
    return build_world(roots)


@pytest.fixture
def live_world(transactional_db, roots) -> World:
    """A world on committed data, for calls through pytest-django's live server."""
    return build_world(roots)


@pytest.fixture
def live_call(live_server, live_world):
    """``call(who, tool, json=... | data=..., **headers)``: one tool call over the real REST endpoint."""
    # Issued before the test starts, so a test's before/after counts see only its own calls.
    tokens = {
        who: agent_token_issue(run=live_world.run, node=node, role=role)[0]
        for who, node, role in (
            ("worker", live_world.worker, Role.WORKER),
            ("main", live_world.main, Role.MAIN),
            ("reviewer", live_world.reviewer, Role.REVIEWER),
        )
    }

    def call(who: str, tool: str, *, json: Any = None, data: bytes | None = None, **headers: str) -> requests.Response:
        if data is not None:
            headers = {"Content-Type": "application/json", **headers}
        return requests.post(
            f"{live_server.url}/api/v1/tools/{tool}",
            json=json,
            data=data,
            headers={"Authorization": f"Bearer {tokens[who]}", **headers},
            timeout=60,
        )

    return call


def train_spec(*datasets: str, **train: Any) -> dict[str, Any]:
    return {"train": {"recipe": "sft", "datasets": list(datasets), "max_steps": 20, **train}}
