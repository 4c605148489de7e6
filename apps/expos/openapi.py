"""OpenAPI generation from the tool registry (drf-spectacular).

The generic POST /api/v1/tools/{name} view is hidden from the schema; instead this hook writes
one path per registered tool, with the tool's own input and output schemas, its headers
(Idempotency-Key, If-Match, ETag) and every error response it can give — so the document, the
LLM definitions and the CLI all come from the same declarations. The hook also documents the
JSON error body on every operation of the API.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from drf_spectacular.extensions import OpenApiAuthenticationExtension

from apps.expos.api.filters import MAX_SEQ
from apps.expos.registry import Category, load_all

ERROR_COMPONENT = "Error"
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Stable, machine-readable reason."},
                "message": {"type": "string", "description": "What went wrong and how to fix it."},
                "detail": {"description": "Structured context: the failing path, the current ETag, ..."},
            },
            "required": ["code", "message"],
            "additionalProperties": False,
        }
    },
    "required": ["error"],
    "additionalProperties": False,
}
ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}

# What each status means for every tool; tools add their own codes in the description.
COMMON_TOOL_ERRORS = {
    "400": "invalid_if_match (longer than 200 characters), invalid_input (with the JSON path of the first error; "
    "lone surrogates, NUL characters, infinities and "
    "nesting beyond 64 levels are refused with theirs), invalid_json (NaN/Infinity: with their path), or a domain "
    "refusal",
    "401": "no, unknown, revoked or expired agent token (tokens expire with their run)",
    "403": "forbidden_role: the token's role may not call this tool; sealed: a refused read of sealed material",
    "404": "unknown_tool, or a named record that is not visible to the caller",
    "409": "conflict: idempotency_mismatch, in_progress, or the records' state refuses the change",
    "413": "request_too_large: the body exceeds RSI_MAX_REQUEST_BYTES",
    "415": "unsupported_media_type: send application/json",
    "411": "length_required: a chunked body on a server that cannot read one; send Content-Length",
    "429": "throttled: this token's rate limit (RSI_TOKEN_RATE) was reached",
    "501": "unsupported_transfer_coding: only chunked (or none) is accepted",
    "503": "a dependency is briefly unavailable (database, Redis, a required contamination layer); "
    "retry after the Retry-After header's seconds",
}
COMMON_READ_ERRORS = {
    "400": "invalid filter or query parameter",
    "401": "not authenticated",
    "403": "not a viewer, or a refused read of sealed material (recorded)",
    "404": "not found or not visible to the caller",
    "429": "throttled",
    "503": "the database or Redis is briefly unavailable; retry after the Retry-After header's seconds",
}

NOTE_WRITE_ERRORS = {
    "400": "invalid (the body's text: empty, too long, unknown fields), note_empty, note_too_long, invalid_if_match",
    "403": "writing a note needs the operator role; an agent token may not read or change notes",
    "412": "precondition_failed: If-Match is not the note's current ETag (detail.current_etag)",
}


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.expos.auth.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An agent token bound to (run, research node, role); it expires with its run.",
        }


_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before retrying."}}


def _error_responses(errors: dict[str, str]) -> dict[str, Any]:
    responses: dict[str, Any] = {
        status: {"description": text, "content": {"application/json": {"schema": ERROR_REF}}}
        for status, text in errors.items()
    }
    for status in ("429", "503"):
        if status in responses:
            responses[status]["headers"] = _RETRY_AFTER
    return responses


def _empty_body_valid(tool: Any) -> bool:
    validator = jsonschema.validators.validator_for(tool.input_schema, default=jsonschema.Draft202012Validator)
    return bool(validator(tool.input_schema).is_valid({}))


def tool_operation(tool: Any) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = []
    if tool.idempotent_create:
        parameters.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "Retry-safe key: the same key and body replays the stored answer (200); "
                "the same key with another body is refused (409 idempotency_mismatch); a retry while the first "
                "call with the key still runs is answered at once with 409 in_progress (retry later).",
                "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"^[\x21-\x7e]+$"},
            }
        )
    if tool.etag_node is not None:
        parameters.append(
            {
                "name": "If-Match",
                "in": "header",
                "required": False,
                "description": "The node's ETag as last read; a stale one gets 412 precondition_failed.",
                "schema": {"type": "string", "maxLength": 200},
            }
        )
    ok = {
        "description": tool.description,
        "content": {"application/json": {"schema": tool.output_schema}},
        "headers": {"ETag": {"schema": {"type": "string"}, "description": "Version of the node the call concerns."}},
    }
    responses: dict[str, Any] = {}
    if tool.idempotent_create:
        responses["201"] = ok
        responses["200"] = {**ok, "description": "Replayed answer of an earlier call with this Idempotency-Key."}
    else:
        responses["200"] = ok
    errors = dict(COMMON_TOOL_ERRORS)
    if tool.etag_node is not None:
        errors["412"] = "precondition_failed: If-Match does not match the node's current ETag"
    if tool.category == Category.DISCOVERY:
        errors["424"] = "not_configured / unreachable / upstream_error: the external service behind the connector"
    responses.update(_error_responses(errors))
    codes = ", ".join(tool.errors)
    return {
        "operationId": f"tool_{tool.name}",
        "summary": tool.description.split(". ")[0][:120],
        "description": f"{tool.description}\n\nRoles: {', '.join(sorted(tool.roles))}. Category: {tool.category}."
        + (f" Error codes: {codes}." if codes else ""),
        "tags": [f"tools: {tool.category}"],
        "security": [{"agentToken": []}],
        "parameters": parameters,
        # An empty body means {}: the body is required exactly when {} is not valid arguments
        # (required arguments, minProperties, alternatives of which one must be given).
        "requestBody": {
            "required": not _empty_body_valid(tool),
            "content": {"application/json": {"schema": tool.input_schema}},
        },
        "responses": responses,
    }


def postprocess(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular POSTPROCESSING_HOOK: one path per tool, and the Error body everywhere."""
    components = result.setdefault("components", {})
    components.setdefault("schemas", {})[ERROR_COMPONENT] = ERROR_SCHEMA
    components.setdefault("securitySchemes", {})["agentToken"] = {"type": "http", "scheme": "bearer"}
    paths = result.setdefault("paths", {})
    for path, operations in paths.items():
        for method, operation in operations.items():
            if method not in ("get", "post", "put", "patch", "delete") or not path.startswith("/api/v1/"):
                continue
            for status, entry in _error_responses(COMMON_READ_ERRORS).items():
                operation.setdefault("responses", {}).setdefault(status, entry)
            if str(operation.get("operationId", "")).endswith("_note_write"):  # apps.expos.api.people
                operation["responses"].update(_error_responses(NOTE_WRITE_ERRORS))
    # The events cursor: a whole sequence number within the filter's bounds (django-filter's
    # NumberFilter is documented as an unbounded number).
    # A filter given empty is refused (apps.expos.api.filters.StrictFilterSet): every string one is non-empty.
    for operations in paths.values():
        for parameter in operations.get("get", {}).get("parameters", []):
            schema = parameter.get("schema", {})
            if parameter.get("in") == "query" and schema.get("type") == "string":
                schema.setdefault("minLength", 1)
    for parameter in paths.get("/api/v1/events/", {}).get("get", {}).get("parameters", []):
        if parameter.get("name") == "after_seq":
            parameter["schema"] = {"type": "integer", "minimum": 0, "maximum": MAX_SEQ}
    for name, tool in sorted(load_all().items()):
        paths[f"/api/v1/tools/{name}"] = {"post": tool_operation(tool)}
        if tool.stream_schema is not None:
            paths[f"/api/v1/tools/{name}/upload"] = {"post": upload_operation(tool)}
    return result


def upload_operation(tool: Any) -> dict[str, Any]:
    """A tool with a file streamed as the body (apps.expos.uploads): its other arguments are the query."""
    operation = tool_operation(tool)
    required = set(tool.stream_schema["required"])
    query = [
        {"name": key, "in": "query", "required": key in required, "schema": schema}
        for key, schema in tool.stream_schema["properties"].items()
    ]
    operation["operationId"] = f"tool_{tool.name}_upload"
    operation["summary"] = "Upload a file of data you made (streamed body): worker_add_data for large files"
    operation["description"] = (
        "worker_add_data for a file larger than the inline content limit: the body is the JSONL file's bytes "
        "(Content-Length, or chunked), streamed to disk and never held in memory; sha256, size_bytes, generator "
        "and the optional name, format, teacher and note are query parameters. A body whose length or sha256 is "
        "not the declared one is refused (400 size_mismatch / sha256_mismatch) and nothing is registered. Then "
        "exactly the checks of every upload: JSONL format, the run's upload_max_rows / upload_max_bytes (413 "
        "before the body is read when size_bytes is over), the contamination review against the sealed items "
        "(403 data_contaminated, naming the lines, recorded as a BlockedAttempt), the content-addressed store. "
        "Retry-safe: the same Idempotency-Key and arguments replay the answer; identical bytes answer the entry "
        "they made.\n\n" + operation["description"]
    )
    operation["parameters"] = [*operation["parameters"], *query]
    operation["requestBody"] = {
        "required": True,
        "content": {
            media: {"schema": {"type": "string", "format": "binary"}}
            for media in ("application/x-ndjson", "application/octet-stream")
        },
    }
    operation["responses"].update(
        _error_responses(
            {
                "411": "length_required: no Content-Length and not chunked",
                "413": "file_too_large: size_bytes is over the run's upload_max_bytes (nothing was read)",
            }
        )
    )
    return operation
