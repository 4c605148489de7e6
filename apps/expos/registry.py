"""The ExpOS tool registry: the single source of truth for every agent-facing tool.

A tool is declared once, here or in ``apps/expos/tools/*.py`` with :func:`tool`. The REST
endpoints (POST /api/v1/tools/<name>), the OpenAPI schema, the LLM tool definitions per role,
the ``expos`` CLI and docs/tools.md are all generated from these declarations (DESIGN.md).

Schemas are JSON Schema dicts. Input and output objects are *closed*
(``additionalProperties: false``) so schema checks mean something.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apps.experiments.events import PendingEvent
    from apps.expos.models import AgentToken
    from apps.research.models import ResearchNode, Run


class Role:
    MAIN = "main"
    WORKER = "worker"
    REVIEWER = "reviewer"
    ALL_AGENTS = frozenset({MAIN, WORKER, REVIEWER})


class Category:
    DATA = "data_management"
    EXECUTION = "execution_state"
    RESEARCH = "research_evidence"
    REVIEW = "review_management"
    DISCOVERY = "external_discovery"
    OURS = "rsiweb"


@dataclass
class ToolContext:
    """Who is calling: resolved from the bearer token before the handler runs.

    Handlers may set ``result_ref`` ("experiment:<uuid>") for the call's event, and
    ``etag_node`` to the research node whose version the response's ETag should carry, or record
    their successful call themselves (``success_event``).
    """

    run: Run
    node: ResearchNode
    role: str
    idempotency_key: str | None = None
    if_match: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    token: AgentToken | None = None
    result_ref: str = ""
    etag_node: ResearchNode | None = None
    # Set by the view for a plain (not idempotent-create, not If-Match) call: a handler may write
    # the call's ``tool.called`` event itself, in the statement that makes its change, so both
    # reach the database in one round trip (experiment_log_metrics). ``success_event(result_ref)``
    # is exactly the event the view would append after the handler, unwritten; once the handler
    # has written it (PendingEvent.written), the view does not append another.
    success_event: Callable[[str], PendingEvent] | None = None
    success_pending: PendingEvent | None = None
    # Fields the view adds to this call's live answer only, after storing what is kept of it
    # (the idempotency record, the transcript turn): a secret shown once, such as a new node's token.
    shown_once: dict[str, Any] = field(default_factory=dict)

    @property
    def recorded(self) -> bool:
        """The handler wrote its call's success event itself."""
        return self.success_pending is not None and self.success_pending.written

    @property
    def actor(self) -> str:
        """The name events record for this caller (its node handle: main, worker_0002...)."""
        return self.node.handle


# ToolContext.extra's key for the file a streamed upload was received into (Tool.stream_schema).
STREAMED_FILE = "streamed_file"

Handler = Callable[[ToolContext, dict[str, Any]], dict[str, Any]]
# A tool's common call done in one statement that is its own transaction (Tool.at_once): its
# answer, or None to leave the call to the handler in a transaction.
AtOnceHandler = Callable[[ToolContext, dict[str, Any]], "dict[str, Any] | None"]
# Names the research node a call mutates, so the view can hold it to the caller's If-Match.
EtagTarget = Callable[[ToolContext, dict[str, Any]], "ResearchNode"]
# Called with the arguments of a refused call (bad JSON values, schema errors, a handler's 400), so a
# refusal for one reason can still record the audit evidence the same request carried for another.
RefusalAudit = Callable[[ToolContext, dict[str, Any]], None]


@dataclass(frozen=True)
class Tool:
    name: str
    category: str
    roles: frozenset[str]
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    handler: Handler
    # Tools that create records accept an Idempotency-Key; a retried call replays the answer.
    idempotent_create: bool = False
    errors: tuple[str, ...] = ()  # stable error codes this tool may answer with, for the docs
    # Tools that change a mutable DAG node honour If-Match against that node's version (412 on
    # a stale version) — concurrent agents then retry instead of silently overwriting.
    etag_node: EtagTarget | None = None
    # Tools whose arguments may carry an attempt the audit must count even when the call is refused
    # for something else (worker_submit: a sealed-split request wrapped in a malformed value).
    audit_refused: RefusalAudit | None = None
    # What a refused call of this tool sets off besides its record, called after the refusal's
    # event is appended, in the same transaction (the spawn tools: the guidance their decision
    # applied is re-announced as not carried out). The recorder itself calls nothing.
    after_refusal: RefusalAudit | None = None
    # The common call without a transaction around it (PostgreSQL): one statement makes the change
    # and writes the call's success event (ctx.success_event), refusing itself (and so rolling both
    # back) where the handler would refuse. None from it hands the call to ``handler`` in a
    # transaction, as for any tool. The view offers it only plain calls (no Idempotency-Key
    # replay, no If-Match) outside external-harness runs, whose turns are recorded with the call.
    at_once: AtOnceHandler | None = None
    # A tool that also takes a file streamed as the body of POST /api/v1/tools/<name>/upload
    # (apps.expos.uploads): the schema of its other arguments, sent as the query string. The
    # handler finds the received file in ``ctx.extra[STREAMED_FILE]``.
    stream_schema: dict[str, Any] | None = None

    def definition(self) -> dict[str, Any]:
        """The OpenAI-style function definition given to an LLM agent."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }


REGISTRY: dict[str, Tool] = {}


def obj(properties: dict[str, Any] | None = None, *, required: list[str] | None = None) -> dict[str, Any]:
    """A closed JSON-Schema object."""
    return {
        "type": "object",
        "properties": properties or {},
        "required": required or [],
        "additionalProperties": False,
    }


def tool(
    name: str,
    *,
    category: str,
    roles: frozenset[str] | set[str],
    description: str,
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    idempotent_create: bool = False,
    errors: tuple[str, ...] = (),
    etag_node: EtagTarget | None = None,
    audit_refused: RefusalAudit | None = None,
    after_refusal: RefusalAudit | None = None,
    at_once: AtOnceHandler | None = None,
    stream_schema: dict[str, Any] | None = None,
) -> Callable[[Handler], Handler]:
    """Declare a tool; the decorated function is its handler ``(ctx, args) -> result``."""

    def register(handler: Handler) -> Handler:
        if name in REGISTRY:
            raise RuntimeError(f"tool {name!r} is declared twice")
        REGISTRY[name] = Tool(
            name=name,
            category=category,
            roles=frozenset(roles),
            description=description,
            input_schema=input_schema or obj(),
            output_schema=_with_replayed(output_schema) if idempotent_create else output_schema or {"type": "object"},
            handler=handler,
            idempotent_create=idempotent_create,
            errors=errors,
            etag_node=etag_node,
            audit_refused=audit_refused,
            after_refusal=after_refusal,
            at_once=at_once,
            stream_schema=stream_schema,
        )
        return handler

    return register


REPLAYED = {
    "type": "boolean",
    "description": "true when this is the stored answer of an earlier call with the same Idempotency-Key: nothing "
    "new was created, and the fields are as they were then (read the record again for its current state).",
}


def _with_replayed(schema: dict[str, Any] | None) -> dict[str, Any]:
    """A creating tool's answer says in its body whether it is a replay (a copy: schemas are shared)."""
    schema = schema or {"type": "object"}
    if schema.get("type") != "object" or "properties" not in schema:
        return schema
    return {**schema, "properties": {**schema["properties"], "replayed": REPLAYED}}


def tools_for_role(role: str) -> list[Tool]:
    """Every tool the role may call, in a stable order (the LLM definitions and the CLI use it)."""
    return [t for name, t in sorted(load_all().items()) if role in t.roles]


_loaded = False


def load_all() -> dict[str, Tool]:
    """Import every tool module so their declarations run; returns the registry.

    The modules are imported once per process; later calls (one per API request) only return it.
    """
    global _loaded
    if _loaded:
        return REGISTRY
    # The tool modules import this one (for @tool): a package-level import here would be a cycle.
    from apps.expos import tools  # noqa: PLC0415 - import cycle (tools import the registry)

    for module in pkgutil.iter_modules(tools.__path__):
        importlib.import_module(f"apps.expos.tools.{module.name}")
    _loaded = True
    return REGISTRY
