"""Every MCP request refused before its tool runs is answered with the API's stable code and recorded once.

Issue 33 (item 11): a lone surrogate or a non-ASCII idempotency key made the MCP bridge fail before
it called REST (no record, a bare Python error; over stdio no answer at all), a 10^5-deep body
answered 500, and an SSE stream stayed open for any ``Bearer x``. The variants are generated per
class from seeds; each is sent over both transports, through the SDK's own client where it can
carry the request and as raw JSON-RPC where it cannot (a lone surrogate, invalid UTF-8 and deep
nesting do not survive the SDK's serialiser), and each must leave exactly one ``tool.called``
event whose error is the code the agent was answered with.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from django.conf import settings
from mcp import ClientSession

from apps.core.jsonsafe import MAX_DEPTH
from apps.experiments.models import Event
from apps.expos.jsontext import cap_depth, loads_capped, nesting_exceeds, rpc_parts, tail_id
from apps.expos.mcp_server import IDEMPOTENCY_ARGUMENT, MAX_ARGUMENT_DEPTH, MCP_PATH, header_value
from apps.integrity.models import BlockedAttempt
from apps.research.models import Candidate
from tests.support.mcp_client import RawStdio, mcp_session, raw_http

SEEDS = (11, 12)
PROPOSE = "worker_propose_candidate"


@dataclass
class Variant:
    """One request of an attack class: sent by the SDK (``arguments``) or raw (``message(id)``)."""

    label: str
    code: str  # the stable code it must be answered with, and recorded with
    tool: str
    arguments: dict[str, Any] | None = None
    raw: Any = None  # (message id) -> bytes

    def message(self, message_id: int) -> bytes:
        return self.raw(message_id)


def _call(message_id: int, tool: str, arguments_json: bytes) -> bytes:
    """A tools/call as the SDK's client writes it (params first, id last), with arguments as given."""
    head = b'{"method": "tools/call", "params": {"name": ' + json.dumps(tool).encode() + b', "arguments": '
    return head + arguments_json + b'}, "jsonrpc": "2.0", "id": ' + str(message_id).encode() + b"}"


def _raw(label: str, code: str, tool: str, arguments_json: bytes) -> Variant:
    return Variant(label, code, tool, raw=lambda message_id: _call(message_id, tool, arguments_json))


def _surrogate(rng: random.Random) -> str:
    lone = chr(rng.randrange(0xD800, 0xDC00)) if rng.random() < 0.5 else chr(rng.randrange(0xDC00, 0xE000))
    text = "".join(rng.choices(string.ascii_letters + " éß中", k=rng.randrange(0, 12)))
    cut = rng.randrange(0, len(text) + 1)
    return text[:cut] + lone + text[cut:]


def surrogate_variants(rng: random.Random) -> list[Variant]:
    """A lone surrogate (as its JSON escape) as a value, a key, in a list, deep in an object."""
    bad = _surrogate(rng)
    shapes = {
        "value": {"title": bad},
        "key": {"title": "t", bad: 1},
        "list item": {"title": "t", "tags": ["ok", bad]},
        "nested key": {"title": "t", "detail": {"a": {bad: "x"}}},
    }
    out = []
    for where, arguments in shapes.items():
        body = json.dumps(arguments).encode()  # ASCII: the surrogate travels as \\udXXX
        out.append(_raw(f"surrogate {where}", "invalid_input", PROPOSE, body))
    return out


def invalid_utf8_variants(rng: random.Random) -> list[Variant]:
    """Bytes that are no UTF-8 inside a string argument (the REST view reads them as lone surrogates)."""
    out = []
    for bad in rng.sample([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80"], 2):
        body = b'{"title": "a' + bad + b'b"}'
        out.append(_raw(f"invalid utf-8 {bad!r}", "invalid_input", PROPOSE, body))
    return out


def _nested(shape: str, depth: int) -> bytes:
    if shape == "array":
        return b"[" * depth + b"]" * depth
    if shape == "object":
        return b'{"a": ' * depth + b"1" + b"}" * depth
    opens = b"".join(b"[" if level % 2 else b'{"k": ' for level in range(depth))
    closes = b"".join(b"]" if level % 2 else b"}" for level in reversed(range(depth)))
    return opens + b"0" + closes  # arrays and objects in turn


def deep_variants(rng: random.Random) -> list[Variant]:
    """Nesting past the limit, of each shape, from just past it to 10^5 levels, under various arguments."""
    out = []
    for shape in ("array", "object", "mixed"):
        depth = rng.choice([MAX_DEPTH + 1, rng.randrange(100, 3000), 100_000])
        argument = rng.choice(["title", "detail", "x"])
        body = b'{"' + argument.encode() + b'": ' + _nested(shape, depth) + b"}"
        label = f"deep {shape} {depth} under {argument}"
        out.append(_raw(label, "invalid_input", PROPOSE, body))
    return out


def non_object_variants(rng: random.Random) -> list[Variant]:
    """Arguments that are no JSON object."""
    picks = rng.sample([b"[1, 2]", b'"title"', b"5", b"true"], 2)
    return [_raw(f"arguments {body!r}", "invalid_input", PROPOSE, body) for body in picks]


def key_variants(rng: random.Random) -> list[Variant]:
    """Idempotency keys no header can carry or the API takes: non-ASCII, control characters, too long, empty."""
    non_ascii = "".join(rng.choices("éü中😀\u200f\u200bß", k=rng.randrange(1, 6)))
    keys = {
        "non-ascii": rng.choice(string.ascii_letters) + non_ascii,
        "control": "k" + rng.choice(["\x00", "\n", "\r\n", "\x7f", "\t"]) + "k",
        "too long": "k" * rng.randrange(201, 5000),
        "empty": "",
    }
    return [
        Variant(
            f"idempotency key {where}",
            "invalid_idempotency_key",
            PROPOSE,
            arguments={"title": f"keyed {where}", IDEMPOTENCY_ARGUMENT: key},
        )  # fmt: skip
        for where, key in keys.items()
    ]


def surrogate_key_variant(rng: random.Random) -> list[Variant]:
    """A lone surrogate in the key is a bad string before it is a bad key: refused as such, by path."""
    body = json.dumps({"title": "surrogate key", IDEMPOTENCY_ARGUMENT: _surrogate(rng)}).encode()
    return [_raw("idempotency key surrogate", "invalid_input", PROPOSE, body)]


def oversize_variants(rng: random.Random) -> list[Variant]:
    """Bodies past the API's limit: just past it (the bridge passes them on) and past the envelope's room too."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    out = []
    for extra in (rng.randrange(1, 1000), rng.randrange(70_000, 200_000)):
        arguments = {"title": "x" * (limit + extra)}
        out.append(Variant(f"oversize +{extra}", "request_too_large", PROPOSE, arguments=arguments))
    big = json.dumps({"title": "y" * (limit + rng.randrange(70_000, 100_000))}).encode()
    out.append(_raw("oversize raw", "request_too_large", PROPOSE, big))
    return out


def unknown_tool_variants(rng: random.Random) -> list[Variant]:
    letters = "".join(rng.choices(string.ascii_lowercase + "_", k=rng.randrange(3, 30)))
    names = [letters, f"worker/{letters}", "..", f"{letters}é中", "t" * rng.randrange(101, 400), f"nul\x00{letters}"]
    return [Variant(f"unknown tool {n[:20]!r}", "unknown_tool", n, arguments={"a": 1}) for n in names]


def sdk_variants(seed: int) -> list[Variant]:
    rng = random.Random(seed)
    return key_variants(rng) + oversize_variants(rng)[:2] + unknown_tool_variants(rng)


def raw_variants(seed: int) -> list[Variant]:
    rng = random.Random(seed)
    return (
        surrogate_variants(rng) + invalid_utf8_variants(rng) + deep_variants(rng) + non_object_variants(rng)
        + surrogate_key_variant(rng) + oversize_variants(rng)[2:]
    )  # fmt: skip


def _code(result: dict[str, Any]) -> str:
    assert result.get("isError") is True, result
    code = result["structuredContent"]["error"]["code"]
    assert result["content"][0]["text"].startswith(f"{code}: ")
    return code


def _sent_raw(transport: str, base: str, token: str, variants: list[Variant]) -> list[str]:
    """Each raw variant sent in turn; the code each was answered with (every one must be answered)."""
    codes = []
    if transport == "http":
        for number, variant in enumerate(variants, start=1):
            response = raw_http(base, token, variant.message(number))
            assert response.status_code == 200, (variant.label, response.text[:300])
            answer = response.json()
            assert answer["id"] == number
            assert "result" in answer, (variant.label, answer)
            codes.append(_code(answer["result"]))
        return codes
    stdio = RawStdio(base, token)
    try:
        for number, variant in enumerate(variants, start=1):
            answer = stdio.ask(variant.message(number))
            assert answer["id"] == number, (variant.label, answer)
            assert "result" in answer, (variant.label, answer)
            codes.append(_code(answer["result"]))
    finally:
        stdio.close()
    return codes


def _sent_by_sdk(transport: str, base: str, token: str, variants: list[Variant]) -> list[str]:
    async def main() -> list[str]:
        async with mcp_session(transport, base, token) as session:
            return [await _one(session, variant) for variant in variants]

    async def _one(session: ClientSession, variant: Variant) -> str:
        result = await session.call_tool(variant.tool, variant.arguments)
        return _code(result.model_dump(by_alias=True, exclude_none=True))

    return anyio.run(main)


def _recorded_since(world, seq: int) -> list[Event]:
    return list(Event.objects.filter(run=world.run, type="tool.called", seq__gt=seq).order_by("seq"))


def _last_seq(world) -> int:
    last = Event.objects.filter(run=world.run).order_by("-seq").first()
    return last.seq if last else 0


@pytest.mark.parametrize("seed", SEEDS)
def test_every_refused_request_is_answered_with_its_code_and_recorded_once(served, world, seed):
    transport, base = served
    token = world.tokens["own"]
    candidates = Candidate.objects.filter(run=world.run).count()
    for send, variants in ((_sent_raw, raw_variants(seed)), (_sent_by_sdk, sdk_variants(seed))):
        since = _last_seq(world)
        codes = send(transport, base, token, variants)
        assert codes == [v.code for v in variants], [v.label for v in variants]
        events = _recorded_since(world, since)
        # One record per request, in order, with the code the agent got and what it sent in a storable form.
        recorded = [(e.arguments["error"], e.arguments["status"] >= 400) for e in events]
        assert recorded == [(v.code, True) for v in variants]
        for variant, event in zip(variants, events, strict=True):
            assert event.actor == "worker_0001"
            if variant.code == "unknown_tool":
                assert "\x00" not in event.tool
                assert event.tool
            elif variant.code == "invalid_idempotency_key":
                assert event.arguments["idempotency_key"] not in ("", None)
            elif variant.label == "idempotency key surrogate":
                assert event.arguments["error_path"] == f"$.{IDEMPOTENCY_ARGUMENT}"
            elif variant.label.startswith("deep"):
                assert event.arguments["error_path"].startswith("$.")  # where the too-deep value sits
    assert Candidate.objects.filter(run=world.run).count() == candidates  # nothing refused was created


def test_a_final_split_request_with_a_bad_string_elsewhere_still_counts_as_an_attempt(served, world):
    transport, base = served
    rng = random.Random(transport)
    before = BlockedAttempt.objects.filter(run=world.run).count()
    since = _last_seq(world)
    spec = {"kind": "eval_only", "claim": _surrogate(rng), "eval": {"split": "final"}, IDEMPOTENCY_ARGUMENT: "fs-1"}
    bad_string = Variant("final + surrogate", "invalid_input", "worker_submit",
                         raw=lambda i: _call(i, "worker_submit", json.dumps(spec).encode()))  # fmt: skip
    assert _sent_raw(transport, base, world.tokens["own"], [bad_string]) == ["invalid_input"]
    keyed = {"kind": "eval_only", "claim": "peek", "eval": {"split": "final"}, IDEMPOTENCY_ARGUMENT: "clé-é"}
    bad_key = Variant("final + key", "invalid_idempotency_key", "worker_submit", arguments=keyed)
    assert _sent_by_sdk(transport, base, world.tokens["own"], [bad_key]) == ["invalid_idempotency_key"]
    assert BlockedAttempt.objects.filter(run=world.run).count() == before + 2
    events = _recorded_since(world, since)
    assert [e.arguments["error"] for e in events] == ["invalid_input", "invalid_idempotency_key"]
    # The refused calls' arguments are on record (escaped), the split included.
    assert [e.arguments["args"]["eval"] for e in events] == [{"split": "final"}] * 2
    assert "\\ud" in events[0].arguments["args"]["claim"]


def test_a_message_without_a_tool_is_answered_with_a_json_rpc_error_over_stdio(api, world):
    stdio = RawStdio(api.base, world.tokens["own"])
    try:
        for message in (b"{not json", b"\xff\xfe", b"[" * 100_000, b'{"jsonrpc": "2.0", "id": 9, "method": 5}'):
            answer = stdio.ask(message)
            assert answer["error"]["data"]["error"]["code"] in ("invalid_json", "invalid_input", "invalid_request")
            assert answer["error"]["message"].startswith(answer["error"]["data"]["error"]["code"] + ": ")
        pong = stdio.ask(b'{"jsonrpc": "2.0", "id": 10, "method": "ping"}')
        assert pong == {"jsonrpc": "2.0", "id": 10, "result": {}}  # and the server still serves
    finally:
        stdio.close()


def test_an_unknown_token_is_refused_at_once_and_opens_no_stream(asgi_url, world):
    url = asgi_url + MCP_PATH
    # The web app's first request loads Django's URLs and views (seconds): not what is measured here.
    httpx.get(asgi_url + "/api/v1/tools", headers={"Authorization": f"Bearer {world.tokens['own']}"}, timeout=60)
    for token in ("x", "not-a-token", "é" * 3):
        headers = {"Authorization": f"Bearer {token}".encode("latin-1"), "Accept": "text/event-stream"}
        with httpx.stream("GET", url, headers=headers, timeout=5) as response:
            assert response.status_code == 401
            assert response.headers["content-type"] == "application/json"
            assert json.loads(response.read())["error"]["code"] == "authentication_failed"
        posted = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers, timeout=5)
        assert posted.status_code == 401
    # A known token's stream opens (the SDK's standalone SSE stream), and is closed by the client.
    good = {"Authorization": f"Bearer {world.tokens['own']}", "Accept": "text/event-stream"}
    with httpx.stream("GET", url, headers=good, timeout=5) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")


def test_rest_records_what_it_refuses_before_reading_arguments(api, world):
    since = _last_seq(world)
    deep = api.call("own", PROPOSE, headers={"Content-Type": "application/json"}, body=None)
    assert deep.status_code == 400  # {} lacks the title: a plain schema refusal, for comparison
    response = _post_raw(api, "own", PROPOSE, b'{"title": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["detail"]["rule"] == "too_deep"
    unknown = _post_raw(api, "own", "no_such_tool", b'{"a": 1}')
    assert unknown.json()["error"]["code"] == "unknown_tool"
    forbidden = _post_raw(api, "own", "stop_loop", b'{"reason": "because"}')
    assert forbidden.json()["error"]["code"] == "forbidden_role"
    garbage = _post_raw(api, "own", PROPOSE, b"{not json \xff")
    assert garbage.json()["error"]["code"] == "invalid_json"
    events = _recorded_since(world, since)
    codes = ["invalid_input", "invalid_input", "unknown_tool", "forbidden_role", "invalid_json"]
    assert [e.arguments["error"] for e in events] == codes
    assert events[1].arguments["error_path"] == "$.title" + "[0]" * (MAX_DEPTH - 1)
    assert events[2].tool == "no_such_tool"
    assert events[2].arguments["args"] == {"a": 1}
    assert events[3].arguments["args"] == {"reason": "because"}  # a forbidden call keeps its arguments
    head = events[4].arguments["args"]
    assert head["body_bytes"] == len(b"{not json \xff")
    assert head["body_head"] == "{not json \\xff"


def _post_raw(api, who: str, tool: str, body: bytes) -> Any:
    headers = {"Authorization": f"Bearer {api.world.tokens[who]}", "Content-Type": "application/json"}
    return httpx.post(f"{api.base}/api/v1/tools/{tool}", content=body, headers=headers, timeout=60)


# --- the screening's pieces, without a server ---------------------------------------------------------


def test_the_bridge_and_the_api_share_the_nesting_limit():
    assert MAX_ARGUMENT_DEPTH == MAX_DEPTH


@pytest.mark.parametrize("seed", range(5))
def test_capped_text_parses_and_keeps_the_first_too_deep_path(seed):
    rng = random.Random(seed)
    for shape in ("array", "object", "mixed"):
        depth = rng.randrange(MAX_DEPTH + 1, 50_000)
        raw = b'{"pad": [1, "]]}}", {"x": 2}], "v": ' + _nested(shape, depth) + b', "after": "z"}'
        assert nesting_exceeds(raw, MAX_DEPTH)
        capped = cap_depth(raw, MAX_DEPTH)
        assert not nesting_exceeds(capped, MAX_DEPTH + 1)
        value = loads_capped(raw, MAX_DEPTH)
        assert value["pad"] == [1, "]]}}", {"x": 2}]
        assert value["after"] == "z"
        assert json.loads(capped) == value
    assert not nesting_exceeds(b'{"a": "' + b"[" * 500 + b'"}', MAX_DEPTH)  # brackets in a string


@pytest.mark.parametrize("seed", range(5))
def test_rpc_parts_are_read_from_text_no_parser_takes(seed):
    rng = random.Random(seed)
    arguments = b'{"name": "inner", "id": 99, "v": ' + _nested(rng.choice(["array", "object", "mixed"]), 10_000) + b"}"
    params = b'"params": {"_meta": {"name": "no"}, "name": "worker_submit", "arguments": ' + arguments + b"}"
    members = [b'"jsonrpc": "2.0"', b'"id": 7', b'"method": "tools/call"', params]
    rng.shuffle(members)
    raw = b"{" + b", ".join(members) + b"}"
    parts = rpc_parts(raw)
    assert (parts.id, parts.method, parts.name) == (7, "tools/call", "worker_submit")
    assert parts.arguments is not None
    assert raw[parts.arguments[0] : parts.arguments[1]] == arguments
    cut = raw[: rng.randrange(len(raw) // 2, len(raw) - 5)]
    assert rpc_parts(cut).method in ("tools/call", None)  # a cut text never raises
    assert tail_id(_call(123, "t", b'{"a": "x"}')[-50:]) == 123


@pytest.mark.parametrize("seed", range(3))
def test_header_values_the_api_would_refuse_stay_refusable(seed):
    rng = random.Random(seed)
    for _ in range(200):
        value = "".join(rng.choices(string.printable + "é中\x00\x7f\ud800", k=rng.randrange(0, 300)))
        sent = header_value(value)
        assert all(0x20 <= ord(c) < 0x7F for c in sent)  # HTTP carries it
        if sent != value:
            assert " " in sent  # never a valid key by accident
