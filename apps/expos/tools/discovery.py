"""The 22 external discovery tools (DESIGN.md "External discovery"), declared from the connectors.

``apps.expos.connectors.build_connectors`` owns the tools' behaviour and schemas; this module
only puts them into the registry, open to every agent role, and adds what the Experiment OS
knows and the connectors must not: the configuration from Django settings / the environment,
and the calling Worker's workspace, which ``hf_download_dataset`` / ``hf_materialize_dataset``
write into. Agents never name a workspace themselves, so no agent can write into another's
folder or into the datapool; found data enters training only through ``worker_add_data``.

Every answer passes the sealed-item screen (``apps.expos.screening``) before it leaves, whichever
connector gave it: rows, cards, pages, search results and files matching a sealed evaluation
item are withheld (listed in ``withheld``) and the read is recorded.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.core.errors import ApplicationError
from apps.expos.connectors import TOOL_NAMES, ConnectorConfig, ConnectorError, ToolSpec, build_connectors
from apps.expos.registry import Category, Role, ToolContext, tool
from apps.expos.screening import WITHHELD_SCHEMA, screened_answer
from apps.expos.workspaces import workspace_path

# Tools that write files: ExpOS fills their ``workspace`` argument with the caller's folder.
WORKSPACE_TOOLS = frozenset({"hf_download_dataset", "hf_materialize_dataset"})

# Connector failures are 4xx: a tool that is switched off or whose service is down is a fact
# about the deployment the agent must route around, not a fault of this server, and an agent
# (or schemathesis) must be able to tell it from a crash. 424 = "a dependency failed".
CONNECTOR_STATUS = {
    "bad_request": 400,
    "forbidden_address": 403,
    "not_found": 404,
    "not_configured": 424,
    "unreachable": 424,
    "upstream_error": 424,
}
CONNECTOR_ERRORS = tuple(CONNECTOR_STATUS)


def connector_config() -> ConnectorConfig:
    """The connectors' configuration: ``RSI_*`` variables, then the site's defaults.

    Without any hf_* variable the local catalog of the minibench serves the ``hf_*`` contract
    (offline, deterministic). A settings dict ``RSI_CONNECTORS`` (field -> value) may override
    any field, for sites that configure Django rather than the environment.
    """
    config = ConnectorConfig.from_env(os.environ)
    changes: dict[str, Any] = {
        # Always the Experiment OS's own roots, whatever the environment says: the connectors use
        # them only to refuse writes outside a workspace or into the datapool.
        "workspace_root": str(Path(settings.WORKSPACE_ROOT).resolve()),
        "datapool_root": str(Path(settings.ARTIFACT_ROOT).resolve()),
    }
    if config.hf_provider is None:
        changes["hf_provider"] = "local"
        changes["local_catalog_dir"] = str(Path(settings.MINIBENCH_ROOT) / "catalog")
    elif config.hf_provider == "local" and not config.local_catalog_dir:
        changes["local_catalog_dir"] = str(Path(settings.MINIBENCH_ROOT) / "catalog")
    changes.update(getattr(settings, "RSI_CONNECTORS", None) or {})
    return dataclasses.replace(config, **changes)


def connector_tools() -> dict[str, ToolSpec]:
    """The 22 tool specs under the current configuration (cheap: connectors open nothing until called)."""
    return build_connectors(connector_config())


def discovery_call(*, ctx: ToolContext, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one discovery tool for ``ctx``; connector errors become JSON errors with a 4xx status."""
    spec = connector_tools()[name]
    call_args = dict(args)
    if name in WORKSPACE_TOOLS:
        # Raises for Main Agents and Reviewers: only Workers have a workspace to write into.
        call_args["workspace"] = str(workspace_path(run=ctx.run, node=ctx.node))
    try:
        answer = spec.call(call_args)
    except ConnectorError as exc:
        raise ApplicationError(exc.code, exc.message, status=CONNECTOR_STATUS[exc.code]) from None
    screened, withheld = screened_answer(ctx, tool=name, arguments=args, answer=answer)
    return {**screened, "withheld": withheld}


def _agent_schema(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema agents see: the workspace is ExpOS's to fill, never the agent's to name."""
    if name not in WORKSPACE_TOOLS:
        return schema
    schema = copy.deepcopy(schema)
    schema["properties"].pop("workspace", None)
    schema["required"] = [key for key in schema.get("required", []) if key != "workspace"]
    return schema


def _agent_output(schema: dict[str, Any]) -> dict[str, Any]:
    """The connector's output schema plus the screen's list of withheld parts."""
    return {
        **schema,
        "properties": {**schema.get("properties", {}), "withheld": WITHHELD_SCHEMA},
        "required": [*schema.get("required", []), "withheld"],
    }


def _description(name: str, spec: ToolSpec) -> str:
    text = f"{spec.description} Service: {spec.service}."
    if name in WORKSPACE_TOOLS:
        text += " Writes into your Worker workspace; register the result with worker_add_data."
    return text


def _declare(name: str, spec: ToolSpec) -> None:
    def handler(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        return discovery_call(ctx=ctx, name=name, args=args)

    handler.__name__ = name
    handler.__doc__ = spec.description
    tool(
        name,
        category=Category.DISCOVERY,
        roles=Role.ALL_AGENTS,
        description=_description(name, spec),
        input_schema=_agent_schema(name, spec.input_schema),
        output_schema=_agent_output(spec.output_schema),
        errors=CONNECTOR_ERRORS + ("seal_broken",) + (("no_workspace",) if name in WORKSPACE_TOOLS else ()),
    )(handler)


def _declare_all() -> None:
    # Schemas and descriptions do not depend on configuration, so declaring from the current one
    # is exact; each call builds the connectors afresh and so follows configuration changes.
    specs = connector_tools()
    for name in TOOL_NAMES:
        _declare(name, specs[name])


_declare_all()
