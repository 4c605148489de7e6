"""Transcript storage per turn: what a recorded model turn costs in the database (issue 17).

    REDIS_URL=redis://127.0.0.1:6379/6 timeout 600 .venv/bin/python bench/transcript_storage.py [--turns 60]

A fresh database ``rsiweb_bench_transcripts``; one run and one Worker. An LLM-style conversation of
``--turns`` turns is recorded through ``apps.research.transcripts.turn_record``, as the agent loop
does: each request is the whole conversation so far (system prompt, task, every earlier tool call
and answer) with the Worker role's real tool definitions; each turn adds one assistant tool call
and one tool answer of ``--answer-chars`` characters. Reported per turn: the blob payload written
(canonical JSON bytes of the new blobs), the on-disk growth of the two transcript tables and their
indexes plus the turns' events (PostgreSQL relation sizes, after VACUUM), and what storing every
request whole would have written instead (the sum of each full request's canonical JSON).
"""

from __future__ import annotations

import argparse
import json

from _setup import django_on_bench_db


def relation_bytes(tables: list[str]) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%s::text[]) AS t", [tables])
        return int(cursor.fetchone()[0] or 0)


def vacuum(tables: list[str]) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"VACUUM {table}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--answer-chars", type=int, default=1500)
    args = parser.parse_args()
    django_on_bench_db("rsiweb_bench_transcripts")

    from apps.core.hashing import canonical_json
    from apps.expos.registry import tools_for_role
    from apps.research.models import TranscriptBlob
    from apps.research.services import worker_add
    from apps.research.transcripts import turn_record
    from tests.factories import make_run

    run = make_run(name="bench transcripts")
    worker = worker_add(run=run, task="Screen the catalog and train.", predecessors=[])
    tools = [t.definition() for t in tools_for_role("worker")]
    messages = [
        {"role": "system", "content": "You are worker_0001, a Worker of an autonomous post-training run. " * 40},
        {"role": "user", "content": "Your task:\nScreen the catalog and train."},
    ]
    tables = ["research_transcriptturn", "research_transcriptblob", "experiments_event"]
    vacuum(tables)
    before_disk = relation_bytes(tables)
    naive = 0
    for turn in range(args.turns):
        call_id = f"call_{turn}"
        response = {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function",
                    "function": {"name": "job_status", "arguments": json.dumps({"job": f"job-{turn}"})}}]}  # fmt: skip
        answer = {
            "role": "tool",
            "tool_call_id": call_id,
            "content": json.dumps({"turn": turn, "log": ("step loss 0.4321 " * 200)[: args.answer_chars]}),
        }
        turn_record(run=run, node=worker, source="llm", step=turn, index=0, messages=messages, tools=tools,
                    response=response, tool_messages=[answer], calls=[], model="bench", prompt_tokens=1000,
                    completion_tokens=20, latency_ms=100)  # fmt: skip
        naive += len(canonical_json({"messages": messages, "tools": tools}).encode()) + len(
            canonical_json(response).encode()) + len(canonical_json([answer]).encode())  # fmt: skip
        messages = [*messages, response, answer]
    vacuum(tables)
    disk = relation_bytes(tables) - before_disk
    payload = sum(TranscriptBlob.objects.values_list("size", flat=True))
    n = args.turns
    print(f"turns {n}, tool answer {args.answer_chars} chars, {len(tools)} Worker tools "
          f"({len(canonical_json(tools))} bytes of definitions)")  # fmt: skip
    print("| measure | total bytes | bytes per turn |")
    print("|---|---:|---:|")
    print(f"| blob payload (content-addressed) | {payload} | {payload // n} |")
    print(f"| on disk: turns + blobs + events, with indexes | {disk} | {disk // n} |")
    print(f"| every request stored whole (not done) | {naive} | {naive // n} |")


if __name__ == "__main__":
    main()
