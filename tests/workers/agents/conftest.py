"""Fixtures for the agent loops: a small real world served over HTTP, and the real stack.

``small_world``: a sealed three-question benchmark, a local catalog in the minibench layout (a clean
set, a tiny set, a wrong-format set, a honeypot holding the sealed items), θ0 as a factory row, a
created run — all real rows on PostgreSQL, served by pytest-django's live server, so agent steps
run in this process against the real REST API (jobs are queued but nothing trains: no gpu worker).

The real stack (web + gpu/agents/default Celery workers, built minibench) lives in
``tests/workers/agents/stack.py`` for the end-to-end runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from apps.benchmarks.services import benchmark_register
from apps.research.models import AgentLoop, ResearchNode, Run
from apps.research.services import run_create
from tests.factories import CheckpointFactory
from tests.fakes.openai_chat import FakeChatServer, Script
from tests.workers.agents import stack as support
from tests.workers.agents.stack import install, minibench_root

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


# Honest data never carries a sealed item's content (its operands, in order, with their sum) in any
# sentence form: the contamination scanner's salient layer rightly matches those as copies.
_SEALED_OPERANDS = {tuple(int(n) for n in re.findall(r"\d+", q)[:2]) for _, q, _ in FEEDBACK + FINAL}


def _rows(n: int, offset: int = 0, sentence: bool = False) -> list[dict[str, str]]:
    rows = []
    i = 0
    while len(rows) < n:
        a, b = 11 + (i + offset) % 80, 12 + (3 * i + offset) % 70
        i += 1
        if (a, b) in _SEALED_OPERANDS:
            continue
        answer = f"The answer is {a + b}." if sentence else str(a + b)
        question = f"A shop sells {a} pens and then {b} more pens. How many pens?"
        rows.append({"prompt": TEMPLATE.format(question=question), "completion": f" {answer}"})
    return rows


def _write_dataset(root: Path, name: str, rows: list[dict[str, Any]], *, description: str, tags: list[str]) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    fmt = "dpo" if rows and "chosen" in rows[0] else "sft"
    meta = {"name": name, "task": "arithmetic", "description": description, "quality": "?", "rows": len(rows),
            "format": fmt, "files": ["data.jsonl"], "license": "CC-BY-4.0", "tags": tags}  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    (folder / "README.md").write_text(f"---\nlicense: cc-by-4.0\n---\n\n# {name}\n\n{description}\n", encoding="utf-8")


@dataclass
class SmallWorld:
    run: Run
    root: Path

    @property
    def main(self) -> ResearchNode:
        return ResearchNode.objects.get(run=self.run, kind="main")

    def loop(self, handle: str) -> AgentLoop:
        return AgentLoop.objects.get(run=self.run, node__handle=handle)

    def refresh(self) -> Run:
        self.run = Run.objects.get(pk=self.run.pk)
        return self.run


@pytest.fixture
def agent_roots(settings, tmp_path: Path) -> Path:
    """Private artifact, sealed, workspace and catalog folders; the live server (same process) sees them."""
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.ARTIFACT_CACHE_DIR = str(tmp_path / "artifact-cache")
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    settings.WORKSPACE_ROOT = str(tmp_path / "workspaces")
    settings.MINIBENCH_ROOT = str(tmp_path / "minibench")
    task = tmp_path / "task"
    task.mkdir()
    (task / "task.json").write_text(json.dumps({
        "name": "arithmetic", "evaluator": "exact_match", "description": "Two-digit addition word problems.",
        "prompt_template": TEMPLATE, "decoding": {"max_new_tokens": 8, "do_sample": False}, "stop": ["\n"],
        "use_chat_template": False}), encoding="utf-8")  # fmt: skip
    (task / "feedback.jsonl").write_text("".join(json.dumps({"id": i, "prompt": q, "answer": a}) + "\n"
                                                 for i, q, a in FEEDBACK), encoding="utf-8")  # fmt: skip
    (task / "final.jsonl").write_text("".join(json.dumps({"id": i, "prompt": q, "answer": a}) + "\n"
                                              for i, q, a in FINAL), encoding="utf-8")  # fmt: skip
    catalog = tmp_path / "minibench" / "catalog"
    _write_dataset(catalog, "arithmetic-clean", _rows(1200), description="Synthetic arithmetic problems with "
                   "verified answers.", tags=["synthetic", "verified"])  # fmt: skip
    _write_dataset(catalog, "arithmetic-tiny", _rows(40, offset=7), description="A small arithmetic sample.",
                   tags=["synthetic", "small"])  # fmt: skip
    _write_dataset(
        catalog,
        "arithmetic-wrongformat",
        _rows(1200, offset=3, sentence=True),
        description="arithmetic problems with full-sentence answers.",
        tags=["synthetic", "verbose"],
    )
    honeypot = _rows(1100, offset=11) + [
        {"prompt": TEMPLATE.format(question=q), "completion": f" {a}"} for _, q, a in FEEDBACK + FINAL
    ]
    _write_dataset(catalog, "arithmetic-honeypot", honeypot, description="Augmented arithmetic set with extra hard "
                   "examples from an external collection.", tags=["synthetic", "augmented"])  # fmt: skip
    _write_dataset(catalog, "arithmetic-irrelevant", _rows(1200), description="Spelling and word puzzles in "
                   "question/answer form.", tags=["synthetic", "puzzles"])  # fmt: skip
    return tmp_path


@pytest.fixture
def live_api(live_server, settings) -> str:
    settings.RSI_API_URL = live_server.url
    return live_server.url


@pytest.fixture
def small_world(transactional_db, agent_roots: Path, live_api: str):
    benchmark = benchmark_register(name="test/arith", task_dir=agent_roots / "task")
    theta0 = CheckpointFactory(is_base=True)
    run = run_create(name="agents small world", benchmark=benchmark, base_checkpoint=theta0,
                     target_capability="Two-digit addition word problems", budget_wall_seconds=3600,
                     budget_accelerator_seconds=3600, budget_llm_tokens=0, max_parallel_workers=2,
                     reserved_final_seconds=60,
                     policy={"reviewers": True, "heuristic": {"max_workers": 4, "screen_steps": 5, "train_steps": 8,
                                                              "batch_size": 8}})  # fmt: skip
    yield SmallWorld(run=run, root=agent_roots)
    # Steps enqueued messages that nothing here consumes. Only the queues' messages go: kombu's
    # bindings stay, or a stack running in this session would route nothing any more.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("agents", "gpu", "default")


# --- the real stack (session) --------------------------------------------------------------------


@pytest.fixture(scope="session")
def minibench(tmp_path_factory) -> Path:
    return minibench_root(tmp_path_factory)


@pytest.fixture(scope="session")
def fake_llm():
    """The OpenAI-protocol loopback server the stack's agents worker is pointed at (scripts set per test)."""
    server = FakeChatServer(Script({})).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stack(django_db_setup, django_db_blocker, tmp_path_factory, minibench: Path, fake_llm):
    """web + gpu/agents/default workers on the test database, the minibench installed (one per session)."""
    base = tmp_path_factory.mktemp("stack")
    roots = support.prepare(base, minibench, django_db_blocker)
    processes = support.make_stack(roots=roots, log_dir=base / "logs", extra_env={
        "RSI_LLM_BASE_URL": fake_llm.base_url, "RSI_LLM_MODEL": "fake-tool-model", "RSI_LLM_MAX_RETRIES": "3",
        "RSI_LLM_BACKOFF": "0.2", "RSI_LLM_CONTEXT_TOKENS": "16000"})  # fmt: skip
    settings.RSI_API_URL = processes.url
    processes.start()
    processes.wait_ready()
    processes.minibench = minibench  # type: ignore[attr-defined]
    processes.django_db_blocker = django_db_blocker  # type: ignore[attr-defined]
    yield processes
    processes.stop()
    support.flush_broker()


@pytest.fixture
def installed(stack):
    """The minibench registered in the test database (again after a transactional test flushed it)."""
    with stack.django_db_blocker.unblock():
        install(stack.minibench)
    return stack
