"""Minimal client for vLLM's OpenAI-compatible `/v1/completions` API.

vLLM pins its own torch and transformers, so it runs as a separate `vllm serve <checkpoint>`
process; this client only needs the standard library. The served model is checked against the
checkpoint being evaluated: scoring the wrong weights would be an integrity failure, not a glitch.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class VLLMError(RuntimeError):
    """The server could not be reached, refused the request, or serves another model."""


class VLLMRefused(VLLMError):
    """The server answered 400 to a generation request (typically prompt + max_tokens over the context)."""


def _request(url: str, payload: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
    # urllib would also open file:// and other schemes; only plain HTTP(S) is a vLLM server.
    if not url.startswith(("http://", "https://")):
        raise VLLMError(f"vllm_url must be http(s), got {url!r}")
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - scheme checked above
            body: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        kind = VLLMRefused if exc.code == 400 and payload is not None else VLLMError
        raise kind(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise VLLMError(f"{url}: {exc}") from None
    return body


def served_model(base_url: str, checkpoint: str, *, timeout: float = 30.0) -> str:
    """The served model id for `checkpoint` (matched on id or on vLLM's `root` path)."""
    models = _request(f"{base_url.rstrip('/')}/v1/models", None, timeout).get("data", [])
    for entry in models:
        if checkpoint in (entry.get("id"), entry.get("root")):
            return str(entry["id"])
    served = [entry.get("root") or entry.get("id") for entry in models]
    raise VLLMError(f"{base_url} serves {served}, not the checkpoint under evaluation {checkpoint!r}")


def complete(
    base_url: str,
    *,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    stop: Sequence[str],
    batch_size: int = 32,
    add_special_tokens: bool = True,
    timeout: float = 600.0,
    sampling: dict[str, float] | None = None,
    seeds: Sequence[int] | None = None,
    concurrency: int = 8,
    stop_token_ids: Sequence[int] = (),
) -> list[str]:
    """Completions for `prompts`, in order.

    Greedy (no `sampling`): batched `batch_size` prompts per request. Sampled: `sampling` gives
    temperature, top_p and top_k explicitly (an unset one would fall back to the checkpoint's
    generation_config.json), and `seeds` one seed per prompt; each prompt is then its own request
    with its own seed, since a request's seed is shared by all its prompts. `stop_token_ids` end a
    completion besides the served tokenizer's EOS (the registered model's other EOS ids).
    """
    model_id = served_model(base_url, model, timeout=timeout)
    url = f"{base_url.rstrip('/')}/v1/completions"
    base: dict[str, Any] = {
        "model": model_id,
        "max_tokens": max_tokens,
        "n": 1,
        "stop": [s for s in stop if s],
        # vLLM's extension (default true): whether to add BOS to the already-rendered prompt.
        "add_special_tokens": add_special_tokens,
    }
    if stop_token_ids:
        base["stop_token_ids"] = [int(i) for i in stop_token_ids]  # vLLM's extension
    if sampling is None:
        base.update(temperature=0.0, top_p=1.0)
        texts: list[str] = []
        for start in range(0, len(prompts), batch_size):
            batch = list(prompts[start : start + batch_size])
            body = _request(url, {**base, "prompt": batch}, timeout)
            choices = sorted(body.get("choices", []), key=lambda c: int(c["index"]))
            if len(choices) != len(batch):
                raise VLLMError(f"{url}: asked for {len(batch)} completions, got {len(choices)}")
            texts.extend(str(c["text"]) for c in choices)
        return texts
    if seeds is None or len(seeds) != len(prompts):
        raise VLLMError("sampled completions need exactly one seed per prompt")
    base.update(
        temperature=float(sampling["temperature"]), top_p=float(sampling["top_p"]), top_k=int(sampling["top_k"])
    )

    def one(index: int) -> str:
        body = _request(url, {**base, "prompt": prompts[index], "seed": int(seeds[index])}, timeout)
        choices = body.get("choices", [])
        if len(choices) != 1:
            raise VLLMError(f"{url}: asked for 1 completion, got {len(choices)}")
        return str(choices[0]["text"])

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(one, range(len(prompts))))
