"""Transcripts: every model turn of an agent, append-only, in OpenAI chat-message form (issue 17).

A turn is one row (:class:`TranscriptTurn`) whose request, response, tool answers and REST calls are
content-addressed blobs (:class:`TranscriptBlob`), plus one hash-chained ``transcript.turn`` event
naming those hashes, so a turn cannot be rewritten without breaking the run's chain. A request is
stored as the list of its messages' hashes: the messages a conversation repeats in every request
are stored once, and a turn costs about what it adds.

The stored form stays close to the chat-completions API so that exports (TRL conversational
datasets, per compaction segment) need no translation: a segment's conversation is the request of
its last turn, that turn's response and its tool messages (:func:`segment_conversations`).

Who may read a transcript is decided in apps.expos.visibility; this module only writes and reads.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max

from apps.core.hashing import canonical_json, sha256_text
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.jobs.models import Job
from apps.research.models import ResearchNode, Run, TranscriptBlob, TranscriptTurn

SOURCES = ("llm", "heuristic", "harness")


def blob_put(value: Any) -> str:
    """Store ``value`` once under the sha256 of its canonical JSON; returns that hash."""
    text = canonical_json(value)
    sha = sha256_text(text)
    # ignore_conflicts: a blob already stored (by this or a concurrent writer) is the same bytes.
    TranscriptBlob.objects.bulk_create(
        [TranscriptBlob(sha256=sha, value=json.loads(text), size=len(text.encode("utf-8", "surrogatepass")))],
        ignore_conflicts=True,
    )
    return sha


def blobs_get(shas: list[str]) -> dict[str, Any]:
    return dict(TranscriptBlob.objects.filter(sha256__in=set(shas)).values_list("sha256", "value"))


def turn_record(
    *,
    run: Run,
    node: ResearchNode,
    source: str,
    step: int,
    index: int,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    response: dict[str, Any],
    tool_messages: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    inbox: list[dict[str, Any]] | None = None,
    segment: int = 0,
    summary: str = "",
    model: str = "",
    finish_reason: str = "",
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    latency_ms: int = 0,
    attempts: int = 1,
) -> TranscriptTurn:
    """Record one turn (idempotent by node, step and index: a re-run step records nothing new)."""
    if source not in SOURCES:
        raise ValueError(f"a transcript turn's source is one of {', '.join(SOURCES)}, not {source!r}")
    existing = TranscriptTurn.objects.filter(node=node, step=step, index=index, source=source).first()
    if existing is not None and source != "harness":
        return existing
    request = blob_put({"messages": [blob_put(m) for m in messages], "tools": blob_put(tools)})
    hashes = {
        "request": request,
        "response": blob_put(response),
        "tool_messages": blob_put(tool_messages),
        "calls": blob_put(calls),
    }
    try:
        with transaction.atomic():
            # The node row is the lock that numbers its turns (two writers never take one seq).
            ResearchNode.objects.select_for_update().filter(pk=node.pk).first()
            seq = (TranscriptTurn.objects.filter(node=node).aggregate(m=Max("seq"))["m"] or 0) + 1
            turn = TranscriptTurn.objects.create(
                run=run, node=node, seq=seq, step=step, index=seq if source == "harness" else index, source=source,
                segment=segment, summary=summary, inbox=list(inbox or []), model=model[:200],
                finish_reason=finish_reason[:32], prompt_tokens=max(0, prompt_tokens),
                completion_tokens=max(0, completion_tokens), latency_ms=max(0, int(latency_ms)),
                attempts=max(1, attempts), **hashes,
            )  # fmt: skip
            event_append(
                type="transcript.turn", actor=node.handle, role=node.kind, run=run,
                arguments={"seq": seq, "step": step, "source": source, "segment": segment,
                           "compacted": bool(summary), **hashes},
                result_ref=f"transcript_turn:{turn.uuid}",
            )  # fmt: skip
    except IntegrityError:
        # A concurrent re-run of the same step recorded it first.
        turn = TranscriptTurn.objects.get(node=node, step=step, index=index)
    return turn


def tool_message_content(result: dict[str, Any]) -> str:
    """A REST answer (``ToolResult.as_json``) as the tool message the LLM policy writes for it."""
    data = result.get("data") or {}
    status = int(result.get("status", 200))
    content = data if 200 <= status < 300 else {"status": status, **data}
    return json.dumps(content, ensure_ascii=False, default=str)


# --- reading ---------------------------------------------------------------------------------------

_HANDLE = re.compile(r"\b(exp_\d+|experiment_\d+)\b")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def turn_payload(turn: TranscriptTurn, blobs: dict[str, Any]) -> dict[str, Any]:
    """One turn as the API and the page show it: the messages themselves, not their hashes."""
    request = blobs.get(turn.request) or {"messages": [], "tools": ""}
    return {
        "uuid": str(turn.uuid),
        "seq": turn.seq,
        "step": turn.step,
        "source": turn.source,
        "segment": turn.segment,
        "summary": turn.summary,
        "model": turn.model,
        "finish_reason": turn.finish_reason,
        "usage": {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens},
        "latency_ms": turn.latency_ms,
        "attempts": turn.attempts,
        "inbox": turn.inbox,
        "created_at": turn.created_at,
        "request": {"messages": [blobs.get(sha) for sha in request["messages"]], "tools": blobs.get(request["tools"])},
        "response": blobs.get(turn.response),
        "tool_messages": blobs.get(turn.tool_messages) or [],
        "calls": blobs.get(turn.calls) or [],
        "hashes": {
            "request": turn.request,
            "response": turn.response,
            "tool_messages": turn.tool_messages,
            "calls": turn.calls,
        },  # fmt: skip
    }


def node_turns(node: ResearchNode, *, after_seq: int = 0, limit: int = 500) -> list[dict[str, Any]]:
    """A node's turns in order, with their messages (two queries for the blobs, whatever the count)."""
    turns = list(TranscriptTurn.objects.filter(node=node, seq__gt=after_seq).order_by("seq")[:limit])
    top = blobs_get([sha for t in turns for sha in (t.request, t.response, t.tool_messages, t.calls)])
    message_shas = [sha for t in turns for sha in (top.get(t.request) or {}).get("messages", [])]
    tool_shas = [(top.get(t.request) or {}).get("tools", "") for t in turns]
    return [turn_payload(t, top | blobs_get(message_shas + tool_shas)) for t in turns]


def segment_conversations(node: ResearchNode) -> list[dict[str, Any]]:
    """One OpenAI-style conversation per compaction segment: {segment, messages, tools}.

    For an LLM segment it is the last turn's request plus its response and tool answers; a
    heuristic or harness transcript is the concatenation of its turns' messages (their requests
    carry only the opening messages).
    """
    out: list[dict[str, Any]] = []
    for turn in node_turns(node, limit=100_000):
        if not out or out[-1]["segment"] != turn["segment"]:
            out.append({"segment": turn["segment"], "messages": [], "tools": turn["request"]["tools"] or []})
        current = out[-1]
        messages = turn["request"]["messages"]
        if turn["source"] == "llm":
            current["messages"] = [*messages, turn["response"], *turn["tool_messages"]]
        else:
            if not current["messages"]:
                current["messages"] = list(messages)
            current["messages"] += [turn["response"], *turn["tool_messages"]]
    return out


def turn_links(run: Run, turn: dict[str, Any]) -> dict[str, list[str]]:
    """The experiments and jobs a turn's tool answers name (handles and uuids of this run's records)."""
    text = " ".join(str(m.get("content", "")) for m in turn["tool_messages"] if isinstance(m, dict))
    handles = set(_HANDLE.findall(text))
    uuids = set(_UUID.findall(text))
    experiments = set(Experiment.objects.filter(run=run, handle__in=handles).values_list("handle", flat=True))
    experiments |= set(Experiment.objects.filter(run=run, uuid__in=uuids).values_list("handle", flat=True))
    jobs = {str(u) for u in Job.objects.filter(run=run, uuid__in=uuids).values_list("uuid", flat=True)}
    return {"experiments": sorted(experiments), "jobs": sorted(jobs)}
