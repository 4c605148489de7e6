"""``expos``: the Experiment OS as a command line, for agents that have a shell (Claude Code, Codex).

Every tool is a subcommand, generated from the registry: the CLI asks the server for the tool
definitions of its token's role (GET /api/v1/tools/definitions) and turns each tool's input
schema into flags, so the CLI can never drift from the server it talks to. Usage::

    export RSI_URL=http://127.0.0.1:8000 RSI_TOKEN=<agent token>
    expos tools                                   # the tools this token may call
    expos public_check_quota
    expos events_tail --limit 20 --types tool.called --types job.succeeded
    expos worker_finalize --summary "..." --experiments exp_0001 --if-match '"<etag>"'
    expos main_optimizer_update --json '{"claims": [{"key": "lr", "text": "..."}]}'
    expos reviewer_submit_review --json @report.json
    expos worker_add_data --file rows.jsonl --generator "gen.py" --idempotency-key rows-v1
    expos mcp                                     # the same tools as an MCP server on stdio

Answers are printed as JSON on stdout. A refusal prints the error JSON on stderr, its message on
the last line, and exits 1; a transport or usage problem exits 2. Only the standard library is
used, so the CLI runs anywhere Python does — on purpose away from the sealed data and the
artifact store (docs/expos-cli.md); only ``expos mcp`` needs more (the ``mcp`` SDK and httpx):
it serves the token's tools to a harness that launches an MCP server (docs/harnesses.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_SECONDS = 120
# A tool whose input has these takes ``--file PATH`` (worker_add_data: data the agent made).
UPLOAD_FIELDS = {"content", "sha256", "size_bytes"}
# A file over the content bound is streamed as the body of the tool's upload endpoint instead
# (apps.expos.uploads), its other arguments in the query string.
STREAM_ARGUMENT = "_stream_file"


class CliError(Exception):
    def __init__(self, message: str, *, code: int, body: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.body = body


def request(
    method: str, url: str, token: str, *, body: Any = None, headers: dict[str, str] | None = None, file: Any = None
) -> Any:
    """One HTTP call; returns the decoded JSON answer or raises CliError with the server's message.

    ``file``: an open binary file sent as the body as it is read (its Content-Length in ``headers``).
    """
    data = file if file is not None else None if body is None else json.dumps(body).encode("utf-8")
    all_headers = {"Accept": "application/json", **(headers or {})}
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    if data is not None and file is None:
        all_headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=all_headers)  # noqa: S310 - URL is the user's
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            payload = json.loads(raw)
            message = payload.get("error", {}).get("message") or raw.decode("utf-8", "replace")
        except (ValueError, AttributeError):
            payload, message = None, raw.decode("utf-8", "replace")[:500]
        raise CliError(f"HTTP {exc.code}: {message}", code=1, body=payload) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise CliError(f"cannot reach {url}: {exc}", code=2) from None
    return json.loads(raw) if raw else None


def _flag_type(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return {"integer": int, "number": float, "string": str}.get(kind or "", _json_or_text)


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _kind(schema: dict[str, Any]) -> str:
    """A schema's type as help shows it: integer, string, object, array of string, one of a|b."""
    if "enum" in schema:
        return "one of " + "|".join(str(v) for v in schema["enum"])
    if "const" in schema:
        return f"exactly {schema['const']!r}"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_kind(schema['items'])}"
    return str(kind)


def schema_summary(schema: dict[str, Any]) -> str:
    """The type, bounds and default of a schema, in one line: 'integer, 1..200, default 50'."""
    parts = [_kind(schema)]
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        parts.append(f"> {schema['exclusiveMinimum']}" + ("" if high is None else f", <= {high}"))
    elif low is not None or high is not None:
        parts.append(f"{'' if low is None else low}..{'' if high is None else high}")
    for low_key, high_key, unit in (("minLength", "maxLength", "characters"), ("minItems", "maxItems", "items")):
        low, high = schema.get(low_key), schema.get(high_key)
        if high is not None:
            parts.append(f"{low or 0}-{high:,} {unit}")
        elif low:
            parts.append(f"at least {low} {unit}")
    if schema.get("uniqueItems"):
        parts.append("unique")
    if "pattern" in schema:
        parts.append(f"pattern {schema['pattern']}")
    if "default" in schema:
        parts.append(f"default {json.dumps(schema['default'])}")
    return ", ".join(parts)


def _nested(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema whose fields a flag's help lists: the value's own, or its items'."""
    if isinstance(schema.get("properties"), dict):
        return schema
    items = schema.get("items")
    if isinstance(items, dict) and isinstance(items.get("properties"), dict):
        return items
    return None


def schema_fields(schema: dict[str, Any], indent: str = "  ", depth: int = 0) -> list[str]:
    """The fields of an object schema, one a line with type, bounds, default and whether required;
    nested objects indented under their field (up to four levels)."""
    required = set(schema.get("required", []))
    lines: list[str] = []
    for name, field in schema.get("properties", {}).items():
        if not isinstance(field, dict):
            continue
        note = " (required)" if name in required else ""
        description = f": {field['description']}" if field.get("description") else ""
        lines.append(f"{indent}{name} [{schema_summary(field)}]{note}{description}")
        inner = _nested(field)
        if inner is not None and depth < 3:
            lines += schema_fields(inner, indent + "    ", depth + 1)
    return lines


def _epilog(parameters: dict[str, Any]) -> str:
    """The fields of the tool's object-valued flags (from the same schema the server validates with)."""
    sections = []
    for name, schema in parameters.get("properties", {}).items():
        inner = _nested(schema) if isinstance(schema, dict) else None
        if inner is not None:
            what = "each item" if inner is not schema else "the object"
            lines = schema_fields(inner)
            sections.append(f"--{name.replace('_', '-')} JSON: {what} has these fields\n" + "\n".join(lines))
    return "\n\n".join(sections)


def tool_parser(definition: dict[str, Any], prog: str) -> argparse.ArgumentParser:
    """An argparse parser whose flags are the tool's input-schema properties; object-valued flags
    list their fields (types, bounds, defaults) after the flags."""
    function = definition["function"]
    parameters = function.get("parameters", {})
    required = set(parameters.get("required", []))
    parser = argparse.ArgumentParser(
        prog=f"{prog} {function['name']}",
        description=textwrap.fill(function["description"], 100),
        epilog=_epilog(parameters) or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--json",
        dest="_json",
        metavar="JSON",
        help="all arguments as a JSON object ('-' reads stdin, '@file' reads a file); flags override",
    )
    parser.add_argument("--idempotency-key", dest="_idempotency_key", help="makes a create safe to retry")
    parser.add_argument("--if-match", dest="_if_match", help="the ETag you read; a stale one gets 412")
    if set(parameters.get("properties", {})) >= UPLOAD_FIELDS:
        limit = parameters["properties"]["content"].get("maxLength") or 0
        parser.add_argument(
            "--file",
            dest="_file",
            metavar="PATH",
            help="upload this file with its sha256 and size_bytes (name: its stem): up to "
            f"{limit:,} bytes as content, a larger one streamed as the body of POST "
            f"/api/v1/tools/{function['name']}/upload",
        )
        parser.set_defaults(_inline_limit=limit)
    for name, schema in parameters.get("properties", {}).items():
        flags = sorted({f"--{name.replace('_', '-')}", f"--{name}"})
        described = f"{schema['description']} " if schema.get("description") else ""
        help_text = f"{described}[{schema_summary(schema)}]" + (" (required)" if name in required else "")
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        kind = schema.get("type")
        if kind == "boolean":
            parser.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif (
            kind == "array"
            and isinstance(schema.get("items"), dict)
            and schema["items"].get("type") in ("string", "integer", "number")
        ):
            parser.add_argument(
                *flags,
                dest=name,
                action="append",
                type=_flag_type(schema["items"]),
                default=None,
                help=help_text + " (repeat the flag for several)",
            )
        else:
            parser.add_argument(*flags, dest=name, type=_flag_type(schema), default=None, help=help_text)
    return parser


def _load_json_argument(value: str) -> Any:
    if value == "-":
        return json.load(sys.stdin)
    if value.startswith("@"):
        with open(value[1:], encoding="utf-8") as handle:
            return json.load(handle)
    return json.loads(value)


def arguments_from(namespace: argparse.Namespace) -> dict[str, Any]:
    values = vars(namespace)
    args: dict[str, Any] = {}
    if values.get("_json"):
        loaded = _load_json_argument(values["_json"])
        if not isinstance(loaded, dict):
            raise CliError("--json must be a JSON object", code=2)
        args.update(loaded)
    if values.get("_file"):
        args.update(_file_upload(values["_file"], inline_limit=values.get("_inline_limit") or 0))
    for name, value in values.items():
        if not name.startswith("_") and value is not None:
            args[name] = value
    return args


def _file_upload(path: str, *, inline_limit: int) -> dict[str, Any]:
    """A file as an upload's arguments: its text, and the sha256 and size of its bytes.

    A file of more than ``inline_limit`` bytes (the tool's content bound) is not read into the
    arguments: they carry its digest and size, and the call streams it (_streamed_call).
    """
    stem = os.path.splitext(os.path.basename(path))[0]
    size = os.path.getsize(path)
    if size > inline_limit:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        return {"sha256": digest.hexdigest(), "size_bytes": size, "name": stem, STREAM_ARGUMENT: path}
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text (byte {exc.start + 1})", code=2) from None
    return {"content": content, "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data), "name": stem}


def _streamed_call(url: str, token: str, args: dict[str, Any], path: str, headers: dict[str, str]) -> Any:
    """The upload endpoint's call: the file as the body, read as it is sent; the arguments in the query."""
    query = urllib.parse.urlencode({key: value for key, value in args.items() if key != "content"})
    with open(path, "rb") as handle:
        sent = {**headers, "Content-Type": "application/x-ndjson", "Content-Length": str(args["size_bytes"])}
        return request("POST", f"{url}?{query}", token, headers=sent, file=handle)


MCP_HELP = """usage: expos mcp

Serve this token's Experiment OS tools as an MCP server on stdin/stdout (for harnesses that launch a
command: Codex's `command`, Claude Code's "type": "stdio"). Reads RSI_URL and RSI_TOKEN (or --url and
--token before `mcp`). Needs the `mcp` SDK and httpx; docs/harnesses.md."""


def _public_help(base: str, tool: str, prog: str) -> int:
    """``expos <tool> --help`` without a token: the flags from the server's public OpenAPI document."""
    try:
        document = request("GET", f"{base}/schema/?format=json", "")
        operation = document["paths"][f"/api/v1/tools/{tool}"]["post"]
    except CliError as exc:
        _say(f"expos: {exc}", sys.stderr)
        return exc.code
    except (KeyError, TypeError):
        _say(f"expos: no tool {tool!r} on this server (with a token, 'expos tools' lists yours)", sys.stderr)
        return 2
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    definition = {"function": {"name": tool, "description": operation["description"], "parameters": schema}}
    try:
        tool_parser(definition, prog).parse_args(["--help"])
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


def _print(value: Any, stream: Any = None) -> None:
    _say(json.dumps(value, indent=2, ensure_ascii=False), stream or sys.stdout)


def _say(text: str, stream: Any = None) -> None:
    (stream or sys.stdout).write(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="expos",
        description="Call Experiment OS tools. 'expos tools' lists them; 'expos <tool> --help' shows a tool's flags.",
    )
    parser.add_argument("--url", default=os.environ.get("RSI_URL", DEFAULT_URL), help="server (env RSI_URL)")
    parser.add_argument("--token", default=os.environ.get("RSI_TOKEN"), help="agent token (env RSI_TOKEN)")
    parser.add_argument("tool", help="a tool name, 'tools' to list them, or 'mcp' to serve them over MCP (stdio)")
    # Everything after the tool name is the tool's own flags (a tool may have --url of its own).
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parsed = parser.parse_args(argv)
    rest = parsed.rest
    wants_help = bool({"-h", "--help"} & set(rest))
    if parsed.tool == "mcp" and wants_help:
        _say(MCP_HELP)
        return 0
    if not parsed.token:
        if wants_help and parsed.tool != "tools":
            return _public_help(parsed.url.rstrip("/") + "/api/v1", parsed.tool, parser.prog)
        _say("expos: set RSI_TOKEN (or --token) to your agent token", sys.stderr)
        return 2
    if parsed.tool == "mcp":
        # Imported here: the SDK is a dependency of this subcommand alone (the rest is stdlib).
        from apps.expos.mcp_server import run_stdio  # noqa: PLC0415 - optional dependency

        run_stdio(url=parsed.url, token=parsed.token)
        return 0
    base = parsed.url.rstrip("/") + "/api/v1"
    try:
        if parsed.tool == "tools":
            listing = request("GET", f"{base}/tools", parsed.token)
            for item in listing["tools"]:
                _say(f"{item['name']:<40} {item['description']}")
            return 0
        definitions = request("GET", f"{base}/tools/definitions", parsed.token)["tools"]
        by_name = {d["function"]["name"]: d for d in definitions}
        if parsed.tool not in by_name:
            raise CliError(
                f"unknown tool {parsed.tool!r} for this token's role ({definitions and 'see: expos tools'})", code=2
            )
        namespace = tool_parser(by_name[parsed.tool], parser.prog).parse_args(rest)
        args = arguments_from(namespace)
        headers = {}
        if namespace._idempotency_key:
            headers["Idempotency-Key"] = namespace._idempotency_key
        if namespace._if_match:
            headers["If-Match"] = namespace._if_match
        url = f"{base}/tools/{urllib.parse.quote(parsed.tool)}"
        streamed = args.pop(STREAM_ARGUMENT, None)
        if streamed is not None:
            _print(_streamed_call(f"{url}/upload", parsed.token, args, streamed, headers))
            return 0
        _print(request("POST", url, parsed.token, body=args, headers=headers))
        return 0
    except CliError as exc:
        if exc.body is not None:
            _print(exc.body, sys.stderr)
        _say(f"expos: {exc}", sys.stderr)
        return exc.code
    except (ValueError, OSError) as exc:
        _say(f"expos: {exc}", sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
