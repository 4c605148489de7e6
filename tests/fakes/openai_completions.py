"""A loopback HTTP server that speaks the subset of vLLM's OpenAI-compatible API the runner uses.

`GET /v1/models` and `POST /v1/completions` (batched prompts, greedy, stop strings excluded from
the text, vLLM's `add_special_tokens` extension). Completions come from a `generate` callable,
so a test can back it with the real tiny model and compare with the HF backend.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# (prompts, max_tokens, stop, add_special_tokens) -> completion texts
GenerateFn = Callable[[list[str], int, list[str], bool], list[str]]


class FakeCompletionsServer:
    """Serves one model id (with its `root` path) and records every request body."""

    def __init__(
        self, *, model_id: str, root: str, generate: GenerateFn, max_model_len: int | None = None,
        count: Callable[[str, bool], int] | None = None,
    ) -> None:  # fmt: skip
        self.model_id = model_id
        self.root = root
        self.generate = generate
        # vLLM's length check: a prompt whose tokens (``count(prompt, add_special_tokens)``) plus
        # max_tokens exceed max_model_len is answered 400, nothing generated.
        self.max_model_len = max_model_len
        self.count = count
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest output clean

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                model = {"id": server.model_id, "object": "model", "root": server.root, "owned_by": "vllm"}
                self._send(200, {"object": "list", "data": [model]})

            def do_POST(self) -> None:
                if self.path != "/v1/completions":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                if body.get("model") != server.model_id:
                    self._send(404, {"error": {"message": f"model {body.get('model')!r} does not exist"}})
                    return
                prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
                if server.max_model_len is not None and server.count is not None:
                    specials = bool(body.get("add_special_tokens", True))
                    for prompt in prompts:
                        tokens = server.count(prompt, specials)
                        if tokens + int(body.get("max_tokens", 16)) > server.max_model_len:
                            message = (
                                f"This model's maximum context length is {server.max_model_len} tokens. However, you "
                                f"requested {body.get('max_tokens')} output tokens and your prompt contains at least "
                                f"{tokens} input tokens, for a total of at least {tokens + int(body['max_tokens'])} "
                                "tokens. Please reduce the length of the input prompt or the number of requested "
                                "output tokens."
                            )
                            self._send(400, {"object": "error", "message": message, "type": "BadRequestError"})
                            return
                texts = server.generate(
                    prompts,
                    int(body.get("max_tokens", 16)),
                    list(body.get("stop") or []),
                    bool(body.get("add_special_tokens", True)),
                )
                choices = [
                    {"index": i, "text": text, "logprobs": None, "finish_reason": "stop"}
                    for i, text in enumerate(texts)
                ]
                # vLLM may return choices in any order; the client must sort by index.
                choices.reverse()
                self._send(
                    200,
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": server.model_id,
                        "choices": choices,
                        "usage": {},
                    },
                )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@contextmanager
def serve(
    *, model_id: str, root: str, generate: GenerateFn, max_model_len: int | None = None,
    count: Callable[[str, bool], int] | None = None,
) -> Iterator[FakeCompletionsServer]:  # fmt: skip
    """Run a fake server on an ephemeral loopback port for the duration of the block."""
    server = FakeCompletionsServer(
        model_id=model_id, root=root, generate=generate, max_model_len=max_model_len, count=count
    )
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
        thread.join(timeout=5)
