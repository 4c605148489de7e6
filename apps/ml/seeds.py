"""Seeds of the final evaluation, PostTrainBench-style: per-sample seeds, N seeds, a retry cascade.

- **Per-sample seed** = sha256 of (run seed, sample id, epoch, call). Never one seed per request:
  a request with many prompts and one seed gives every prompt the same random stream, which once
  collapsed all 1,319 GSM8K answers to the same output. Each prompt is sampled under its own seed,
  reproducible from the record alone.
- **N seeds**: sampled decoding is evaluated under `FINAL_SEEDS[:n]` (5 by default, configurable);
  greedy decoding has nothing to vary, so it runs once.
- **Retry cascade**: a generation that fails (the engine refuses the request, typically prompt +
  max_tokens over the context) is retried with fewer max tokens, `call` counting the attempts, so a
  retried sample draws a fresh but still reproducible seed.

The mean over the seeds that succeeded and its bootstrap interval are computed where the records
are (`apps.experiments.final_eval`); this module is Django-free like the rest of `apps.ml`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

# The fixed run seeds of a final evaluation (PostTrainBench evaluates on 5 fixed seeds).
FINAL_SEEDS = (0, 1, 2, 3, 4)
DEFAULT_SAMPLED_SEEDS = 5
# Per-sample seeds are 63-bit: torch.Generator.manual_seed and vLLM's SamplingParams both take them.
_SEED_BITS = 63
# The retry cascade: each retry asks for this fraction of the previous max tokens, down to a floor.
RETRY_FACTOR = 0.5
RETRY_STEPS = 3
MIN_RETRY_TOKENS = 16
# What a task that states no max tokens at all gets (the minibench's answers are a few tokens).
DEFAULT_MAX_TOKENS = 32


def sample_seed(run_seed: int, sample_id: str, epoch: int = 0, call: int = 0) -> int:
    """The seed one sample is generated with: sha256 of (run seed, sample id, epoch, call).

    The four fields are hashed as a JSON array, so no choice of sample id can collide with
    another field's value by concatenation ("1", "23" vs "12", "3").
    """
    if isinstance(run_seed, bool) or not isinstance(run_seed, int):
        raise TypeError(f"run_seed must be an int, got {type(run_seed).__name__}")
    key = json.dumps([run_seed, str(sample_id), int(epoch), int(call)], separators=(",", ":"))
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - _SEED_BITS)


def is_sampled(decoding: Mapping[str, Any]) -> bool:
    """Whether decoding draws random tokens, in either form a benchmark states it.

    A benchmark contract (``apps.benchmarks.contract``, what ``benchmark_add`` registers) says
    ``seed_policy: per-sample-seeds`` with a temperature above zero; a minibench-style task.json
    says ``do_sample`` with a temperature above zero. Anything else is greedy.
    """
    if "seed_policy" in decoding:
        return decoding["seed_policy"] == "per-sample-seeds" and float(decoding.get("temperature", 0.0)) > 0.0
    return bool(decoding.get("do_sample")) and float(decoding.get("temperature", 1.0)) > 0.0


def max_tokens_of(decoding: Mapping[str, Any]) -> int:
    """The most new tokens a sample may generate: the contract's ``max_tokens``, or task.json's ``max_new_tokens``."""
    if "max_tokens" in decoding:
        return int(decoding["max_tokens"])
    return int(decoding.get("max_new_tokens", DEFAULT_MAX_TOKENS))


def stop_strings_of(task: Mapping[str, Any]) -> list[str]:
    """The stop strings: the contract puts them in ``decoding``, the older task.json at its top level."""
    decoding = task.get("decoding") or {}
    if "stop" in decoding:
        return [str(s) for s in decoding["stop"]]
    return [str(s) for s in task.get("stop", [])]


def seed_count(decoding: Mapping[str, Any], requested: int | None = None) -> int:
    """How many run seeds a final evaluation uses: 1 for greedy, else `requested`, RSI_FINAL_SEEDS or 5."""
    if not is_sampled(decoding):
        return 1
    if requested is None:
        raw = os.environ.get("RSI_FINAL_SEEDS", "").strip()
        requested = int(raw) if raw else DEFAULT_SAMPLED_SEEDS
    if not 1 <= requested <= len(FINAL_SEEDS):
        raise ValueError(f"seed count must be between 1 and {len(FINAL_SEEDS)}, got {requested}")
    return requested


def run_seeds(decoding: Mapping[str, Any], requested: int | None = None) -> list[int]:
    """The run seeds of a final evaluation under `decoding` (the first `seed_count` fixed seeds)."""
    return list(FINAL_SEEDS[: seed_count(decoding, requested)])


def max_tokens_cascade(max_tokens: int, steps: int = RETRY_STEPS) -> list[int]:
    """The max-tokens limits to try in order: the benchmark's, then smaller ones after failures.

    For 4000 this is [4000, 2000, 1000]; it never goes below MIN_RETRY_TOKENS (or max_tokens
    itself, when that is smaller) and never repeats a limit.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    limits = [max_tokens]
    floor = min(max_tokens, MIN_RETRY_TOKENS)
    while len(limits) < steps:
        nxt = max(floor, int(limits[-1] * RETRY_FACTOR))
        if nxt == limits[-1]:
            break
        limits.append(nxt)
    return limits


class CascadeExhausted(RuntimeError):
    """Every step of the max-tokens retry cascade failed; the message lists each step's error."""


def with_cascade(
    attempt: Callable[[int, int], T], *, max_tokens: int, failures: tuple[type[BaseException], ...]
) -> tuple[T, int]:
    """The retry cascade: ``attempt(step, limit)`` for each limit of ``max_tokens_cascade`` in turn.

    Returns the first result and its step (0: ``max_tokens`` itself). An attempt that raises one
    of ``failures`` (an engine refusing the length, out of memory) is retried with the next,
    smaller limit; anything else propagates. CascadeExhausted when the last step fails too.
    """
    errors: list[str] = []
    for step, limit in enumerate(max_tokens_cascade(max_tokens)):
        try:
            return attempt(step, limit), step
        except failures as exc:
            errors.append(f"max_tokens={limit}: {exc}"[:300])
    raise CascadeExhausted(" | ".join(errors))
