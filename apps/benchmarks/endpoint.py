"""An OpenAI-compatible chat endpoint on loopback, serving the one checkpoint under evaluation.

The Inspect process (apps/benchmarks/harness/inspect_runner.py) gets its model outputs from
here through Inspect's own ``openai-api`` provider, so the weights never leave the evaluation
worker and the inference engine stays ours (apps/ml/inference.py's batched HF generate today;
a vLLM engine plugs in behind ``generate``). Each request is checked against the contract before
anything is generated: the model name must be the checkpoint's manifest digest, temperature and
top_p must be the contract's (a provider default that samples is refused, not obeyed), and
max_tokens may not exceed it. Chat messages are rendered with the checkpoint tokenizer's chat
template when the contract applies one, else their contents joined by blank lines (base models).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Generate = Callable[[str, int, Sequence[str]], str]  # (prompt, max_tokens, stop) -> completion


class RequestRefused(ValueError):
    """A request asked for something the contract does not allow."""


def render_messages(
    messages: list[dict[str, Any]], *, chat_template: Callable[[list[dict[str, str]]], str] | None
) -> str:
    plain = [{"role": str(m.get("role", "user")), "content": _content(m.get("content"))} for m in messages]
    if chat_template is not None:
        return chat_template(plain)
    return "\n\n".join(m["content"] for m in plain)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def check_request(body: dict[str, Any], *, model: str, decoding: dict[str, Any]) -> tuple[int, list[str]]:
    """(max_tokens, stop) for a request that keeps to the contract; RequestRefused otherwise."""
    if body.get("model") != model:
        raise RequestRefused(f"this endpoint serves {model}, not {body.get('model')!r}")
    for key in ("temperature", "top_p"):
        if key not in body or float(body[key]) != float(decoding[key]):
            raise RequestRefused(f"{key} must be {decoding[key]} (the benchmark's contract), got {body.get(key)!r}")
    if int(body.get("n", 1)) != 1:
        raise RequestRefused("n must be 1")
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or decoding["max_tokens"])
    if max_tokens > int(decoding["max_tokens"]):
        raise RequestRefused(f"max_tokens {max_tokens} exceeds the contract's {decoding['max_tokens']}")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else list(stop)
    return max_tokens, [*decoding["stop"], *(s for s in stop if s not in decoding["stop"])]


@contextmanager
def serve(
    *, model: str, decoding: dict[str, Any], generate: Generate,
    chat_template: Callable[[list[dict[str, str]]], str] | None = None,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Serve ``/v1/chat/completions`` on 127.0.0.1 (a free port) while the block runs.

    Yields ``{"base_url", "requests"}``; ``requests`` lists each request's prompt and completion
    (or refusal), for the evaluation record. Generation is serialised: one model, one request at a time.
    """
    lock = threading.Lock()
    log: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
            return

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "rsiweb"}]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": "only /v1/chat/completions is served"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                max_tokens, stop = check_request(body, model=model, decoding=decoding)
                prompt = render_messages(body.get("messages") or [], chat_template=chat_template)
            except (RequestRefused, ValueError, TypeError) as exc:
                log.append({"refused": str(exc)})
                self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
                return
            with lock:
                text = generate(prompt, max_tokens, stop)
            log.append({"prompt": prompt, "completion": text})
            self._send(
                200,
                {
                    "id": f"rsiweb-{len(log)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                    ],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                },
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="rsiweb-eval-endpoint", daemon=True)
    thread.start()
    try:
        yield {"base_url": f"http://127.0.0.1:{server.server_address[1]}/v1", "requests": log}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
