"""State changes of the Experiment OS itself: tokens (apps.expos.auth) and the record of tool calls."""

from __future__ import annotations

from typing import Any, Required, TypedDict, Unpack

from apps.core.hashing import canonical_json, sha256_text
from apps.core.jsonsafe import escape_text, storable
from apps.experiments.events import PendingEvent, event_prepare, pending_event_write
from apps.experiments.models import Event
from apps.expos.auth import agent_token_issue, agent_token_revoke
from apps.expos.registry import ToolContext
from apps.research.choices import AgentMode
from apps.research.models import AgentLoop, TranscriptTurn
from apps.research.transcripts import turn_record

__all__ = ["agent_token_issue", "agent_token_revoke", "harness_turn_record", "tool_call_event", "tool_call_record"]

# Stored arguments are evidence, not a data store: a huge body is kept as a digest beyond this.
MAX_RECORDED_ARGUMENT_CHARS = 20_000
MAX_RECORDED_KEY_CHARS = 1_000


class ToolCallFields(TypedDict, total=False):
    """What a ``tool.called`` event records, as ``tool_call_event`` and ``tool_call_record`` take it."""

    ctx: Required[ToolContext]
    tool: Required[str]
    arguments: Required[dict[str, Any] | None]
    status: Required[int]
    error: str
    result_ref: str
    replayed: bool
    idempotency_key: str | None
    error_path: str


def tool_call_record(**fields: Unpack[ToolCallFields]) -> Event:
    """Append one ``tool.called`` event (secrets are redacted by event_append).

    Called inside the handler's transaction for a success (the record commits with the change)
    and in a fresh transaction after a refusal (so the refusal survives the rollback). It records
    and nothing else: what a tool's refusal sets off is that tool's own ``after_refusal``.
    """
    return pending_event_write(tool_call_event(**fields))


def tool_call_event(**fields: Unpack[ToolCallFields]) -> PendingEvent:
    """The ``tool.called`` event of a call, unwritten: for ``tool_call_record``, or for a handler
    that writes it in the same statement as its change (``ToolContext.success_event``)."""
    # A call that got this far with status < 400 had its arguments checked (apps.expos.views:
    # no lone surrogates, NUL characters, infinities or deep nesting); only a refusal's may need
    # making storable, and then it is escaped, never dropped: the refused call stays on record.
    ctx, arguments, status = fields["ctx"], fields["arguments"], fields["status"]
    recorded: Any = {} if arguments is None else storable(arguments) if status >= 400 else arguments
    text = canonical_json(recorded)
    if len(text) > MAX_RECORDED_ARGUMENT_CHARS:
        recorded = {"truncated": True, "sha256": sha256_text(text), "chars": len(text)}
    body: dict[str, Any] = {"args": recorded, "status": status}
    # Where a refused value sat (error_path, a JSONPath) is for reviewers; the rest only when set.
    for name in ("error", "error_path", "replayed"):
        if fields.get(name):
            body[name] = fields[name]
    key = fields.get("idempotency_key")
    if key:
        # A refused key is what was sent, escaped and cut to a bound (a valid one is at most 200 characters).
        body["idempotency_key"] = escape_text(key)[:MAX_RECORDED_KEY_CHARS]
    return event_prepare(
        run=ctx.run,
        type="tool.called",
        actor=ctx.actor,
        role=ctx.role,
        tool=fields["tool"][:100],
        arguments=body,
        result_ref=fields.get("result_ref", "")[:200],
    )


def harness_turn_record(
    *, ctx: ToolContext, tool: str, arguments: Any, status: int, answer: Any, replayed: bool = False
) -> None:
    """For a node an external harness plays: the tool-call side of its turn, as the server saw it.

    Only runs in external mode record here, and only for nodes no agent loop of ours steps (our
    loops record their own turns, model requests included; the Main node of an external run has a
    loop row of policy ``external`` that only numbers the supervisor's ticks, so its harness calls
    are recorded here too). The call becomes an assistant message with one tool call and a tool
    message with the answer the harness got (refusals included). An idempotent replay is a turn too,
    marked ``"replayed": true`` in its call record (its answer says so as well).
    """
    if ctx.run.agent_mode != AgentMode.EXTERNAL:
        return
    if AgentLoop.objects.filter(node=ctx.node).exclude(policy=AgentMode.EXTERNAL).exists():
        return
    args = arguments if isinstance(arguments, dict) else {}
    seq = TranscriptTurn.objects.filter(node=ctx.node).count() + 1
    call_id = f"call_harness_{seq}"
    body = answer if 200 <= status < 300 else {"status": status, **(answer if isinstance(answer, dict) else {})}
    call: dict[str, Any] = {
        "name": tool,
        "arguments": storable(args),
        "result": {"status": status, "data": storable(body)},
    }
    if replayed:
        call["replayed"] = True
    turn_record(
        run=ctx.run, node=ctx.node, source="harness", step=0, index=seq, messages=[], tools=[],
        response={"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function", "function": {
            "name": tool, "arguments": canonical_json(storable(args))}}]},
        tool_messages=[{"role": "tool", "tool_call_id": call_id, "content": canonical_json(storable(body))}],
        calls=[call], model="harness", finish_reason="tool_calls",
    )  # fmt: skip
