"""Data management tools (DESIGN.md "ExpOS tools"): the shared datapool as agents see it.

Workers list, inspect and register data and append provenance; Reviewers see the same entries
plus who used them and how they overlap the run's sealed evaluation items. No tool shows a Worker
a sealed item: sample rows that match one (of any benchmark) are withheld from its view, and
overlap details are the Reviewer's alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.models import Count
from django.utils import timezone

from apps.benchmarks.services import SealBroken
from apps.core.errors import ApplicationError
from apps.datapool.models import AGENT_FORMATS, DataEntry, DataUsage, SourceKind
from apps.datapool.selectors import data_entry_get, data_entry_list, data_readme, data_rows
from apps.datapool.services import (
    CATALOG_NAME_PATTERN,
    MAX_DATA_BYTES,
    SHA256_PATTERN,
    data_readme_append,
    data_register_from_catalog,
    data_register_from_workspace,
    data_register_upload,
    upload_limits,
)
from apps.expos.registry import STREAMED_FILE, Category, Role, ToolContext, obj, tool
from apps.expos.schemas import alternatives
from apps.expos.screening import WITHHELD_SCHEMA, screened_answer
from apps.expos.tools.discovery import connector_config
from apps.expos.visibility import visible_experiments
from apps.expos.workspaces import workspace_path
from apps.integrity.overlap import data_overlap, over_tolerance, sealed_scanner
from apps.integrity.upload_review import upload_review

MAX_SAMPLE_ROWS = 50
# A file too large to send inline is streamed here instead (apps.expos.uploads, Tool.stream_schema).
UPLOAD_PATH = "/api/v1/tools/worker_add_data/upload"
# An upload's content, in characters: under the default 2 MiB request limit with room for escaping.
MAX_UPLOAD_CHARS = 1_000_000
WITHHELD = "[withheld: matches a sealed evaluation item]"
# Columns that carry answers; a Reviewer sees the prompt of a row matching a sealed item but not
# these, because for a copied item they are the reference answer (DESIGN.md "Sealed evaluation").
ANSWER_COLUMNS = ("completion", "chosen", "rejected", "answer", "response", "output")

# --- schemas -------------------------------------------------------------------------------------------

HANDLE = {"type": "string", "minLength": 1, "maxLength": 64, "description": "Datapool handle (data_0007) or uuid."}
LIST_IN = obj(
    {
        "format": {"type": "string", "enum": [str(f) for f in AGENT_FORMATS]},
        "source_kind": {"type": "string", "enum": [s for s in SourceKind.values if s != SourceKind.EXPORT]},
        "search": {"type": "string", "maxLength": 200, "description": "Part of the entry name."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
        "offset": {"type": "integer", "minimum": 0, "maximum": 1_000_000, "default": 0},
    }
)
_ENTRY_FIELDS: dict[str, Any] = {
    "handle": {"type": "string"},
    "uuid": {"type": "string"},
    "name": {"type": "string"},
    "format": {"type": "string"},
    "rows": {"type": "integer"},
    "size_bytes": {"type": "integer"},
    "sha256": {"type": "string"},
    "source_kind": {"type": "string"},
    "source": {"type": "object"},
    "teacher": {"type": "string"},
    "registered_at": {"type": "string"},
}
ENTRY = obj(_ENTRY_FIELDS, required=list(_ENTRY_FIELDS))
REVIEWER_ENTRY = obj(
    {
        **_ENTRY_FIELDS,
        "registered_by": {"type": ["string", "null"]},
        "run": {"type": ["string", "null"]},
        "used_by_experiments": {"type": "integer"},
    },
    required=[*_ENTRY_FIELDS, "registered_by", "run", "used_by_experiments"],
)


def _list_out(entry_schema: dict[str, Any]) -> dict[str, Any]:
    return obj(
        {
            "entries": {"type": "array", "items": entry_schema},
            "count": {"type": "integer"},
            "next_offset": {"type": ["integer", "null"]},
        },
        required=["entries", "count", "next_offset"],
    )


README = {
    "type": "array",
    "items": obj(
        {"author": {"type": "string"}, "text": {"type": "string"}, "written_at": {"type": "string"}},
        required=["author", "text", "written_at"],
    ),
}
INSPECT_IN = obj(
    {
        "data": HANDLE,
        "rows": {"type": "integer", "minimum": 0, "maximum": MAX_SAMPLE_ROWS, "default": 5},
    },
    required=["data"],
)
WORKER_INSPECT_OUT = obj(
    {
        "entry": ENTRY,
        "schema": {"type": "object"},
        "sample": {"type": "array", "items": {"type": "object"}},
        "withheld_rows": {"type": "integer", "description": "Sample rows not shown: they match sealed items."},
        "withheld": WITHHELD_SCHEMA,
        "readme": README,
    },
    required=["entry", "schema", "sample", "withheld_rows", "withheld", "readme"],
)
USAGE = obj(
    {
        "experiments": {
            "type": "array",
            "items": obj(
                {
                    "experiment": {"type": "string"},
                    "worker": {"type": "string"},
                    "purpose": {"type": "string"},
                    "status": {"type": "string"},
                    "integrity_status": {"type": "string"},
                    "feedback_score": {"type": ["number", "null"]},
                },
                required=["experiment", "worker", "purpose", "status", "integrity_status", "feedback_score"],
            ),
        },
        "other_in_run": {"type": "integer", "description": "Uses by experiments of this run outside your scope."},
        "other_runs": {"type": "integer", "description": "Uses by experiments of other runs."},
    },
    required=["experiments", "other_in_run", "other_runs"],
)
OVERLAP = obj(
    {
        "benchmark": {"type": "string"},
        "sealed_items": {"type": "integer"},
        "rows_scanned": {"type": "integer"},
        "rows_matched": {"type": "integer"},
        "items_matched": {"type": "integer"},
        "by_kind": {"type": "object", "additionalProperties": {"type": "integer"}},
        "tolerance": {"type": "number"},
        "over_tolerance": {"type": "boolean"},
        "matches": {
            "type": "array",
            "items": obj(
                {
                    "row": {"type": "integer"},
                    "sample_id": {"type": "string"},
                    "kind": {"type": "string"},  # the layer: exact, ngram, near_dup, salient, embedding, ...
                    "span": {"type": "string"},
                    "score": {"type": "number"},
                },
                required=["row", "sample_id", "kind", "span", "score"],
            ),
        },
        "truncated": {"type": "boolean"},
        # apps/integrity/overlap.py data_overlap: every sealed id matched, and each layer's status.
        "sample_ids": {"type": "array", "items": {"type": "string"}},
        "layers": {"type": "object", "additionalProperties": {"type": "object"}},
        "required_missing": {"type": "array", "items": {"type": "string"}},
    },
    required=[
        "benchmark", "sealed_items", "rows_scanned", "rows_matched", "items_matched", "by_kind", "tolerance",
        "over_tolerance", "matches", "truncated",
    ],
)  # fmt: skip
REVIEWER_INSPECT_OUT = obj(
    {
        "entry": REVIEWER_ENTRY,
        "schema": {"type": "object"},
        "sample": {"type": "array", "items": {"type": "object"}},
        "redacted_rows": {
            "type": "integer",
            "description": "Sample rows whose answers are hidden: they match sealed items.",
        },
        "readme": README,
        "usage": USAGE,
        "overlap": OVERLAP,
    },
    required=["entry", "schema", "sample", "redacted_rows", "readme", "usage", "overlap"],
)
ADD_IN = obj(
    {
        "path": {
            "type": "string",
            "minLength": 1,
            "maxLength": 500,
            "description": "A JSONL file in your workspace, relative to it (e.g. materialized/x.jsonl from "
            "hf_materialize_dataset).",
        },
        "catalog": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "pattern": CATALOG_NAME_PATTERN,
            "description": "A local catalog dataset name.",
        },
        "name": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "Default: the file or dataset name.",
        },
        "format": {
            "type": "string",
            "enum": [str(f) for f in AGENT_FORMATS],
            "description": "Default: inferred from the rows.",
        },
        "teacher": {
            "type": "string",
            "maxLength": 200,
            "description": "The model that generated the data, if any; training on it needs the teacher on the "
            "run's allowed teachers.",
        },
        "note": {"type": "string", "maxLength": 20_000, "description": "Provenance text for the readme."},
        "content": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_UPLOAD_CHARS,
            "description": f"Data you made, sent in the call: the JSONL text itself (at most {MAX_UPLOAD_CHARS:,} "
            "characters, and the whole request at most 2 MiB by default). A bigger file goes as the body of "
            f"POST {UPLOAD_PATH} (streamed, the other arguments in the query string; 'expos worker_add_data "
            "--file' does that). Needs sha256, size_bytes and generator. Refused, with nothing registered, when "
            "it does not match them, is malformed, exceeds the run's upload_max_rows / upload_max_bytes, or "
            "matches sealed evaluation items beyond the run's tolerance (the lines are named). Send an "
            "Idempotency-Key to retry safely. CLI: expos worker_add_data --file rows.jsonl --generator ...",
        },
        "sha256": {
            "type": "string",
            "pattern": SHA256_PATTERN,
            "description": "With content: the sha256 (lowercase hex) of content's UTF-8 bytes.",
        },
        "size_bytes": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_UPLOAD_CHARS * 4,
            "description": "With content: the length of content's UTF-8 bytes.",
        },
        "generator": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "With content: who or what made the rows (e.g. 'claude-code session, script gen.py'); "
            "a model whose outputs the rows are goes in teacher as well.",
        },
    }
)
_UPLOAD_FIELDS = ["content", "sha256", "size_bytes", "generator"]
# Exactly one source; teacher and format describe a workspace file or an upload (a catalog dataset
# carries its own); the upload's fields come together, and only with content.
ADD_IN.update(
    alternatives(
        {"required": ["path"], "not": {"anyOf": [{"required": [f]} for f in ["catalog", *_UPLOAD_FIELDS]]}},
        {
            "required": ["catalog"],
            "not": {"anyOf": [{"required": [f]} for f in ["path", "format", *_UPLOAD_FIELDS]]},
            "properties": {"teacher": {"maxLength": 0}},
        },
        {"required": _UPLOAD_FIELDS, "not": {"anyOf": [{"required": ["path"]}, {"required": ["catalog"]}]}},
        code="invalid_source",
        message="Give exactly one of path (a file in your workspace), catalog (a catalog dataset name) or content "
        "(data you made, with sha256, size_bytes and generator); teacher and format are not for catalog datasets.",
    )
)
# The streamed upload's arguments (its query string): the upload's fields but content, which is the body.
STREAM_IN = obj(
    {
        **{key: ADD_IN["properties"][key] for key in ("name", "format", "teacher", "note", "sha256", "generator")},
        "size_bytes": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_DATA_BYTES,
            "description": "The length of the body (the file's bytes); the run's upload_max_bytes applies.",
        },
    },
    required=["sha256", "size_bytes", "generator"],
)
ADD_OUT = obj({"entry": ENTRY, "created": {"type": "boolean"}}, required=["entry", "created"])
README_IN = obj(
    {"data": HANDLE, "text": {"type": "string", "minLength": 1, "maxLength": 20_000}}, required=["data", "text"]
)
README_OUT = obj({"data": {"type": "string"}, "readme": README}, required=["data", "readme"])


# --- shaping -------------------------------------------------------------------------------------------


def entry_summary(entry: DataEntry) -> dict[str, Any]:
    return {
        "handle": entry.handle,
        "uuid": str(entry.uuid),
        "name": entry.name,
        "format": entry.format,
        "rows": entry.rows,
        "size_bytes": entry.size_bytes,
        "sha256": entry.sha256,
        "source_kind": entry.source_kind,
        "source": entry.source if isinstance(entry.source, dict) else {},
        "teacher": entry.teacher,
        "registered_at": entry.created_at.isoformat(),
    }


def _reviewer_summary(entry: DataEntry, used: int) -> dict[str, Any]:
    return {
        **entry_summary(entry),
        "registered_by": entry.registered_by.handle if entry.registered_by_id else None,
        "run": str(entry.run.uuid) if entry.run_id else None,
        "used_by_experiments": used,
    }


def _readme(entry: DataEntry) -> list[dict[str, Any]]:
    return [
        {"author": note.author, "text": note.text, "written_at": note.created_at.isoformat()}
        for note in data_readme(entry)
    ]


def _page(args: dict[str, Any]) -> tuple[Any, int, int, int]:
    entries = data_entry_list(
        format=args.get("format"), source_kind=args.get("source_kind"), search=args.get("search"), formats=AGENT_FORMATS
    )
    limit, offset = args.get("limit", 50), args.get("offset", 0)
    count = entries.count()
    return entries, count, limit, offset


def _next(count: int, limit: int, offset: int) -> int | None:
    return offset + limit if offset + limit < count else None


# --- tools ---------------------------------------------------------------------------------------------


@tool(
    "worker_show_datapool",
    category=Category.DATA,
    roles={Role.WORKER},
    description="List datapool entries (shared across runs): name, format, rows, sha256, source, teacher.",
    input_schema=LIST_IN,
    output_schema=_list_out(ENTRY),
)
def worker_show_datapool(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    entries, count, limit, offset = _page(args)
    return {
        "entries": [entry_summary(e) for e in entries[offset : offset + limit]],
        "count": count,
        "next_offset": _next(count, limit, offset),
    }


@tool(
    "reviewer_show_datapool",
    category=Category.DATA,
    roles={Role.REVIEWER},
    description="List datapool entries with who registered them and how many experiments used each.",
    input_schema=LIST_IN,
    output_schema=_list_out(REVIEWER_ENTRY),
)
def reviewer_show_datapool(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    entries, count, limit, offset = _page(args)
    page = entries.select_related("registered_by", "run").annotate(used=Count("usages"))[offset : offset + limit]
    return {
        "entries": [_reviewer_summary(e, e.used) for e in page],
        "count": count,
        "next_offset": _next(count, limit, offset),
    }


@tool(
    "worker_inspect_data",
    category=Category.DATA,
    roles={Role.WORKER},
    description="Inspect one datapool entry: schema, the first rows and its provenance readme.",
    input_schema=INSPECT_IN,
    output_schema=WORKER_INSPECT_OUT,
    errors=("data_not_found", "data_unreadable"),
)
def worker_inspect_data(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    entry = data_entry_get(args["data"], formats=AGENT_FORMATS)
    rows = data_rows(entry, limit=args.get("rows", 5))
    try:
        # The screen every agent read passes (discovery samples and cards too): rows and readme notes.
        shown, withheld = screened_answer(
            ctx, tool="worker_inspect_data", arguments=args, answer={"sample": rows, "readme": _readme(entry)}
        )
    except SealBroken:
        # Fail closed: when the sealed items cannot be checked, nothing is known to be safe to show.
        shown = {"sample": [], "readme": []}
        withheld = [{"at": "/sample", "reason": "the sealed evaluation items cannot be checked now"}]
    ctx.result_ref = f"data:{entry.uuid}"
    return {
        "entry": entry_summary(entry),
        "schema": entry.schema if isinstance(entry.schema, dict) else {},
        "sample": shown["sample"],
        "withheld_rows": len(rows) - len(shown["sample"]),
        "withheld": withheld,
        "readme": shown["readme"],
    }


@tool(
    "reviewer_inspect_data",
    category=Category.DATA,
    roles={Role.REVIEWER},
    description=(
        "Inspect one datapool entry as a Reviewer: schema, rows, readme, which experiments used it, and its "
        "overlap with the run benchmark's sealed items (exact, n-gram, near-duplicate; sample ids and spans)."
    ),
    input_schema=INSPECT_IN,
    output_schema=REVIEWER_INSPECT_OUT,
    errors=("data_not_found", "data_unreadable", "seal_broken"),
)
def reviewer_inspect_data(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    entry = data_entry_get(args["data"], formats=AGENT_FORMATS)
    overlap = data_overlap(entry=entry, benchmark=ctx.run.benchmark, policy=ctx.run.policy)
    rows = data_rows(entry, limit=args.get("rows", 5))
    matched_rows = {m["row"] for m in overlap["matches"]} if not overlap["truncated"] else None
    if matched_rows is None:
        matched_rows = {m.row_index for m in sealed_scanner(benchmark=ctx.run.benchmark).scan(rows)}
    sample = [_redact_answers(row) if i in matched_rows else row for i, row in enumerate(rows)]
    tolerance = float((ctx.run.policy or {}).get("contamination_tolerance", 0) or 0)
    ctx.result_ref = f"data:{entry.uuid}"
    return {
        "entry": _reviewer_summary(entry, entry.usages.count()),
        "schema": entry.schema if isinstance(entry.schema, dict) else {},
        "sample": sample,
        "redacted_rows": sum(1 for i in range(len(rows)) if i in matched_rows),
        "readme": _readme(entry),
        "usage": _usage(ctx, entry),
        "overlap": {
            **overlap,
            "tolerance": tolerance,
            "over_tolerance": over_tolerance(overlap["rows_matched"], entry.rows, tolerance),
        },
    }


def _redact_answers(row: dict[str, Any]) -> dict[str, Any]:
    return {key: WITHHELD if key in ANSWER_COLUMNS else value for key, value in row.items()}


def _usage(ctx: ToolContext, entry: DataEntry) -> dict[str, Any]:
    usages = DataUsage.objects.filter(entry=entry).select_related("experiment__owner")
    visible = set(visible_experiments(ctx).values_list("pk", flat=True))
    shown, other_in_run, other_runs = [], 0, 0
    for usage in usages.order_by("created_at", "pk"):
        experiment = usage.experiment
        if experiment.pk in visible:
            shown.append(
                {
                    "experiment": experiment.handle,
                    "worker": experiment.owner.handle,
                    "purpose": usage.purpose,
                    "status": experiment.status,
                    "integrity_status": experiment.integrity_status,
                    "feedback_score": experiment.feedback_score,
                }
            )
        elif experiment.run_id == ctx.run.pk:
            other_in_run += 1
        else:
            other_runs += 1
    return {"experiments": shown, "other_in_run": other_in_run, "other_runs": other_runs}


@tool(
    "worker_add_data",
    category=Category.DATA,
    roles={Role.WORKER},
    description=(
        "Register data in the datapool: a JSONL file in your workspace (path; e.g. a discovery download "
        "materialized there), a local catalog dataset (catalog), or data you made yourself (content, with its "
        "sha256, size_bytes and generator; source 'agent'). The bytes are copied into the "
        "content-addressed store with their sha256, rows, schema, source and teacher; identical bytes return "
        "the existing entry. An upload is checked for sealed evaluation items before it is registered; any "
        "data is checked again when a submission trains on it. Only registered data can be trained on. "
        "Latency: an upload's review runs inside the call, about 0.5 s per 1,000 rows (a few seconds for "
        "minibench-sized data; a 50 MB file took minutes). A client with a shorter timeout (an MCP client's 10 s) "
        "retries with the same Idempotency-Key: while "
        "the first call runs the retry answers 409 in_progress at once (nothing is done twice); once it has "
        "committed, the retry answers with its result (\"replayed\": true)."
    ),
    input_schema=ADD_IN,
    output_schema=ADD_OUT,
    stream_schema=STREAM_IN,
    idempotent_create=True,
    errors=(
        "invalid_source", "invalid_path", "absolute_path", "path_escape", "symlink_in_path", "not_found",
        "not_a_file", "unreadable", "file_too_large", "empty_file", "blank_line", "malformed_jsonl", "bad_value",
        "not_an_object", "unknown_format", "missing_columns", "bad_column_type", "invalid_name",
        "size_mismatch", "sha256_mismatch", "too_many_rows", "invalid_generator", "data_contaminated",
        "contamination_unchecked",
    ),
)  # fmt: skip
def worker_add_data(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    path, catalog, content = args.get("path"), args.get("catalog"), args.get("content")
    streamed: Path | None = ctx.extra.get(STREAMED_FILE)
    if streamed is not None:
        content = streamed
    if sum(x is not None for x in (path, catalog, content)) != 1:
        raise ApplicationError(
            "invalid_source",
            "Give exactly one of path (a file in your workspace), catalog (a catalog dataset name) or content.",
        )
    started = timezone.now()
    if content is not None:
        entry = _upload(ctx, args, content)
    elif path is not None:
        entry = data_register_from_workspace(
            workspace=workspace_path(run=ctx.run, node=ctx.node),
            path=path,
            # The default name is the file's stem, cut to a name's 200 characters (path allows 500).
            name=args.get("name") or (Path(path).stem or path)[:200],
            format=args.get("format"),
            run=ctx.run,
            node=ctx.node,
            teacher=args.get("teacher", ""),
            note=args.get("note", ""),
        )
    else:
        if args.get("teacher") or args.get("format"):
            raise ApplicationError(
                "invalid_source",
                "teacher and format are for workspace files; a catalog dataset carries its own format and provenance.",
            )
        entry = data_register_from_catalog(
            catalog_root=_catalog_root(),
            dataset=catalog,
            name=args.get("name"),
            run=ctx.run,
            node=ctx.node,
            note=args.get("note", ""),
        )
    ctx.result_ref = f"data:{entry.uuid}"
    return {"entry": entry_summary(entry), "created": entry.created_at >= started}


def _upload(ctx: ToolContext, args: dict[str, Any], content: str | Path) -> DataEntry:
    """Data the agent made (inline, or a streamed file's staged copy): the same registration as a
    file's, reviewed for sealed items first."""
    max_bytes, max_rows, policy = upload_limits(ctx.run)
    # What a refusal records of the call: its arguments, the content by its digest alone.
    recorded = {key: value for key, value in args.items() if key != "content"}
    return data_register_upload(
        content=content if isinstance(content, Path) else content.encode("utf-8"),
        sha256=args["sha256"],
        size=args["size_bytes"],
        name=args.get("name") or f"upload-{args['sha256'][:12]}",
        generator=args["generator"],
        run=ctx.run,
        node=ctx.node,
        format=args.get("format"),
        teacher=args.get("teacher", ""),
        note=args.get("note", ""),
        max_bytes=max_bytes,
        max_rows=max_rows,
        scan=lambda rows, sha256: upload_review(
            run=ctx.run, node=ctx.node, rows=rows, sha256=sha256, policy=policy, request=recorded
        ),
    )


def _catalog_root() -> Path:
    return Path(connector_config().local_catalog_dir or "")


@tool(
    "worker_update_readme",
    category=Category.DATA,
    roles={Role.WORKER},
    description="Append a provenance note to a datapool entry's readme (append-only: notes are never edited).",
    input_schema=README_IN,
    output_schema=README_OUT,
    errors=("data_not_found", "empty_text", "text_too_long"),
)
def worker_update_readme(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    entry = data_entry_get(args["data"], formats=AGENT_FORMATS)
    data_readme_append(entry=entry, author=ctx.actor, text=args["text"], node=ctx.node)
    ctx.result_ref = f"data:{entry.uuid}"
    return {"data": entry.handle, "readme": _readme(entry)}
