"""Transcript storage (apps.research.transcripts): content-addressed, append-only, chained, idempotent."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from apps.experiments.events import chain_key, chain_verify
from apps.experiments.models import Event
from apps.research.models import TranscriptBlob, TranscriptTurn
from apps.research.services import worker_add
from apps.research.transcripts import blob_put, node_turns, segment_conversations, turn_record

pytestmark = pytest.mark.django_db

SYSTEM = {"role": "system", "content": "You are worker_0001."}
TASK = {"role": "user", "content": "Your task: screen the catalog."}
TOOLS = [{"type": "function", "function": {"name": "public_check_quota", "description": "Budget left.",
                                            "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip


def _call(call_id: str) -> dict:
    function = {"name": "public_check_quota", "arguments": "{}"}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _answer(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _record(run, node, step, messages, response, answers, **extra):
    return turn_record(run=run, node=node, source="llm", step=step, index=0, messages=messages, tools=TOOLS,
                       response=response, tool_messages=answers, calls=[], model="m", **extra)  # fmt: skip


@pytest.fixture
def worker(run):
    return worker_add(run=run, task="screen the catalog", predecessors=[])


def test_a_conversation_stores_each_message_once_and_each_turn_is_a_chained_event(worker):
    run = worker.run
    first = _record(
        run,
        worker,
        0,
        [SYSTEM, TASK],
        _call("a"),
        [_answer("a", '{"left": 10}')],
        prompt_tokens=40,
        completion_tokens=5,
        latency_ms=12,
        attempts=2,
        finish_reason="tool_calls",
    )
    blobs_after_first = TranscriptBlob.objects.count()
    second = _record(
        run,
        worker,
        1,
        [SYSTEM, TASK, _call("a"), _answer("a", '{"left": 10}')],
        _call("b"),
        [_answer("b", '{"left": 9}')],
    )
    # The second request repeats four messages: only what is new is stored (its request list, the
    # new response and answer; the tool list and the repeated messages are the same blobs).
    assert TranscriptBlob.objects.count() - blobs_after_first == 4
    assert (first.seq, second.seq) == (1, 2)
    turns = node_turns(worker)
    assert turns[0]["request"]["messages"] == [SYSTEM, TASK]
    assert turns[0]["request"]["tools"] == TOOLS
    assert turns[0]["usage"] == {"prompt_tokens": 40, "completion_tokens": 5}
    assert (turns[0]["latency_ms"], turns[0]["attempts"], turns[0]["finish_reason"]) == (12, 2, "tool_calls")
    assert turns[1]["tool_messages"] == [_answer("b", '{"left": 9}')]
    events = list(Event.objects.filter(run=run, type="transcript.turn").order_by("seq"))
    assert [e.arguments["seq"] for e in events] == [1, 2]
    assert events[1].arguments["request"] == second.request
    assert events[1].result_ref == f"transcript_turn:{second.uuid}"
    assert chain_verify(chain_key(run)).ok


def test_a_re_run_step_records_nothing_twice(worker):
    one = _record(worker.run, worker, 3, [SYSTEM, TASK], _call("a"), [])
    again = _record(worker.run, worker, 3, [SYSTEM, TASK], _call("a"), [])
    assert one.pk == again.pk
    assert TranscriptTurn.objects.filter(node=worker).count() == 1
    assert Event.objects.filter(run=worker.run, type="transcript.turn").count() == 1


def test_a_bad_source_is_refused_with_the_allowed_ones(worker):
    with pytest.raises(ValueError, match="llm, heuristic, harness"):
        turn_record(run=worker.run, node=worker, source="shell", step=0, index=0, messages=[], tools=[],
                    response={}, tool_messages=[], calls=[])  # fmt: skip
    assert not TranscriptTurn.objects.exists()


@pytest.mark.parametrize("statement", [
    "UPDATE research_transcriptturn SET summary = 'rewritten'",
    "DELETE FROM research_transcriptturn",
    "UPDATE research_transcriptblob SET value = '{}'",
    "DELETE FROM research_transcriptblob",
])  # fmt: skip
def test_the_database_refuses_to_rewrite_or_remove_a_transcript(worker, statement):
    _record(worker.run, worker, 0, [SYSTEM, TASK], _call("a"), [])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement)
    assert TranscriptTurn.objects.get(node=worker).summary == ""


def test_segments_split_at_compaction_and_the_summary_is_kept_as_a_summary(worker):
    run = worker.run
    _record(run, worker, 0, [SYSTEM, TASK], _call("a"), [_answer("a", "10")])
    summary = "Summary of earlier turns (older messages were removed to fit the context window):\n- called x"
    compacted = [SYSTEM, TASK, {"role": "user", "content": summary}]
    _record(run, worker, 1, compacted, _call("b"), [_answer("b", "9")], segment=1, summary=summary)
    conversations = segment_conversations(worker)
    assert [c["segment"] for c in conversations] == [0, 1]
    assert conversations[0]["messages"] == [SYSTEM, TASK, _call("a"), _answer("a", "10")]
    assert conversations[1]["messages"] == [*compacted, _call("b"), _answer("b", "9")]
    assert conversations[1]["tools"] == TOOLS
    assert node_turns(worker)[1]["summary"] == summary
    assert blob_put({"b": 1, "a": 2}) == blob_put({"a": 2, "b": 1})  # canonical: key order does not matter
