"""An OpenAI-compatible chat endpoint on loopback, serving the one checkpoint under evaluation.

The Inspect process (apps/benchmarks/harness/inspect_runner.py) gets its model outputs from
here through Inspect's own ``openai-api`` provider, so the weights never leave the evaluation
worker and the inference engine stays ours (apps/ml/inference.py's batched HF generate today;
a vLLM engine plugs in behind ``generate``). Each request is checked against the contract before
anything is generated: the model name must be the checkpoint's manifest digest, temperature and
top_p must be the contract's (a provider default that samples is refused, not obeyed), and
max_tokens may not exceed it. Chat messages are rendered with the checkpoint tokenizer's chat
template when the contract applies one, else their contents joined by blank lines (base models).

Seeds and retries are the endpoint's, as on the built-in path (apps/ml/seeds.py): under sampled
decoding each request is generated under the per-sample seed sha256(run seed, sample id, epoch,
call), never the one seed Inspect's config sends with every request (one shared seed once
collapsed every GSM8K answer to the same output). The sample is the sealed sample whose prompt
the request's messages contain (the longest such prompt; a request that contains none, or two
different ones equally long, is keyed by its own text's digest, and the log says so); ``call``
counts that sample's requests, so a multi-turn task's later turns and a retry each draw a fresh
but reproducible seed. A generation the engine refuses (prompt + max_tokens over the context,
out of memory) is retried with fewer max tokens (the retry cascade); when every step fails the
request answers 500 and the log records the failure, which fails the evaluation's seed.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from apps.ml.seeds import CascadeExhausted, is_sampled, sample_seed, with_cascade

# (prompt, max_tokens, stop, seed or None for greedy) -> completion
Generate = Callable[[str, int, Sequence[str], "int | None"], str]


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


def sample_key(messages: list[dict[str, Any]], samples: Sequence[dict[str, Any]]) -> tuple[str, bool]:
    """(the sealed sample id a request is for, True) or (a digest of its text, False); module docstring."""
    text = "\n\n".join(_content(m.get("content")) for m in messages)
    found = [s for s in samples if str(s.get("prompt", "")).strip() and str(s["prompt"]).strip() in text]
    if found:
        longest = max(len(str(s["prompt"]).strip()) for s in found)
        ids = {str(s["id"]) for s in found if len(str(s["prompt"]).strip()) == longest}
        if len(ids) == 1:
            return ids.pop(), True
    return "prompt-sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16], False


@contextmanager
def serve(
    *, model: str, decoding: dict[str, Any], generate: Generate,
    chat_template: Callable[[list[dict[str, str]]], str] | None = None,
    samples: Sequence[dict[str, Any]] = (), run_seed: int = 0, epoch: int = 0,
    failures: tuple[type[BaseException], ...] = (),
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Serve ``/v1/chat/completions`` on 127.0.0.1 (a free port) while the block runs.

    Yields ``{"base_url", "requests"}``; ``requests`` lists each request's sample, seed, retries,
    prompt and completion (or refusal, or failure), for the evaluation record. ``samples`` are the
    sealed rows (``id``, ``prompt``) the requests are matched to, ``run_seed`` and ``epoch`` the
    evaluation's, ``failures`` the engine errors the retry cascade retries (module docstring).
    Generation is serialised: one model, one request at a time.
    """
    lock = threading.Lock()
    log: list[dict[str, Any]] = []
    sampled = is_sampled(decoding)
    calls: Counter[str] = Counter()

    def complete(prompt: str, key: str, max_tokens: int, stop: list[str]) -> dict[str, Any]:
        def attempt(step: int, limit: int) -> dict[str, Any]:
            # Every request of a sample, retries included, draws the next call's seed.
            call = calls[key]
            calls[key] += 1
            seed = sample_seed(run_seed, key, epoch, call) if sampled else None
            return {"completion": generate(prompt, limit, stop, seed), "seed": seed, "call": call}

        try:
            outcome, step = with_cascade(attempt, max_tokens=max_tokens, failures=failures)
        except CascadeExhausted as exc:
            return {"failed": str(exc)}
        return {**outcome, "retries": step}

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
                messages = body.get("messages") or []
                prompt = render_messages(messages, chat_template=chat_template)
                key, matched = sample_key(messages, samples)
            except (RequestRefused, ValueError, TypeError, AttributeError) as exc:
                log.append({"refused": str(exc)})
                self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
                return
            with lock:
                outcome = complete(prompt, key, max_tokens, stop)
            log.append({"sample": key, "matched": matched, "prompt": prompt, **outcome})
            if "failed" in outcome:
                message = f"every retry failed: {outcome['failed']}"
                self._send(500, {"error": {"message": message, "type": "server_error"}})
                return
            text = outcome["completion"]
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
