"""A tool call whose body is sent chunked (no Content-Length) reads that body, on the production server.

Raw http.client requests against uvicorn + a2wsgi (``live_url``, as ``manage.py serve`` runs it):
before the fix the body read as empty and the tool ran with ``{}``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
from urllib.parse import urlencode, urlsplit

from apps.experiments.models import Event
from tests.apps.expos.conftest import build_world


def _chunked_post(
    base: str, path: str, token: str, chunks: list[bytes], content_type: str = "application/json"
) -> tuple[int, dict]:
    address = urlsplit(base)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
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


def test_a_chunked_upload_is_streamed_to_the_view_past_the_json_limit(live_url, transactional_db):
    """The streamed upload (apps.expos.uploads) reads a chunked file itself, past the 2 MiB JSON limit.

    The declared digest is another's, so the answer is the view's own check of every byte it read:
    the digest of what arrived (the registration behind it: tests/apps/expos/tools/test_data_upload.py).
    """
    world = build_world()
    rows = [{"prompt": f"What is {a} + {a + 7}?", "completion": f" {2 * a + 7}", "pad": "x" * 900} for a in range(2600)]
    body = "".join(json.dumps(row) + "\n" for row in rows).encode()
    assert len(body) > 2 * 1024 * 1024  # over RSI_MAX_REQUEST_BYTES: the middleware must not read it
    chunks = [body[i : i + 300_000] for i in range(0, len(body), 300_000)]

    def upload(sent: list[bytes]) -> tuple[int, dict]:
        query = urlencode({"sha256": "0" * 64, "size_bytes": len(body), "generator": "gen.py"})
        path = f"/api/v1/tools/worker_add_data/upload?{query}"
        return _chunked_post(live_url, path, world.tokens["own"], sent, "application/x-ndjson")

    status, answer = upload(chunks)
    assert (status, answer["error"]["code"]) == (400, "sha256_mismatch"), answer
    assert answer["error"]["detail"]["received"] == hashlib.sha256(body).hexdigest()
    # Cut short: the chunked body ends before the declared size.
    status, answer = upload(chunks[:2])
    assert (status, answer["error"]["code"]) == (400, "size_mismatch"), answer
    assert answer["error"]["detail"]["received"] == 600_000
