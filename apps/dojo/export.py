"""Trajectory export (RSI-Dojo): recorded transcripts -> a TRL dataset in the datapool, trainable as it is.

One row per trained assistant message of each compaction segment of every node (Main Agent, Workers,
Reviewers), in
TRL's conversational prompt-completion form (SFTTrainer at its defaults computes the loss on the
completion only: ``completion_only_loss`` is on for such rows):

    {"prompt": [{"role": "system"|"user"|"assistant"|"tool", "content": str,
                 "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": JSON text}}],
                 "tool_call_id": str}],            # tool_calls: assistant; tool_call_id: tool
     "completion": [{"role": "assistant", "content": str, "tool_calls": [...]}],   # the trained message
     "tools": JSON text of the definitions (the registry's schemas, OpenAI form) of the tools the
              segment calls, not the role's whole registry (it alone filled TRL's default 1,024 tokens),
     "metadata": {run, node, role, segment, segment_index, task, benchmark, base_model, outcome,
                  filters, passed_filters, source_turns, message_turns, tools_offered,
                  trained_messages, completion_message, tokens}}

An assistant message is trained (a row's completion) only when a recorded turn produced it and
every tool call it made was answered without a refusal (a 4xx/5xx status, or the policy's
unknown/malformed-call error); everything else is context in the prompts of later rows, never
learned. ``tools`` is JSON text because the tool schemas differ in shape and one Arrow column must
have one type (TRL's SFTTrainer and agent_sft parse it). A segment without a trained message is
left out. ``metadata.tokens`` is the row's token count ({prompt, completion, total}) under the
tokenizer and chat template the operator names (apps.ml.chat_render), null when none was named.

A Reviewer reads sealed-adjacent evidence no other role may see (the prompts of sealed items its
scope's data matched, contamination spans, sealed sample ids, model outputs on the feedback split),
so its messages leave the run at the Main Agent's visibility: every message (content, tool-call
arguments, tool answers, JSON read as JSON) passes the screen the Main Agent's view of Reviewer
reports passes (apps.flows.reports.run_evidence_screen: sealed items of both splits, the run's model
outputs, sealed sample ids in any disguise), and what it withholds becomes ``[sealed]`` and is
counted; the scan below still reads everything, so what the screen misses refuses the export.
Trajectories are judged by the
filters (apps.dojo.filters) first; the report counts what each removed and what survives
behaviour-only, outcome-only and both. Before the dataset is registered its messages, tool
definitions are scanned against the sealed items of each run's own benchmark (the only ones its
agents could have seen) with the overlap function the submission review uses
(apps.integrity.overlap.rows_overlap), one message at a time and without identifiers, timestamps
or numeric field values (:func:`scan_units`); any match, or a required layer that could not run,
refuses the export naming each message, its turn and the items, and nothing is registered.

The tool registry lives in the interface layer (apps.expos), which domain apps may not import: the
caller passes ``tool_definitions(role)``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import checkpoint_local_dir
from apps.core.errors import ApplicationError, Conflict, NotFound
from apps.core.hashing import canonical_json, sha256_file, sha256_text
from apps.datapool.models import DataEntry
from apps.datapool.services import data_register_export
from apps.dojo.filters import BEHAVIOUR, DETECTORS, OUTCOME, Detector, Trajectory, trajectory_filter_report
from apps.experiments.models import Checkpoint
from apps.flows.reports import run_evidence_screen
from apps.integrity.overlap import rows_overlap
from apps.ml.chat_render import ChatTemplateError, ChatTokenizer, load_chat_tokenizer
from apps.research.choices import RUN_TERMINAL_STATES, NodeKind, RunStatus
from apps.research.models import Run, TranscriptBlob, TranscriptTurn
from apps.reviews.selectors import SEALED_MARK

EXPORTER_VERSION = 1
_BLOB_CHUNK = 2000
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_STATUS_PREFIX = re.compile(r'^\s*\{\s*"status"\s*:\s*(\d{3})')
FILTER_GROUPS = {"all", "none", BEHAVIOUR, OUTCOME}
# What the report counts while conversations are built.
COUNTS = ("nodes", "turns", "segments", "segments_without_trained_turn", "segments_unexportable",
          "assistant_messages_refused", "masked_assistant_messages", "trained_messages_without_context",
          "reviewer_nodes", "reviewer_turns", "reviewer_values_withheld")  # fmt: skip


@dataclass(frozen=True)
class ExportResult:
    entry: DataEntry
    report: dict[str, Any]


def resolve_filters(spec: str | Sequence[str] | None) -> tuple[Detector, ...]:
    """The detectors to apply: ``all`` (default), ``none``, ``behaviour``, ``outcome`` or detector names.

    Names may carry their version (``outcome_beats_base@1``); a comma-separated string works too.
    """
    if spec is None:
        return DETECTORS
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    items = [s for s in items if s]
    if not items:
        raise ApplicationError("unknown_filter", "Name at least one filter, or 'none' to apply none.")
    by_name = {d.name: d for d in DETECTORS} | {f"{d.name}@{d.version}": d for d in DETECTORS}
    chosen: list[Detector] = []
    for item in items:
        if item == "all":
            found = list(DETECTORS)
        elif item == "none":
            found = []
        elif item in (BEHAVIOUR, OUTCOME):
            found = [d for d in DETECTORS if d.kind == item]
        elif item in by_name:
            found = [by_name[item]]
        else:
            names = ", ".join(sorted(FILTER_GROUPS) + [f"{d.name}@{d.version}" for d in DETECTORS])
            raise ApplicationError("unknown_filter", f"No trajectory filter {item!r}; choose from {names}.")
        chosen += [d for d in found if d not in chosen]
    return tuple(chosen)


def finished_runs() -> list[Run]:
    """Every finished run (ended with its final evaluation), oldest first."""
    return list(Run.objects.filter(status=RunStatus.FINISHED).order_by("created_at", "pk"))


def _check_runs(runs: Sequence[Run]) -> list[Run]:
    if not runs:
        raise ApplicationError("no_runs", "Name at least one run to export (or every finished run).")
    unique = list({run.pk: run for run in runs}.values())
    active = [r for r in unique if r.status not in RUN_TERMINAL_STATES]
    if active:
        listed = ", ".join(f"{r.uuid} ({r.status})" for r in active)
        raise ApplicationError(
            "run_not_ended",
            f"Runs still in progress cannot be exported (their transcripts still grow): {listed}. "
            "Export them once they have finished, stopped or failed.",
        )
    return unique


# --------------------------------------------------------------------------- reading transcripts


def _blobs(shas: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ordered = sorted(shas)
    for i in range(0, len(ordered), _BLOB_CHUNK):
        chunk = ordered[i : i + _BLOB_CHUNK]
        out.update(TranscriptBlob.objects.filter(sha256__in=chunk).values_list("sha256", "value"))
    return out


def _needed(turns: list[TranscriptTurn]) -> set[int]:
    """The turns whose request and answers make up the exported conversations (by pk).

    An LLM turn's request repeats the whole conversation so far, so a segment's conversation is its
    last LLM turn's request plus that turn's answers: the earlier requests are never read (reading
    them all would be quadratic in the segment's length). Heuristic and harness turns are
    concatenated, so each of them is needed.
    """
    needed: set[int] = set()
    for i, turn in enumerate(turns):
        following = turns[i + 1] if i + 1 < len(turns) else None
        last_llm = following is None or following.node_id != turn.node_id or following.segment != turn.segment or (
            following.source != "llm"
        )  # fmt: skip
        if turn.source != "llm" or last_llm:
            needed.add(turn.pk)
    return needed


def _run_turns(run: Run) -> tuple[list[TranscriptTurn], set[int], dict[str, Any]]:
    """The run's turns in node and seq order, the ones needed, and their blobs (a few queries)."""
    turns = list(TranscriptTurn.objects.filter(run=run).select_related("node").order_by("node_id", "seq"))
    needed = _needed(turns)
    # Every turn's tool answers: they name the turn that produced an answer a later request repeats.
    top = _blobs({sha for t in turns if t.pk in needed for sha in (t.request, t.response)} | {
        t.tool_messages for t in turns})  # fmt: skip
    inner: set[str] = set()
    for turn in turns:
        if turn.pk in needed:
            inner.update((top.get(turn.request) or {}).get("messages") or [])
    return turns, needed, top | _blobs(inner - set(top))


def _answer_refused(content: Any) -> bool:
    """A tool answer that refused the call: a 4xx/5xx status, or the policy's own call error."""
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    try:
        value = json.loads(text)
    except ValueError:
        match = _STATUS_PREFIX.match(text)  # an answer cut at the policy's length limit
        return match is not None and int(match.group(1)) >= 400
    if not isinstance(value, dict):
        return False
    status = value.get("status")
    if isinstance(status, int) and not isinstance(status, bool) and status >= 400:
        return True
    error = value.get("error")
    return isinstance(error, dict) and "code" in error


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _tool_call(call: Any, index: int) -> dict[str, Any] | None:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return None
    function = call["function"]
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)
    return {
        "id": str(call.get("id") or f"call_{index}"),
        "type": "function",
        "function": {"name": str(function.get("name", "")), "arguments": arguments},
    }


@dataclass
class _Segment:
    segment: int
    messages: list[tuple[dict[str, Any], TranscriptTurn | None]]
    turns: list[TranscriptTurn]
    summary: str


def _node_segments(turns: list[TranscriptTurn], needed: set[int], blobs: dict[str, Any]) -> list[_Segment]:
    """One conversation per compaction segment (as research.transcripts.segment_conversations builds
    it), each message paired with the turn that produced it, as its response or a tool answer to it
    (None: not produced by a recorded turn). Only a turn's response can be trained."""
    by_response = {turn.response: turn for turn in turns}
    for turn in turns:
        for answer in blobs.get(turn.tool_messages) or []:
            by_response.setdefault(sha256_text(canonical_json(answer)), turn)
    out: list[_Segment] = []
    for turn in turns:
        if not out or out[-1].segment != turn.segment:
            out.append(_Segment(turn.segment, [], [], turn.summary))
        current = out[-1]
        current.turns.append(turn)
        if turn.pk not in needed:
            continue  # an LLM turn that a later request of its segment repeats
        request = blobs.get(turn.request) or {}
        shas = list(request.get("messages") or [])
        response = blobs.get(turn.response)
        answers: list[tuple[dict[str, Any], TranscriptTurn | None]] = [
            (m, turn) for m in (blobs.get(turn.tool_messages) or []) if isinstance(m, dict)
        ]
        produced: list[tuple[dict[str, Any], TranscriptTurn | None]] = (
            [(response, turn)] if isinstance(response, dict) else []
        )
        if turn.source == "llm":
            context = [(blobs.get(sha), by_response.get(sha)) for sha in shas]
            current.messages = [(m, t) for m, t in context if isinstance(m, dict)] + produced + answers
        else:
            if not current.messages:
                current.messages = [(m, None) for m in (blobs.get(sha) for sha in shas) if isinstance(m, dict)]
            current.messages += produced + answers
    return out


def _messages(segment: _Segment) -> tuple[list[dict[str, Any]], int]:
    """The segment's messages in the exported form, with train flags; returns (messages, refused)."""
    raw = segment.messages
    out: list[dict[str, Any]] = []
    refused = 0
    for j, (message, origin) in enumerate(raw):
        role = _ROLES.get(str(message.get("role")))
        if role is None:
            raise ValueError(f"role {message.get('role')!r} has no place in a chat dataset")
        item: dict[str, Any] = {"role": role, "content": _text(message.get("content")), "train": False}
        if role == "assistant":
            calls = [c for c in (_tool_call(c, i) for i, c in enumerate(message.get("tool_calls") or [])) if c]
            if calls:
                item["tool_calls"] = calls
            # The answers are the tool messages right after it (call ids repeat across turns).
            answers: dict[str, list[Any]] = {}
            for reply, _ in itertools.takewhile(lambda pair: pair[0].get("role") == "tool", raw[j + 1 :]):
                answers.setdefault(str(reply.get("tool_call_id")), []).append(reply.get("content"))
            answered = [answers.get(c["id"]) for c in calls]
            bad = any(a is None or any(_answer_refused(x) for x in a) for a in answered)
            refused += bad
            item["train"] = origin is not None and not bad and bool(calls or item["content"].strip())
        elif role == "tool":
            item["tool_call_id"] = str(message.get("tool_call_id") or "")
        out.append(item)
    return out, refused


# --------------------------------------------------------------------------- the export


def _outcome(run: Run, verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    evidence: dict[str, Any] = next((v["evidence"] for v in verdicts if v["detector"] == "outcome_beats_base"), {})
    return {
        "run_status": run.status,
        "final_score": evidence.get("final"),
        "theta0_score": evidence.get("theta0"),
        "gain": evidence.get("difference"),
        "returned_checkpoint": run.result_checkpoint.handle if run.result_checkpoint is not None else None,
    }


def _tool_name(definition: dict[str, Any]) -> str:
    function = definition.get("function")
    return str((function if isinstance(function, dict) else definition).get("name", ""))


def _called_tools(messages: list[dict[str, Any]], definitions: list[dict[str, Any]]) -> str:
    """The JSON text of the definitions of the tools the conversation calls, in the registry's order.

    The role's whole registry (some 33k characters) on every row would fill TRL's default 1,024
    tokens before the conversation starts; a definition the conversation never uses teaches nothing.
    """
    called = {c["function"]["name"] for m in messages for c in m.get("tool_calls", [])}
    kept = [d for d in definitions if _tool_name(d) in called]
    return json.dumps(kept, ensure_ascii=False, sort_keys=True)


def _reviewer_screen(run: Run) -> Callable[[dict[str, Any]], int]:
    """How a Reviewer's exported message is cleaned in place (the Main Agent's view of its evidence);
    returns how many values were withheld. Fails closed: sealed items that cannot be checked refuse
    the export."""
    screen, finder = run_evidence_screen(run)
    if screen is None:
        raise Conflict(
            "contamination_unverifiable",
            f"The sealed items of {run.benchmark.name}@{run.benchmark.version} fail their hashes, so the Reviewer "
            f"transcripts of run {run.uuid} cannot be screened; nothing was registered.",
        )

    def value(item: Any) -> tuple[Any, int]:
        screened, withheld = screen.value(item)
        count = len(withheld)

        def ids(sub: Any) -> Any:
            nonlocal count
            if isinstance(sub, str):
                cleaned = finder.redact(sub, SEALED_MARK)
                count += cleaned != sub
                return cleaned
            if isinstance(sub, dict):
                return {key: ids(x) for key, x in sub.items()}
            if isinstance(sub, list):
                return [ids(x) for x in sub]
            return sub

        return ids(screened), count

    def text(raw: str) -> tuple[str, int]:
        if raw.lstrip()[:1] in ("{", "["):
            try:
                parsed = json.loads(raw)
            except ValueError:
                pass
            else:
                cleaned, count = value(parsed)
                return (json.dumps(cleaned, ensure_ascii=False) if count else raw), count
        cleaned, count = value(raw)
        return str(cleaned), count

    def clean(message: dict[str, Any]) -> int:
        message["content"], withheld = text(message["content"])
        for call in message.get("tool_calls", []):
            call["function"]["arguments"], count = text(call["function"]["arguments"])
            withheld += count
        return withheld

    return clean


def _examples(
    run: Run,
    *,
    verdicts: list[dict[str, Any]],
    passed: bool,
    tool_definitions: Callable[[str], list[dict[str, Any]]],
    tools_text: dict[str, list[dict[str, Any]]],
    counts: dict[str, int],
) -> list[dict[str, Any]]:
    turns, needed, blobs = _run_turns(run)
    counts["turns"] += len(turns)
    filters = [{k: v[k] for k in ("detector", "version", "kind", "passed", "reason")} for v in verdicts]
    base = run.base_checkpoint
    shared: dict[str, Any] = {
        "run": str(run.uuid),
        "run_name": run.name,
        "benchmark": f"{run.benchmark.name}@{run.benchmark.version}",
        "target_capability": run.target_capability,
        "base_model": {"handle": base.handle, "manifest_sha256": base.manifest_sha256},
        "outcome": _outcome(run, verdicts),
        "filters": filters,
        "passed_filters": passed,
    }
    by_node: dict[int, list[TranscriptTurn]] = {}
    for turn in turns:
        by_node.setdefault(turn.node_id, []).append(turn)
    out = []
    reviewer_clean: Callable[[dict[str, Any]], int] | None = None
    for node_turns in by_node.values():
        node = node_turns[0].node
        counts["nodes"] += 1
        if node.kind == NodeKind.REVIEWER:
            counts["reviewer_nodes"] += 1
            counts["reviewer_turns"] += len(node_turns)
            reviewer_clean = reviewer_clean or _reviewer_screen(run)
        if node.kind not in tools_text:
            tools_text[node.kind] = tool_definitions(node.kind)
        for index, segment in enumerate(_node_segments(node_turns, needed, blobs)):
            counts["segments"] += 1
            try:
                messages, refused = _messages(segment)
            except ValueError:
                counts["segments_unexportable"] += 1
                continue
            counts["assistant_messages_refused"] += refused
            withheld = 0
            if node.kind == NodeKind.REVIEWER and reviewer_clean is not None:
                withheld = sum(reviewer_clean(m) for m in messages)
                counts["reviewer_values_withheld"] += withheld
            trained = [j for j, m in enumerate(messages) if m.pop("train")]
            # A message with nothing before it (a harness's first call: the harness's own prompt is
            # not on the record) has no prompt to be learned from: counted, and in no row's completion.
            counts["trained_messages_without_context"] += trained.count(0)
            trained = [j for j in trained if j > 0]
            if not trained:
                counts["segments_without_trained_turn"] += 1
                continue
            counts["masked_assistant_messages"] += sum(
                1 for j, m in enumerate(messages) if m["role"] == "assistant" and j not in trained
            )
            metadata: dict[str, Any] = dict(shared)
            metadata.update({
                "node": node.handle,
                "node_uuid": str(node.uuid),
                "role": node.kind,
                "task": node.task,
                "segment": segment.segment,
                "segment_index": index,
                "compaction_summary": segment.summary,
                "source_turns": [
                    {"seq": t.seq, "source": t.source, "request": t.request, "response": t.response,
                     "tool_messages": t.tool_messages, "calls": t.calls}
                    for t in segment.turns
                ],
                "tools_offered": len(tools_text[node.kind]),
                "trained_messages": trained,
                "sealed_evidence_withheld": withheld,
            })  # fmt: skip
            tools = _called_tools(messages, tools_text[node.kind])
            turns_of = [t.seq if t is not None else None for _, t in segment.messages]
            for j in trained:
                # One row per trained message: TRL's conversational prompt-completion form, whose
                # completion alone carries the loss at SFTTrainer's defaults (completion_only_loss).
                row_meta = {**metadata, "completion_message": j, "message_turns": turns_of[: j + 1]}
                out.append({"prompt": messages[:j], "completion": [messages[j]], "tools": tools, "metadata": row_meta})
    return out


# What is scanned: the text a model would learn from, one unit per message (its content and its
# tool calls) and one per string of each distinct tool table, each read as JSON where it is JSON. A sealed item
# is matched inside one message, operands and answer together; what is not an item's text is left
# out: JSON keys, numbers that are field values (ids, counts, budgets, scores, timestamps as
# numbers) unless the field holds data a row is made of (an answer, a completion), and in strings
# timestamps, uuids, hex digests and handles (exp_0005), which split into digit runs that "held"
# small numeric items. The metadata is identifiers and references, never trained on, and not scanned.
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
_HANDLE = re.compile(r"\b[a-z]+(?:[_-][a-z]+)*[_-]\d{3,}\b")
_DATA_FIELDS = frozenset(("answer", "completion", "output", "response", "target", "label", "solution", "chosen",
                          "rejected", "reference", "expected"))  # fmt: skip


def _scrub(text: str) -> str:
    for pattern in (_TIMESTAMP, _UUID, _HEX, _HANDLE):
        text = pattern.sub(" ; ", text)
    return text


def _leaves(value: Any, field: str | None = None) -> list[str]:
    """The strings of ``value`` a model would read as text, JSON text parsed, identifiers scrubbed."""
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in _leaves(item, str(key).lower())]
    if isinstance(value, list | tuple):
        return [s for item in value for s in _leaves(item, field)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [str(value)] if field in _DATA_FIELDS else []
    text = str(value)
    if text.lstrip()[:1] in ("{", "["):
        try:
            return _leaves(json.loads(text), field)
        except ValueError:
            pass
    return [_scrub(text)]


def row_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's conversation: its prompt then its completion (or the ``messages`` of a whole conversation)."""
    if "messages" in row:
        return list(row["messages"])
    return [*row["prompt"], *row["completion"]]


def scan_units(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[int, int | None]]]:
    """The scanned units of the rows and, for each, (row index, message index; None: the tool table).

    The rows of one segment repeat its messages (each row's prompt is the conversation before its
    completion): a message is one unit however many rows hold it, placed at the first that does.
    """
    units: list[dict[str, Any]] = []
    where: list[tuple[int, int | None]] = []
    tables: set[str] = set()
    seen: set[tuple[Any, ...]] = set()
    for i, row in enumerate(rows):
        meta = row.get("metadata") or {}
        segment = (meta.get("run"), meta.get("node_uuid"), meta.get("segment")) if meta.get("run") else (i,)
        for j, message in enumerate(row_messages(row)):
            if (*segment, j) in seen:
                continue
            seen.add((*segment, j))
            calls = [
                [c["function"]["name"], *_leaves(c["function"]["arguments"])] for c in message.get("tool_calls") or []
            ]
            units.append({"strings": _leaves(message["content"]) + [s for call in calls for s in call]})
            where.append((i, j))
        if row["tools"] not in tables:
            tables.add(row["tools"])
            # A tool table is many short texts of ours (a description per tool and parameter): each
            # is a unit, so words and numbers of unrelated descriptions never add up to an item.
            for text in _leaves(row["tools"]):
                units.append({"strings": [text]})
                where.append((i, None))
    return units, where


def _place(row: dict[str, Any], message: int | None) -> str:
    meta = row["metadata"]
    if message is None:
        return f"run {meta['run']} {meta['node']}: the tool definitions"
    turn = meta["message_turns"][message]
    produced = f"turn {turn}" if turn is not None else "the opening context"
    return f"run {meta['run']} {meta['node']} segment {meta['segment']} message {message} ({produced})"


def _scanner(benchmarks: dict[str, Benchmark]) -> Callable[[list[dict[str, Any]], str], None]:
    """The scan of an export: each row against the sealed items of its own run's benchmark."""

    def scan(rows: list[dict[str, Any]], sha256: str) -> None:
        found: list[str] = []
        items: set[str] = set()
        for run_benchmark, benchmark in benchmarks.items():
            picked = [row for row in rows if row["metadata"]["benchmark"] == run_benchmark]
            if not picked:
                continue
            units, where = scan_units(picked)
            digest = hashlib.sha256(canonical_json([sha256, run_benchmark, units]).encode()).hexdigest()
            label = f"trajectory export {sha256[:12]} ({run_benchmark})"
            try:
                result = rows_overlap(rows=units, sha256=digest, label=label, benchmark=benchmark, policy=None)
            except ApplicationError as exc:
                raise Conflict(
                    "contamination_unverifiable",
                    f"The export could not be checked against {run_benchmark} ({exc.message}); nothing was registered.",
                ) from None
            if result["required_missing"]:
                raise Conflict(
                    "contamination_unverifiable",
                    f"Required contamination layers {result['required_missing']} did not run on the export against "
                    f"{run_benchmark} ({result['layers']}); nothing was registered. Install or repair them and "
                    "export again.",
                )
            by_place: dict[str, set[str]] = {}
            for match in result["matches"]:
                row, message = where[match["row"]]
                by_place.setdefault(_place(picked[row], message), set()).add(match["sample_id"])
            for place, ids in sorted(by_place.items()):
                found.append(f"{place}: {run_benchmark} item(s) {', '.join(sorted(ids))}")
                items |= {f"{run_benchmark} {sample}" for sample in ids}
        if found:
            raise Conflict(
                "contains_sealed_items",
                f"{len(found)} exported message(s) contain sealed items of their run's benchmark ({len(items)} "
                f"item(s)); nothing was registered. {'; '.join(found[:20])}. Leave those runs or nodes out of the "
                "export.",
                places=found,
                items=sorted(items),
            )

    return scan


# TRL's SFTConfig.max_length default: a longer row is cut there (keep_start), its completion with it.
TRL_DEFAULT_MAX_LENGTH = 1024
# What a chat tokenizer is read from (apps.ml.chat_render.load_chat_tokenizer), each checked against the manifest.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def checkpoint_chat_tokenizer(*, handle: str) -> ChatTokenizer:
    """The chat tokenizer of a registered checkpoint, named by its handle (the REST export's ``tokenizer``).

    Never a path: the files are the checkpoint's stored copy, each tokenizer file checked against
    the checkpoint's manifest first (a changed one refuses, 409). 404 for no such checkpoint, 400
    for one without a fast tokenizer and a chat template.
    """
    if not isinstance(handle, str) or not handle.strip():
        raise ApplicationError("invalid_tokenizer", "Name the tokenizer by a registered checkpoint's handle.")
    checkpoint = Checkpoint.objects.filter(handle=handle.strip()).first()
    if checkpoint is None:
        raise NotFound(
            "checkpoint_not_found",
            f"No checkpoint {handle!r}: name the tokenizer by a registered checkpoint's handle (e.g. theta0).",
        )
    folder = checkpoint_local_dir(checkpoint=checkpoint)
    manifest = checkpoint.manifest or {}
    changed = [
        name
        for name in TOKENIZER_FILES
        if (folder / name).is_file() and sha256_file(folder / name) != manifest.get(name)
    ]
    if changed:
        raise Conflict(
            "checkpoint_files_changed",
            f"{checkpoint.handle}'s {', '.join(changed)} differ from its manifest; its tokenizer is not used.",
        )
    try:
        tokenizer = load_chat_tokenizer(folder)
    except ChatTemplateError as exc:
        message = str(exc).replace(str(folder), checkpoint.handle)
        raise ApplicationError("invalid_tokenizer", f"Checkpoint {checkpoint.handle}: {message}.") from None
    return replace(tokenizer, name=checkpoint.handle)


def count_tokens(rows: list[dict[str, Any]], tokenizer: ChatTokenizer) -> dict[str, Any]:
    """Write each row's ``metadata.tokens`` under ``tokenizer`` and return the export's totals.

    ``prompt`` is the prompt rendered with the generation prompt, ``total`` the prompt and the
    completion rendered together (what SFTTrainer tokenizes), ``completion`` the difference. A row
    the template refuses (Llama 3.1: several calls in one message) refuses the export, naming it.
    """
    refused: list[str] = []
    for row in rows:
        tools = json.loads(row["tools"])
        try:
            prompt = tokenizer.count(tokenizer.render(row["prompt"], tools=tools, add_generation_prompt=True))
            total = tokenizer.count(tokenizer.render([*row["prompt"], *row["completion"]], tools=tools))
        except ChatTemplateError as exc:
            refused.append(f"{_place(row, row['metadata']['completion_message'])}: {exc}")
            continue
        row["metadata"]["tokens"] = {"prompt": prompt, "completion": total - prompt, "total": total}
    if refused:
        raise ApplicationError(
            "chat_template_refuses_rows",
            f"The chat template of {tokenizer.name} does not render {len(refused)} row(s) as exported; nothing was "
            f"registered. {'; '.join(refused[:5])}. docs/export.md lists the templates that do.",
            rows=refused,
        )
    totals = [row["metadata"]["tokens"]["total"] for row in rows]
    return {
        **tokenizer.describe(),
        "max": max(totals),
        "total": sum(totals),
        f"rows_over_{TRL_DEFAULT_MAX_LENGTH}": sum(t > TRL_DEFAULT_MAX_LENGTH for t in totals),
    }


def trajectory_export(
    *,
    runs: Sequence[Run],
    name: str,
    tool_definitions: Callable[[str], list[dict[str, Any]]],
    filters: str | Sequence[str] | None = None,
    tokenizer: ChatTokenizer | None = None,
    actor: str = "system",
) -> ExportResult:
    """Export the runs' transcripts that pass ``filters`` as one datapool entry (format chat).

    With ``tokenizer`` each row states its token count rendered with that tokenizer's chat template.
    Raises ApplicationError (400) for bad input, an empty result or a template that refuses a row,
    Conflict (409) when the contamination scan refuses the data; then nothing is registered.
    """
    detectors = resolve_filters(filters)
    runs = _check_runs(runs)
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ApplicationError("invalid_name", "Give the dataset a name of 1-200 characters.")
    report = trajectory_filter_report([Trajectory(run=run) for run in runs])  # every detector, for comparison
    applied = {f"{d.name}@{d.version}" for d in detectors}
    counts = dict.fromkeys(COUNTS, 0)
    rows: list[dict[str, Any]] = []
    selected: list[str] = []
    tools_text: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        verdicts = report["verdicts"][str(run.uuid)]
        passed = all(v["passed"] for v in verdicts if f"{v['detector']}@{v['version']}" in applied)
        if not passed:
            continue
        selected.append(str(run.uuid))
        rows += _examples(run, verdicts=verdicts, passed=passed, tool_definitions=tool_definitions,
                          tools_text=tools_text, counts=counts)  # fmt: skip
    summary: dict[str, Any] = {
        "exporter_version": EXPORTER_VERSION,
        "runs": [str(r.uuid) for r in runs],
        "filters_applied": sorted(applied),
        "trajectories": report["trajectories"],
        "removed_by": report["removed_by"],
        "kept": report["kept"],
        "exported_runs": selected,
        "examples": len(rows),
        **counts,
        "tokens": None,
    }
    if not rows:
        why = "no run passed the filters" if not selected else "the runs that passed have no trainable segment"
        raise ApplicationError(
            "nothing_to_export",
            f"Nothing to export: {why} (filters {sorted(applied) or 'none'}; removed by each: "
            f"{report['removed_by']}). Choose other runs or filters (--filters none exports unfiltered).",
            report=summary,
        )
    for row in rows:
        row["metadata"]["tokens"] = None
    if tokenizer is not None:
        summary["tokens"] = count_tokens(rows, tokenizer)
    readme = (
        f"Agent trajectories exported from {len(selected)} of {len(runs)} run(s): one TRL prompt-completion row "
        f"per trained assistant message ({len(rows)} rows; Main Agent, Workers and Reviewers, the Reviewers' "
        f"sealed-adjacent evidence withheld as {SEALED_MARK}: {summary['reviewer_values_withheld']} value(s)). "
        "Filters applied: "
        f"{sorted(applied) or 'none'}.\nReport: {json.dumps({k: summary[k] for k in ('removed_by', 'kept')})}\n"
        f"Tokens: {json.dumps(summary['tokens']) if tokenizer is not None else 'not counted (no tokenizer named)'}.\n"
        "Training data for an agent model (agent_sft, or TRL's SFTTrainer as it is), not for a run's base model."
    )
    benchmarks = {f"{r.benchmark.name}@{r.benchmark.version}": r.benchmark for r in runs if str(r.uuid) in selected}
    entry = data_register_export(
        rows=rows, name=name.strip(), source=summary, readme=readme, scan=_scanner(benchmarks), actor=actor
    )
    return ExportResult(entry=entry, report=summary)
