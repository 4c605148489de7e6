"""JSON text read without recursion: nesting capped, and a JSON-RPC message's parts found in text that
cannot be parsed.

Python's ``json`` module recurses once per level of nesting, so a 10^5-deep body raises
RecursionError, and a caller that does not expect it answers 500 and records nothing. Bodies cut
at a size limit, or not UTF-8, cannot be parsed at all. Both the REST view (apps/expos/views.py) and
the MCP bridge (apps/expos/mcp_server.py) still have to refuse such a request *and record it*, so
they read what they need from the bytes with one flat scan: brackets, strings and scalars as
tokens, depth as a counter.

Works on bytes: ``"``, ``\\`` and brackets are ASCII, and no byte of a multi-byte UTF-8 sequence
is ASCII, so invalid UTF-8 never misleads the scan. Only the standard library is imported: the MCP
bridge runs on a harness's host without Django.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# A string (its closing quote may be missing where the text was cut), a bracket, a colon or comma, or
# a run of anything else (numbers, literals, garbage). Whitespace is skipped.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}:,]|[^\s"\[\]{}:,]+', re.S)
_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")


def _tokens(raw: bytes) -> Iterator[re.Match[bytes]]:
    return _TOKEN.finditer(raw)


def cap_depth(raw: bytes, keep: int) -> bytes:
    """``raw`` with every array or object nested deeper than ``keep`` levels replaced by ``[]``.

    The result nests at most ``keep + 1`` levels, so ``json.loads`` reads it without recursing
    deep, and a check that refuses nesting beyond ``keep`` finds the first too-deep value at the
    same path as in ``raw``. A subtree that is never closed is cut (the result is then no JSON).
    """
    out: list[bytes] = []
    last = depth = 0
    skip_from: int | None = None
    for match in _tokens(raw):
        first = match.group()[0]
        if first in _OPEN:
            depth += 1
            if depth == keep + 1 and skip_from is None:
                skip_from = match.start()
        elif first in _CLOSE:
            if depth == keep + 1 and skip_from is not None:
                out += [raw[last:skip_from], b"[]"]
                last, skip_from = match.end(), None
            depth -= 1
    if skip_from is not None:
        out += [raw[last:skip_from], b"[]"]
    else:
        out.append(raw[last:])
    return b"".join(out)


def loads_capped(raw: bytes | str, keep: int) -> Any:
    """``json.loads`` that never raises RecursionError: too-deep text is read through :func:`cap_depth`.

    Text of many levels is read as it is; only when Python's recursion limit stops the parser is
    it read again with nesting beyond ``keep`` levels cut (ValueError as usual if that is no JSON).
    """
    try:
        return json.loads(raw)
    except RecursionError:
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
        return json.loads(cap_depth(data, keep).decode("utf-8", "surrogatepass"))


def nesting_exceeds(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` nests arrays and objects more than ``limit`` levels deep (strings ignored)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # cannot: too few brackets (the common case, without a scan)
    depth = 0
    for match in _tokens(raw):
        first = match.group()[0]
        if first in _OPEN:
            depth += 1
            if depth > limit:
                return True
        elif first in _CLOSE:
            depth -= 1
    return False


@dataclass(frozen=True)
class RpcParts:
    """What a JSON-RPC request names, read from its text: enough to answer it and to find its tool."""

    id: int | str | None = None
    method: str | None = None
    name: str | None = None  # params.name: the tool of a tools/call
    arguments: tuple[int, int] | None = None  # the span of params.arguments in the text
    has_id: bool = False


def _decoded(token: bytes) -> Any:
    try:
        return json.loads(token.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None


def rpc_parts(raw: bytes) -> RpcParts:
    """The id, method, tool name and the arguments' span of a JSON-RPC request, from its bytes.

    Tolerates what a parser refuses: text cut anywhere, too-deep nesting, invalid UTF-8 and
    garbage between the parts. A part that cannot be read is None (``has_id`` tells a missing id
    from ``null``). Keys are only taken at their own level: ``name`` inside the arguments is not
    the tool's name.
    """
    found: dict[str, Any] = {}
    depth = 0
    key: bytes | None = None  # the key whose value comes next, in the message or in its params
    expect_key = in_params = False
    args_start: int | None = None
    for match in _tokens(raw):
        token = match.group()
        first = token[0]
        if args_start is not None:
            # Inside params.arguments: only where it ends matters.
            if first in _OPEN:
                depth += 1
            elif first in _CLOSE:
                depth -= 1
                if depth == 2:
                    found["arguments"] = (args_start, match.end())
                    args_start = None
            continue
        if first in _OPEN:
            depth += 1
            if depth == 3 and in_params and key == b"arguments":
                args_start = match.start()
                found["arguments"] = (args_start, len(raw))  # until it is closed
            elif depth == 1 or (depth == 2 and key == b"params"):
                in_params = depth == 2
                expect_key, key = True, None
            else:
                expect_key, key = False, None  # any other container: skipped
            continue
        if first in _CLOSE:
            depth -= 1
            in_params = in_params and depth >= 2
            expect_key, key = False, None
            continue
        if not (depth == 1 or (depth == 2 and in_params)):
            continue
        if first == ord(":"):
            expect_key = False
        elif first == ord(","):
            expect_key, key = True, None
        elif expect_key and first == ord('"'):
            key = token[1:-1]
        elif key is not None:
            value = _decoded(token)
            where = key if depth == 1 else b"params." + key
            if where == b"id":
                found["has_id"] = True
                found["id"] = value if isinstance(value, int | str) and not isinstance(value, bool) else None
            elif where == b"method" and isinstance(value, str):
                found["method"] = value
            elif where == b"params.name" and isinstance(value, str):
                found["name"] = value
            elif where == b"params.arguments":
                found["arguments"] = (match.start(), match.end())  # a scalar: REST refuses it
            key = None
    return RpcParts(**found)


# The id as the last member of a message (where the MCP SDK's client writes it), at its very end.
_TAIL_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,20}|"[^"\\]{0,200}")\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')


def tail_id(tail: bytes) -> int | str | None:
    """The id of a message cut at a size limit, read from its last bytes where it ends the message."""
    match = _TAIL_ID.search(tail)
    if match is None:
        return None
    value = _decoded(match.group(1))
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None
