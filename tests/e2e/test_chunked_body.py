"""A tool call whose body is sent chunked (no Content-Length) reads that body, on the production server.

Raw http.client requests against uvicorn + a2wsgi (``live_url``, as ``manage.py serve`` runs it):
before the fix the body read as empty and the tool ran with ``{}``.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from apps.experiments.models import Event
from tests.apps.expos.conftest import build_world


def _chunked_post(base: str, path: str, token: str, chunks: list[bytes]) -> tuple[int, dict]:
    address = urlsplit(base)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        # encode_chunked with no Content-Length: http.client frames each chunk itself.
        connection.request("POST", path, body=iter(chunks), headers=headers, encode_chunked=True)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def test_a_chunked_body_is_read_not_dropped(live_url, transactional_db):
    world = build_world()
    body = json.dumps({"limit": 1, "types": ["run.status_changed"]}).encode()
    status, answer = _chunked_post(live_url, "/api/v1/tools/events_tail", world.tokens["main"], [body[:7], body[7:]])
    assert status == 200, answer
    assert len(answer["events"]) == 1  # {} would have answered up to 50 events of any type
    assert answer["events"][0]["type"] == "run.status_changed"
    recorded = Event.objects.filter(run=world.run, tool="events_tail").order_by("-id").first()
    assert recorded.arguments["args"] == {"limit": 1, "types": ["run.status_changed"]}
    # A chunked body that is not valid JSON is refused as such, never run as {}.
    status, answer = _chunked_post(live_url, "/api/v1/tools/events_tail", world.tokens["main"], [b'{"limit": ', b"1"])
    assert status == 400
    assert answer["error"]["code"] == "invalid_json"
