"""The tool endpoints, generated from the registry: POST /api/v1/tools/<name> and the tool listings.

One view serves every tool. Per call, in order: authenticate (agent bearer token), check the
caller's role is among the tool's roles, parse and validate the JSON body against the tool's
closed input schema, replay or refuse an Idempotency-Key, then — in one transaction — hold the
mutated node to If-Match, run the handler (a service call), validate its output against the
closed output schema, store the idempotent answer and record the call as an event. A tool whose
common call is one statement that makes the change, records the call and refuses itself where the
handler would (Tool.at_once: experiment_log_metrics) runs that statement first, as its own
transaction; when it refuses, the call takes the transactional path above.

Refusals are recorded too, but *after* the transaction has rolled back, so the record of a
refused call (and of a denied sealed read) is never lost with the refused change.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import fastjsonschema
import jsonschema
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError, connection, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.views.defaults import page_not_found
from django.views.defaults import server_error as default_server_error
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import Throttled
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api import error_body
from apps.core.errors import ApplicationError, Conflict, NotFound
from apps.core.hashing import canonical_json, sha256_text
from apps.core.jsonsafe import MAX_DEPTH as JSON_MAX_DEPTH
from apps.core.jsonsafe import (
    Constant,
    escape_text,
    first_bad_value,
    json_path,
    json_pointer,
    plainly_clean,
    text_may_hold_bad_chars,
)
from apps.core.jsonsafe import loads as jsonsafe_loads
from apps.core.people import is_human_viewer
from apps.core.transient import TRANSIENT_ERRORS, service_unavailable_for
from apps.experiments.events import PendingEvent
from apps.expos.auth import AgentTokenAuthentication, AgentTokenRateThrottle, agent_token_of
from apps.expos.jsontext import cap_depth
from apps.expos.models import AgentToken, IdempotencyRecord
from apps.expos.payloads import etag_value
from apps.expos.registry import Role, Tool, ToolContext, load_all, tools_for_role
from apps.expos.schemas import REFUSAL_KEY, Coercion, integer_coercion, integers_coerced
from apps.expos.services import harness_turn_record, tool_call_event, tool_call_record
from apps.expos.visibility import SealedAccessDenied, sealed_denial_record
from apps.research.choices import AgentMode
from apps.research.models import ResearchNode

logger = logging.getLogger(__name__)

# Larger integers cannot be stored (PostgreSQL bigint) and are never meaningful to a tool.
MAX_INT = 2**63 - 1
MAX_IDEMPOTENCY_KEY = 200
MAX_IF_MATCH = 200  # an ETag is under 60 characters; the OpenAPI document gives the same bound
_IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,200}$")
# Nesting beyond this is refused before validation (the body is level 1); no tool schema is nearly this deep.
MAX_DEPTH = JSON_MAX_DEPTH


class PreconditionFailed(ApplicationError):
    status_code = 412


def etag_matches(header: str, node: ResearchNode) -> bool:
    """If-Match semantics (RFC 9110 13.1.1): ``*`` or any listed tag equal to the current one."""
    current = etag_value(node)
    for candidate in header.split(","):
        tag = candidate.strip()
        if tag == "*":
            return True
        if tag.startswith("W/"):
            tag = tag[2:]  # weak comparison is enough: the version is the whole state
        if tag == current or tag == current.strip('"'):
            return True
    return False


class _SessionWithoutCsrf(SessionAuthentication):
    """Identify a signed-in person only to refuse them clearly (403): tools are for agent tokens.

    No tool ever runs for a session, so the CSRF check would only turn that 403 into a vaguer one.
    """

    def enforce_csrf(self, request: Request) -> None:
        return


class InvalidInput(ApplicationError):
    status_code = 400

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__("invalid_input", message, **detail)


def _json_pointer(path: Any) -> str:
    return json_pointer(list(path))


def _refuse_bad_value(args: Any) -> None:
    """Refuse what no schema can mean and no record can hold, naming its path (apps.core.jsonsafe).

    Lone surrogates, NUL characters, NaN/Infinity (bare tokens or 1e999) and nesting beyond
    MAX_DEPTH are refused here, and integers beyond bigint by _refuse_huge_integer (after the
    coercion of whole floats), before any schema or handler sees them: a handler hashing or
    storing such a value would crash, and the crash would take the record of the call with it.
    """
    bad = first_bad_value(args, max_depth=MAX_DEPTH)
    if bad is not None:
        # A bare NaN/Infinity token is not JSON at all (RFC 8259): the body's fault, not a value's.
        code = "invalid_json" if bad.rule == "non_finite_number" and _has_constant(args, bad.parts) else "invalid_input"
        raise ApplicationError(
            code,
            bad.message,
            path=bad.pointer,
            json_path=bad.path,
            rule=bad.rule,
        )


def _refuse_huge_integer(args: Any) -> None:
    big = _first_huge_integer(args, ())
    if big is not None:
        raise InvalidInput(
            f"{json_path(big)}: integer out of range (|n| <= 2^63-1).",
            path=json_pointer(big),
            json_path=json_path(big),
            rule="integer_range",
        )


def _has_constant(args: Any, parts: tuple[Any, ...]) -> bool:
    value = args
    for part in parts:
        value = value[part]
    return isinstance(value, Constant)


def _first_huge_integer(value: Any, parts: tuple[Any, ...]) -> tuple[Any, ...] | None:
    # Only called once first_bad_value passed, so the nesting is bounded by MAX_DEPTH.
    if isinstance(value, int) and not isinstance(value, bool):
        return parts if abs(value) > MAX_INT else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _first_huge_integer(item, (*parts, key))
        if found is not None:
            return found
    return None


_VALIDATORS: dict[tuple[str, str], jsonschema.protocols.Validator] = {}


def _validator(tool: Tool, which: str) -> jsonschema.protocols.Validator:
    key = (tool.name, which)
    if key not in _VALIDATORS:
        schema = tool.input_schema if which == "input" else tool.output_schema
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        _VALIDATORS[key] = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return _VALIDATORS[key]


_COMPILED: dict[tuple[str, str], Callable[[Any], Any]] = {}
# fastjsonschema knows no "uuid" format: jsonschema's check (hyphens at 8, 13, 18, 23), as a pattern.
_FORMATS = {"uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"}


def _compiled(tool: Tool, which: str) -> Callable[[Any], Any]:
    """The tool's input or output schema compiled to Python code (fastjsonschema), once per process.

    jsonschema walks a 1,000-point batch or a 10,000-point answer keyword by keyword (85 % of such
    a call); the compiled check runs the same rules as straight-line code. It is only ever a
    shortcut to "valid": it is at least as strict as jsonschema on every keyword our schemas use
    (tests/apps/expos/test_validation.py checks that on the registry), and whenever it objects,
    jsonschema decides and explains. ``use_default=False``: validation never fills in defaults,
    so the recorded arguments are the caller's.
    """
    key = (tool.name, which)
    check = _COMPILED.get(key)
    if check is None:
        schema = tool.input_schema if which == "input" else tool.output_schema
        # Through JSON: enums of Django choices become the plain strings the generated code can name.
        plain = json.loads(json.dumps(schema))
        check = _COMPILED[key] = fastjsonschema.compile(plain, formats=_FORMATS, use_default=False)
    return check


def _passes_compiled(tool: Tool, which: str, value: Any) -> bool:
    try:
        _compiled(tool, which)(value)
    except fastjsonschema.JsonSchemaValueException:
        return False
    return True


_COERCIONS: dict[str, Coercion] = {}


def validate_input(tool: Tool, args: Any, *, strings_screened: bool = False) -> Any:
    """The arguments, whole floats made integers where the schema wants one (5.0 -> 5); else 400.

    The 400 is ``invalid_input`` naming the path of the first error, phrased so an agent can fix it.
    ``strings_screened``: the JSON text the arguments came from passed ``text_may_hold_bad_chars``,
    so no string in them needs looking at.
    """
    if plainly_clean(args, check_strings=not strings_screened, max_int=MAX_INT, max_depth=MAX_DEPTH):
        # The common case, in one quick pass: nothing to refuse; coerce where the schema wants
        # integers, and check the range only of values that coercion made integers.
        coercion = _COERCIONS.get(tool.name)
        if coercion is None:
            coercion = _COERCIONS[tool.name] = integer_coercion(tool.input_schema)
        coerced: list[int] = []
        args = coercion(args, coerced)
        if coerced:
            _refuse_huge_integer(args)
    else:
        _refuse_bad_value(args)
        args = integers_coerced(tool.input_schema, args)
        # After the coercion, so a float so large it is whole (1e300) is refused here too, with its path.
        _refuse_huge_integer(args)
    if _passes_compiled(tool, "input", args):
        return args
    errors = list(_validator(tool, "input").iter_errors(args))
    for error in errors:
        # Alternatives (oneOf/anyOf) that name their own refusal: the domain's code and message,
        # which say what to send, rather than "not valid under any of the given schemas".
        where_rule = error.schema if isinstance(error.schema, dict) else {}
        refusal = where_rule.get(REFUSAL_KEY) if error.validator in ("oneOf", "anyOf") else None
        if isinstance(refusal, dict):
            raise ApplicationError(refusal["code"], refusal["message"], path=_json_pointer(error.absolute_path))
    error = jsonschema.exceptions.best_match(errors)
    if error is None:
        return args
    where = _json_pointer(error.absolute_path)
    raise InvalidInput(
        f"{tool.name}: {where}: {error.message}",
        path=where,
        rule=str(error.validator),
        hint=f"GET /api/v1/tools/definitions shows the parameters of {tool.name}.",
    )


def output_errors(tool: Tool, result: Any) -> list[str]:
    if _passes_compiled(tool, "output", result):
        return []
    errors = _validator(tool, "output").iter_errors(result)
    return [f"{_json_pointer(e.absolute_path)}: {e.message}" for e in errors][:5]


def parse_body(request: HttpRequest) -> tuple[dict[str, Any], bool]:
    """The JSON object in the body (an empty body is ``{}``), and whether its text was free of
    anything that parses into a NUL or a lone surrogate. Errors are 400/413/415, never 500."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApplicationError(
            "request_too_large", "The request body exceeds the size limit (RSI_MAX_REQUEST_BYTES).", status=413
        ) from None
    if len(raw) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
        raise ApplicationError(
            "request_too_large", "The request body exceeds the size limit (RSI_MAX_REQUEST_BYTES).", status=413
        )
    if not raw:
        return {}, True  # whitespace alone is not JSON: refused below, like any other invalid body
    meta = request.META
    content_type = (meta.get("CONTENT_TYPE", meta.get("HTTP_CONTENT_TYPE", "")) or "").split(";")[0].strip().lower()
    if content_type not in ("application/json", ""):
        raise ApplicationError(
            "unsupported_media_type", f"Send the arguments as application/json, not {content_type!r}.", status=415
        )
    try:
        # NaN/Infinity are kept as markers so validate_input can name their path. Invalid UTF-8
        # inside a string decodes to lone surrogates (surrogateescape), refused there with a path too.
        text = raw.decode("utf-8", errors="surrogateescape")
        try:
            args = jsonsafe_loads(text)
        except RecursionError:
            # Too deep for Python's parser: read it with nesting beyond MAX_DEPTH cut, so the
            # refusal below (too_deep) names the path of the first too-deep value, as for any depth.
            text = cap_depth(raw, MAX_DEPTH).decode("utf-8", errors="surrogateescape")
            args = jsonsafe_loads(text)
    except (ValueError, RecursionError) as exc:
        raise ApplicationError("invalid_json", f"The body is not valid UTF-8 JSON: {exc}".strip()) from None
    if not isinstance(args, dict):
        raise InvalidInput("The body must be a JSON object of the tool's arguments.", path="/")
    return args, not text_may_hold_bad_chars(text)


def _record_refusal(
    ctx: ToolContext, tool: Tool | str, args: Any, exc: ApplicationError, request: HttpRequest | None = None
) -> None:
    """Record a refused call, in its own transaction (the handler's has rolled back).

    ``tool`` is the tool's name alone when no tool has it (unknown_tool). A call refused before
    its arguments were read (an unknown tool, the wrong role, a bad If-Match, a body too large or
    no JSON) is recorded with what ``request`` sent, in a form any record can hold (_sent_form).
    """
    name = tool.name if isinstance(tool, Tool) else escape_text(tool)[:100]
    try:
        if isinstance(exc, SealedAccessDenied):
            sealed_denial_record(exc)
        # Refusals that carry evidence of their own (the submission review's BlockedAttempts).
        record_after_rollback = getattr(exc, "record_after_rollback", None)
        if callable(record_after_rollback):
            record_after_rollback()
        elif isinstance(tool, Tool) and tool.audit_refused is not None and isinstance(args, dict):
            # Refused before (or apart from) the review: what the request also asked for still counts.
            tool.audit_refused(ctx, args)
        recorded = args if isinstance(args, dict) else _sent_form(request) if request is not None else None
        tool_call_record(
            ctx=ctx,
            tool=name,
            arguments=recorded,
            status=exc.status_code,
            error=exc.code,
            idempotency_key=ctx.idempotency_key,
            error_path=str(exc.detail.get("json_path", "")),
        )
        if isinstance(tool, Tool) and tool.after_refusal is not None and isinstance(args, dict):
            tool.after_refusal(ctx, args)
        harness_turn_record(ctx=ctx, tool=name, arguments=recorded, status=exc.status_code,
                            answer=error_body(exc.code, exc.message, exc.detail or None))  # fmt: skip
    except Exception:  # the refusal itself must still reach the agent
        logger.exception("could not record the refused call of %s", name)


SENT_HEAD_CHARS = 200


def _sent_form(request: HttpRequest) -> dict[str, Any]:
    """What a call refused before its arguments were read sent: the arguments where the body is a
    JSON object (escaped on recording, apps.expos.services), else the body's size, digest and an
    escaped head. A body over the size limit is not read: its declared size stands for it."""
    try:
        raw = request.body
    except RequestDataTooBig:
        return {"body_bytes": int(request.META.get("CONTENT_LENGTH") or 0), "body_read": False}
    if not raw:
        return {}
    if len(raw) <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
        try:
            args = jsonsafe_loads(raw.decode("utf-8", errors="surrogateescape"))
        except (ValueError, RecursionError):
            args = None
        if isinstance(args, dict):
            return args
    head = raw[:SENT_HEAD_CHARS].decode("utf-8", errors="backslashreplace")
    return {"body_bytes": len(raw), "body_sha256": hashlib.sha256(raw).hexdigest(), "body_head": escape_text(head)}


@dataclass
class _Answer:
    """What a tool call answers, before it is rendered: JSON data, a status and extra headers."""

    data: Any
    status: int
    headers: dict[str, str] = field(default_factory=dict)


_RENDERER = JSONRenderer()


@extend_schema(exclude=True)  # documented per tool by apps.expos.openapi.postprocess
class ToolCallView(APIView):
    """POST /api/v1/tools/<name>: call one ExpOS tool as the token's (run, node, role).

    An agent's call (a POST with a bearer token) is answered without DRF's Request and Response,
    whose set-up, negotiation, permission and rendering layers cost about 0.1 ms of the server's
    1.45 ms of CPU per single append (bench/append_cpu.py). The steps are DRF's own, in its order:
    authenticate, rate limit, the call, JSON as JSONRenderer writes it, the view's default
    headers. Every refusal is answered by DRF's exception handling, as on DRF's path, so each
    answer is the one DRF's dispatch gives (tests/apps/expos/test_request_path.py compares them).
    Anything else (a person, no credentials, another method) goes through DRF's dispatch.
    """

    authentication_classes = [AgentTokenAuthentication, _SessionWithoutCsrf]
    permission_classes = [IsAuthenticated]
    throttle_classes = [AgentTokenRateThrottle]
    parser_classes: list[Any] = []  # the body is parsed here, so every failure has our JSON shape
    renderer_classes = [JSONRenderer]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[JSONRenderer, str]:
        # A tool answers JSON, whatever the Accept header asks (the OpenAPI document says so):
        # nothing to negotiate, so the Accept header is not parsed on every call.
        return _RENDERER, _RENDERER.media_type

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method != "POST":
            return super().dispatch(request, *args, **kwargs)
        self.args, self.kwargs = args, kwargs
        try:
            found = AgentTokenAuthentication().authenticate(request)
        except Exception as exc:
            return self._refused(request, exc)
        if found is None:  # a person, or no credentials: DRF's 401/403
            return super().dispatch(request, *args, **kwargs)
        try:
            # As DRF's Request does, so the rate limit (and anything after) sees who calls.
            cast(Any, request).user, cast(Any, request).auth = found
            throttle = AgentTokenRateThrottle()
            if not throttle.allow_request(request, self):
                raise Throttled(throttle.wait())  # what APIView.throttled raises
            answer = self._answer(request, found[1], kwargs["name"])
        except Exception as exc:
            return self._refused(request, exc)
        content = _RENDERER.render(answer.data)
        response = HttpResponse(content, status=answer.status, content_type=_RENDERER.media_type)
        for key, value in (*self.default_response_headers.items(), *answer.headers.items()):
            response[key] = value
        return response

    def _refused(self, request: HttpRequest, exc: Exception) -> HttpResponseBase:
        """The error answer of the agent's path, made by DRF from the exception as on its own path."""
        self.request = self.initialize_request(request, *self.args, **self.kwargs)
        self.headers = self.default_response_headers
        response = self.handle_exception(exc)
        return self.finalize_response(self.request, response, *self.args, **self.kwargs)

    def post(self, request: Request, name: str) -> Response:
        answer = self._answer(request._request, agent_token_of(request), name)
        return Response(answer.data, status=answer.status, headers=answer.headers)

    def _answer(self, request: HttpRequest, token: AgentToken | None, name: str) -> _Answer:
        tool = load_all().get(name)
        if token is None:
            if tool is None:
                raise _unknown_tool(name)
            raise ApplicationError(
                "forbidden_role",
                "Tools are called with an agent token (Authorization: Bearer); people use the read endpoints.",
                status=403,
            )
        ctx = ToolContext(
            run=token.run,
            node=token.node,
            role=token.role,
            token=token,
            idempotency_key=request.META.get("HTTP_IDEMPOTENCY_KEY"),
            if_match=request.META.get("HTTP_IF_MATCH"),
        )
        if tool is None:
            # An agent's call of no tool is still a call: on record, with what it sent.
            unknown = _unknown_tool(name)
            _record_refusal(ctx, name, None, unknown, request)
            raise unknown
        args: Any = None
        try:
            if ctx.role not in tool.roles:
                raise ApplicationError(
                    "forbidden_role",
                    f"{tool.name} is for the {', '.join(sorted(tool.roles))} role(s); this token acts as {ctx.role}.",
                    status=403,
                )
            if ctx.if_match is not None and len(ctx.if_match) > MAX_IF_MATCH:
                raise ApplicationError(
                    "invalid_if_match", f"If-Match is at most {MAX_IF_MATCH} characters: send the ETag you read."
                )
            # Parsed first and kept: a refusal of the values still records (and audits: a final-split
            # request with a bad string elsewhere counts as an attempt) what the call asked for.
            args, screened, schema = self._parse(request, tool)
            args = cast(dict[str, Any], validate_input(schema, args, strings_screened=screened))
            self._receive(request, ctx, tool, args)
            if tool.idempotent_create and ctx.idempotency_key is not None:
                if not _IDEMPOTENCY_KEY_RE.match(ctx.idempotency_key):
                    raise ApplicationError(
                        "invalid_idempotency_key",
                        f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} visible ASCII characters.",
                    )
                replay = self._replay(ctx, tool, args)
                if replay is not None:
                    return replay
            return self._execute(ctx, tool, args)
        except ApplicationError as exc:
            _record_refusal(ctx, tool, args, exc, request)
            raise
        except TRANSIENT_ERRORS as exc:
            # The database or Redis away for a moment: 503 with Retry-After, and the agent calls
            # again (with its Idempotency-Key). No refusal is recorded: the database may be what is away.
            logger.warning("tool %s: transient fault: %s", tool.name, exc)
            raise service_unavailable_for(exc) from exc
        except DataError as exc:
            # A value the schema allowed but the column cannot hold: the caller's to fix.
            refusal = InvalidInput(f"{tool.name}: a value does not fit its field: {exc}".splitlines()[0])
            _record_refusal(ctx, tool, args, refusal)
            raise refusal from None
        except DjangoValidationError as exc:
            detail = exc.message_dict if hasattr(exc, "error_dict") else {"errors": exc.messages}
            refusal = InvalidInput(f"{tool.name}: the records refused the values: {detail}", fields=detail)
            _record_refusal(ctx, tool, args, refusal)
            raise refusal from None
        except IntegrityError as exc:
            # A database constraint refused the change: a race with another agent or a duplicate.
            refusal = Conflict("conflict", f"{tool.name}: the database refused the change: {exc}".splitlines()[0])
            _record_refusal(ctx, tool, args, refusal)
            raise refusal from None
        except Exception:
            logger.exception("tool %s failed", tool.name)
            _record_refusal(ctx, tool, args, ApplicationError("internal_error", "unhandled error", status=500))
            return _Answer(
                error_body("internal_error", f"{tool.name} failed on the server; the failure is logged."),
                status.HTTP_500_INTERNAL_SERVER_ERROR,
            )

    def _parse(self, request: HttpRequest, tool: Tool) -> tuple[Any, bool, Tool]:
        """The call's arguments as sent — the JSON body here (apps.expos.uploads: the query string) —,
        whether their strings were screened already, and the tool whose schema they answer to."""
        args, screened = parse_body(request)
        return args, screened, tool

    def _receive(self, request: HttpRequest, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> None:
        """What the call sends besides its arguments, read before any replay (an upload's streamed file)."""

    def _request_sha(self, tool: Tool, args: dict[str, Any]) -> str:
        return sha256_text(canonical_json({"tool": tool.name, "arguments": args}))

    def _replay(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> _Answer | None:
        record = IdempotencyRecord.objects.filter(node=ctx.node, key=ctx.idempotency_key).first()
        if record is None:
            return None
        if record.tool != tool.name or record.request_sha256 != self._request_sha(tool, args):
            raise ApplicationError(
                "idempotency_mismatch",
                f"Idempotency-Key {ctx.idempotency_key!r} was used for a different request "
                f"({record.tool}); use a new key for a new request.",
                status=409,
            )
        tool_call_record(
            ctx=ctx, tool=tool.name, arguments=args, status=200, replayed=True, idempotency_key=ctx.idempotency_key
        )
        body = {**record.response, "replayed": True} if isinstance(record.response, dict) else record.response
        harness_turn_record(ctx=ctx, tool=tool.name, arguments=args, status=200, answer=body, replayed=True)
        return _Answer(body, status.HTTP_200_OK, {"Idempotent-Replayed": "true"})

    def _execute(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> _Answer:
        code = status.HTTP_201_CREATED if tool.idempotent_create else status.HTTP_200_OK
        plain = not tool.idempotent_create and tool.etag_node is None
        if plain:

            def success_event(result_ref: str) -> PendingEvent:
                pending = tool_call_event(ctx=ctx, tool=tool.name, arguments=args, status=code, result_ref=result_ref)
                ctx.result_ref, ctx.success_pending = result_ref, pending
                return pending

            ctx.success_event = success_event
            if tool.at_once is not None and self._at_once_allowed(ctx):
                result = tool.at_once(ctx, args)
                if result is not None:
                    return self._at_once_answer(ctx, tool, result, code)
        try:
            with transaction.atomic():
                if tool.idempotent_create and ctx.idempotency_key is not None:
                    self._claim_key(ctx)
                if tool.etag_node is not None and ctx.if_match:
                    node = tool.etag_node(ctx, args)
                    # The row lock makes check-then-write atomic: a concurrent writer with the same
                    # If-Match waits here, then sees the bumped version and gets 412.
                    locked = ResearchNode.objects.select_for_update().get(pk=node.pk)
                    if not etag_matches(ctx.if_match, locked):
                        raise PreconditionFailed(
                            "precondition_failed",
                            f"{locked.handle} changed since you read it (now {etag_value(locked)}); "
                            "read it again and retry with the new ETag.",
                            current_etag=etag_value(locked),
                        )
                    ctx.etag_node = locked
                result = tool.handler(ctx, args)
                problems = output_errors(tool, result)
                if problems:
                    # Our bug, never the caller's: roll back, log loudly, answer 500.
                    logger.error("tool %s returned output violating its schema: %s", tool.name, problems)
                    raise _OutputViolation(problems)
                result_ref = ctx.result_ref or f"sha256:{sha256_text(canonical_json(result))}"
                if tool.idempotent_create and ctx.idempotency_key is not None:
                    with transaction.atomic():
                        IdempotencyRecord.objects.create(
                            node=ctx.node,
                            key=ctx.idempotency_key,
                            tool=tool.name,
                            request_sha256=self._request_sha(tool, args),
                            status_code=code,
                            response=result,
                        )
                if not ctx.recorded:
                    tool_call_record(
                        ctx=ctx,
                        tool=tool.name,
                        arguments=args,
                        status=code,
                        result_ref=result_ref,
                        idempotency_key=ctx.idempotency_key if tool.idempotent_create else None,
                    )
                harness_turn_record(ctx=ctx, tool=tool.name, arguments=args, status=code, answer=result)
                etag_node = ctx.etag_node
                if etag_node is not None:
                    etag_node.refresh_from_db(fields=["version"])
        except IntegrityError:
            if tool.idempotent_create and ctx.idempotency_key is not None:
                # A concurrent retry with the same key committed first: answer with its result.
                replay = self._replay(ctx, tool, args)
                if replay is not None:
                    return replay
            raise
        except _OutputViolation as exc:
            _record_refusal(ctx, tool, args, ApplicationError("internal_error", "output schema violation"))
            return _Answer(
                error_body(
                    "internal_error",
                    f"{tool.name} produced an invalid answer; this is a server bug.",
                    {"problems": exc.problems},
                ),
                status.HTTP_500_INTERNAL_SERVER_ERROR,
            )
        if ctx.shown_once:
            result = {**result, **ctx.shown_once}  # in this answer alone: never stored, never replayed
        return _Answer(result, code, {} if ctx.etag_node is None else {"ETag": etag_value(ctx.etag_node)})

    @staticmethod
    def _claim_key(ctx: ToolContext) -> None:
        """Hold the call's Idempotency-Key for its transaction; a retry while it runs is told so at once.

        A client with a short timeout (an MCP client's 10 s) gives up on a creation whose review runs
        inside the call and retries with the same key: without this the retry ran the whole review
        again beside the first, and timed out too. Now it answers 409 ``in_progress`` (nothing
        written) and a later retry replays the first call's answer once that has committed. A
        transaction-scoped PostgreSQL advisory lock: released at commit or rollback, never left held.
        """
        if connection.vendor != "postgresql":
            return
        digest = hashlib.sha256(f"idempotency:{ctx.node.pk}:{ctx.idempotency_key}".encode()).digest()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [int.from_bytes(digest[:8], "big", signed=True)])
            (claimed,) = cursor.fetchone()
        if not claimed:
            raise ApplicationError(
                "in_progress",
                f"A call with Idempotency-Key {ctx.idempotency_key!r} is still running (its review runs inside the "
                "call). Nothing was done twice: retry with the same key in a few seconds; once the first call has "
                "committed, the retry answers with its result.",
                status=409,
                retry_after_seconds=5,
            )

    @staticmethod
    def _at_once_allowed(ctx: ToolContext) -> bool:
        # Outside any transaction (a test's, say), on PostgreSQL, and not for a run an external
        # harness plays: its call's turn (harness_turn_record) is written in the call's transaction.
        return (
            connection.vendor == "postgresql"
            and not connection.in_atomic_block
            and ctx.run.agent_mode != AgentMode.EXTERNAL
        )

    @staticmethod
    def _at_once_answer(ctx: ToolContext, tool: Tool, result: dict[str, Any], code: int) -> _Answer:
        """The answer of a call its statement committed (Tool.at_once), held to its schema."""
        if not ctx.recorded:
            raise RuntimeError(f"{tool.name}'s at_once answered without writing the call's event")
        problems = output_errors(tool, result)
        if problems:
            # Our bug, as in _execute, but nothing to roll back: the change and its event are one committed statement.
            logger.error("tool %s returned output violating its schema (committed): %s", tool.name, problems)
            return _Answer(
                error_body(
                    "internal_error",
                    f"{tool.name} made its change but produced an invalid answer; this is a server bug.",
                    {"problems": problems},
                ),
                status.HTTP_500_INTERNAL_SERVER_ERROR,
            )
        return _Answer(result, code)


def _unknown_tool(name: str) -> NotFound:
    return NotFound("unknown_tool", f"There is no tool {escape_text(name)[:200]!r}; GET /api/v1/tools lists them.")


class _OutputViolation(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _tool_summary(tool: Tool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "category": tool.category,
        "roles": sorted(tool.roles),
        "description": tool.description,
        "idempotent_create": tool.idempotent_create,
        "if_match": tool.etag_node is not None,
    }


_TOOL_LIST_SCHEMA = {
    "type": "object",
    "properties": {
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "category": {"type": "string"},
                    "roles": {"type": "array", "items": {"type": "string"}},
                    "description": {"type": "string"},
                    "idempotent_create": {"type": "boolean"},
                    "if_match": {"type": "boolean"},
                },
                "required": ["name", "category", "roles", "description", "idempotent_create", "if_match"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["tools"],
    "additionalProperties": False,
}
_DEFINITIONS_SCHEMA = {
    "type": "object",
    "properties": {
        "role": {"type": "string"},
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "description": {"type": "string"},
                            "parameters": {"type": "object"},
                        },
                        "required": ["name", "description", "parameters"],
                    },
                },
                "required": ["type", "function"],
            },
        },
    },
    "required": ["role", "tools"],
    "additionalProperties": False,
}


class ToolListView(APIView):
    """GET /api/v1/tools: the tools (an agent sees those of its own role)."""

    authentication_classes = [AgentTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_classes = [AgentTokenRateThrottle]

    @extend_schema(responses={200: _TOOL_LIST_SCHEMA}, operation_id="tools_list")
    def get(self, request: Request) -> Response:
        token = agent_token_of(request)
        if token is None and not is_human_viewer(request.user):
            raise ApplicationError("forbidden_role", "Viewing tools needs the viewer group.", status=403)
        tools = tools_for_role(token.role) if token is not None else [t for _, t in sorted(load_all().items())]
        return Response({"tools": [_tool_summary(t) for t in tools]})


class ToolDefinitionsView(APIView):
    """GET /api/v1/tools/definitions?role=worker: OpenAI-style function definitions for one role."""

    authentication_classes = [AgentTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_classes = [AgentTokenRateThrottle]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "role",
                str,
                enum=sorted(Role.ALL_AGENTS),
                required=False,
                description="Required for people; an agent gets its own role's.",
            )
        ],
        responses={200: _DEFINITIONS_SCHEMA},
        operation_id="tools_definitions",
    )
    def get(self, request: Request) -> Response:
        role = request.query_params.get("role")
        token = agent_token_of(request)
        if token is not None:
            if role not in (None, token.role):
                raise ApplicationError(
                    "forbidden_role", f"This token acts as {token.role}; it gets that role's definitions.", status=403
                )
            role = token.role
        elif not is_human_viewer(request.user):
            raise ApplicationError("forbidden_role", "Viewing tools needs the viewer group.", status=403)
        if role not in Role.ALL_AGENTS:
            raise InvalidInput(f"role must be one of {sorted(Role.ALL_AGENTS)}.", path="role")
        return Response({"role": role, "tools": [t.definition() for t in tools_for_role(role)]})


def _wants_json(request: Any) -> bool:
    return request.path.startswith("/api/")


def not_found(request: Any, exception: Exception | None = None) -> Any:
    """handler404: JSON under /api/, the usual page elsewhere."""
    if _wants_json(request):
        return JsonResponse(error_body("not_found", f"No endpoint at {request.path}."), status=404)
    return page_not_found(request, exception)


def server_error(request: Any) -> Any:
    """handler500: JSON under /api/, the usual page elsewhere."""
    if _wants_json(request):
        return JsonResponse(error_body("internal_error", "The server failed; the failure is logged."), status=500)
    return default_server_error(request)
