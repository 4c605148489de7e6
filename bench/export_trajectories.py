"""Trajectory export throughput (issue 18): recorded turns exported per second, and its queries.

    REDIS_URL=redis://127.0.0.1:6379/6 timeout 900 .venv/bin/python bench/export_trajectories.py \
        [--workers 8] [--turns 250] [--segment-every 50]

A fresh database ``rsiweb_bench_export``; a benchmark registered from 8 + 200 sealed items; one
stopped run whose ``--workers`` Workers each recorded ``--turns`` LLM-style turns through
``apps.research.transcripts.turn_record`` (each request the whole segment so far with the Worker
role's real tool definitions, one tool call and a 1,500-character answer per turn, a compaction
every ``--segment-every`` turns), plus a Reviewer of 20 turns (exported screened, since issue 31; the figures in
docs/benchmarks.md predate that and left it out). Then
``apps.dojo.export.trajectory_export`` (filters none: the run is not finished, and the filters
are timed by their own tests) is timed whole, with its SQL queries counted, and its two parts
separately: building the conversations, and the contamination scan of the rows (cache cleared).
The same is repeated on the first half of the Workers, so a count or a time that grows faster
than the turns shows.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _setup import django_on_bench_db


def _word(i: int) -> str:
    letters = "bcdfghjklmnpqrstvwxz"
    return "".join(letters[(i // 20**k) % 20] for k in range(3)) + "ov"


def sealed_items(split: str, n: int) -> list[dict[str, str]]:
    # Words only: the synthetic logs are full of numbers, and items told apart by a number alone
    # would be matched by the salient rule (apps.integrity.contamination) in honest rows.
    return [{"id": f"{split}-{i:04d}", "prompt": f"Sealed question {split}: what follows {_word(i)}?",
             "answer": f"answer {_word(i)} {split}"} for i in range(n)]  # fmt: skip


def record(run, node, *, turns: int, segment_every: int, tools, answer_chars: int = 1500) -> None:
    from apps.research.transcripts import turn_record

    system = {"role": "system", "content": f"You are {node.handle}, a Worker of an autonomous post-training run."}
    messages: list[dict] = []
    for turn in range(turns):
        segment = turn // segment_every
        if turn % segment_every == 0:
            summary = f"Summary of segments before {segment}: tried SFT at lr 1e-4, loss 0.43." if segment else ""
            messages = [system, {"role": "user", "content": summary or f"Your task:\n{node.task}"}]
        call_id = f"call_{turn}"
        arguments = json.dumps({"job": f"job-{node.handle}-{turn}"})
        call = {"id": call_id, "type": "function", "function": {"name": "job_status", "arguments": arguments}}
        response = {"role": "assistant", "content": f"Checking job {turn}.", "tool_calls": [call]}
        log = (f"step {turn} loss 0.4321 " * 200)[:answer_chars]
        answer = {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"turn": turn, "log": log})}
        turn_record(run=run, node=node, source="llm", step=turn, index=0, messages=messages, tools=tools,
                    response=response, tool_messages=[answer], calls=[], segment=segment,
                    summary=messages[1]["content"] if segment else "", model="bench", prompt_tokens=1000,
                    completion_tokens=20)  # fmt: skip
        messages = [*messages, response, answer]


def timed_export(runs, name: str, definitions) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.dojo import export
    from apps.integrity import overlap

    overlap._OVERLAPS.clear()
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        result = export.trajectory_export(runs=runs, name=name, filters="none", tool_definitions=definitions)
        total = time.perf_counter() - started
    # The parts, again: conversations only, then the scan of the same rows with the cache cleared.
    counts = dict.fromkeys(export.COUNTS, 0)
    started = time.perf_counter()
    rows = []
    for run in runs:
        rows += export._examples(run, verdicts=[], passed=True, tool_definitions=definitions, tools_text={},
                                 counts=counts)  # fmt: skip
    build = time.perf_counter() - started
    overlap._OVERLAPS.clear()
    started = time.perf_counter()
    export._scanner({f"{r.benchmark.name}@{r.benchmark.version}": r.benchmark for r in runs})(rows, result.entry.sha256)
    scan = time.perf_counter() - started
    return {"turns": result.report["turns"], "examples": result.report["examples"], "seconds": total,
            "queries": len(queries), "build_seconds": build, "scan_seconds": scan,
            "bytes": result.entry.size_bytes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--turns", type=int, default=250)
    parser.add_argument("--segment-every", type=int, default=50)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="rsi-bench-export-"))
    os.environ["RSI_ARTIFACT_ROOT"] = str(scratch / "artifacts")
    os.environ["RSI_SEALED_ROOT"] = str(scratch / "sealed")
    django_on_bench_db("rsiweb_bench_export")

    from apps.benchmarks.services import benchmark_register
    from apps.expos.api.dojo import tool_definitions
    from apps.research.choices import NodeKind, RunStatus
    from apps.research.services import node_create, run_set_status
    from tests.apps.benchmarks.minibench_fixture import TASK_JSON, write_jsonl
    from tests.factories import CheckpointFactory, make_run

    task = scratch / "task"
    task.mkdir(parents=True)
    (task / "task.json").write_text(json.dumps(TASK_JSON), encoding="utf-8")
    write_jsonl(task / "feedback.jsonl", sealed_items("feedback", 8))
    write_jsonl(task / "final.jsonl", sealed_items("final", 200))
    benchmark = benchmark_register(name="bench/export", task_dir=task,
                                   reference_checkpoint=CheckpointFactory(is_reference=True))  # fmt: skip
    tools = tool_definitions("worker")
    runs = []
    started = time.perf_counter()
    for half in ("first", "second"):
        run = make_run(name=f"bench export {half}", benchmark=benchmark)
        run_set_status(run=run, status=RunStatus.RUNNING, actor="bench")
        for i in range(args.workers // 2):
            worker = node_create(run=run, kind=NodeKind.WORKER, task=f"SFT variant {half} {i}")
            record(run, worker, turns=args.turns, segment_every=args.segment_every, tools=tools)
        reviewer = node_create(run=run, kind=NodeKind.REVIEWER, task="check the workers")
        record(run, reviewer, turns=20, segment_every=20, tools=tool_definitions("reviewer"))
        runs.append(run_set_status(run=run, status=RunStatus.STOPPED, actor="bench"))
    written = time.perf_counter() - started
    print(f"recorded {args.workers * args.turns + 40} turns in {written:.1f} s")
    # Cold start (the embedding model and the sealed items' index load once per process), apart.
    from apps.dojo.export import _scanner

    started = time.perf_counter()
    bench = runs[0].benchmark
    key = f"{bench.name}@{bench.version}"
    warm = {"messages": [{"role": "user", "content": "warm up", "train": False}], "tools": "[]",
            "metadata": {"benchmark": key}}  # fmt: skip
    _scanner({key: bench})([warm], "0" * 64)
    print(f"contamination scanner cold start {time.perf_counter() - started:.1f} s (not in the figures below)")
    results = [("half", timed_export(runs[:1], "bench half", tool_definitions)),
               ("all", timed_export(runs, "bench all", tool_definitions))]  # fmt: skip
    print("| workers' turns | rows | bytes | seconds | turns/s | queries | build s | scan s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for _, r in results:
        rate = r["turns"] / r["seconds"]
        print(f"| {r['turns']:,} | {r['examples']} | {r['bytes']:,} | {r['seconds']:.2f} | {rate:,.0f} | "
              f"{r['queries']} | {r['build_seconds']:.2f} | {r['scan_seconds']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
