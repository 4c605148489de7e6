"""Sealed evaluation: render the task's prompts, decode (HF or vLLM; greedy, or sampled under per-sample
seeds), retry failed generations with fewer max tokens, score each output."""

from __future__ import annotations

import apps.ml.offline  # noqa: F401 - before transformers: the Hub stays off

# isort: split
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from apps.ml.checkpoints import device, load_checkpoint
from apps.ml.context import fit_prompts, model_context, row_context, within_context
from apps.ml.evaluators import score
from apps.ml.seeds import (
    CascadeExhausted,
    is_sampled,
    max_tokens_of,
    sample_seed,
    stop_strings_of,
    with_cascade,
)
from apps.ml.vllm_client import VLLMRefused
from apps.ml.vllm_client import complete as vllm_complete

# What the retry cascade retries: an engine refusing the request (vLLM's 400; prompt + max_tokens
# over the context no longer reaches an engine, apps.ml.context caps it first) or running out of
# accelerator memory. Anything else (a server that serves other weights, one that is down) is not
# helped by fewer tokens and stops the run.
GENERATION_FAILURES: tuple[type[BaseException], ...] = (VLLMRefused, torch.OutOfMemoryError)


def uses_special_tokens(task: dict[str, Any]) -> bool:
    """Whether prompts are tokenized with the tokenizer's specials (BOS).

    A chat-rendered prompt already is the full model input: HF's `apply_chat_template`, TRL's
    conversational path and vLLM's chat endpoint all tokenize it without adding specials, and so
    must we, or training and evaluation would disagree by one BOS token.
    """
    return not task.get("use_chat_template")


def render_prompt(task: dict[str, Any], question: str, tokenizer: PreTrainedTokenizerBase | None) -> str:
    """The exact text the model is given for one sealed question under the task's settings."""
    text = str(task["prompt_template"]).replace("{question}", question)
    if task.get("use_chat_template"):
        if tokenizer is None or not tokenizer.chat_template:
            raise ValueError(f"task {task.get('name')!r} uses the chat template but the tokenizer has none")
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        text = str(rendered)
    return text


def prompt_counter(tokenizer: PreTrainedTokenizerBase, *, add_special_tokens: bool) -> Callable[[str], int]:
    """How many tokens a rendered prompt is to an engine: the checkpoint's tokenizer, the same specials."""

    def count(prompt: str) -> int:
        return len(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])

    return count


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """Cut `text` at the earliest occurrence of any stop string (the stop string is dropped)."""
    cut = len(text)
    for s in stop:
        if s:
            idx = text.find(s)
            if idx != -1:
                cut = min(cut, idx)
    return text[:cut]


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model_profile: Mapping[str, Any] | None = None) -> list[int]:
    """The token ids that end a generation: the tokenizer's EOS, and the registered model's.

    ``model_profile`` is the profile recorded when the lineage's base (or the reference) was
    registered (apps.ml.base_models.model_profile): every EOS id its generation_config.json listed
    and the family's end-of-turn tokens (Qwen3 ends a chat turn with <|im_end|>, which is not its
    tokenizer's EOS). It comes from the registered model, never from the checkpoint being scored,
    whose files its training run wrote.
    """
    ids: list[int] = []
    candidates: list[Any] = [tokenizer.eos_token_id, *((model_profile or {}).get("eos_token_ids") or [])]
    vocab = tokenizer.get_vocab()
    candidates += [vocab.get(str(token)) for token in (model_profile or {}).get("stop_tokens") or []]
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0 and value not in ids:
            ids.append(value)
    return ids


def _cut_at_eos(row: list[int], eos: Sequence[int]) -> list[int]:
    cut = min((row.index(i) for i in eos if i in row), default=len(row))
    return row[:cut]


def _decoding_kwargs(sampling: Mapping[str, Any] | None) -> dict[str, Any]:
    if sampling is None:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": float(sampling.get("temperature", 1.0)),
        "top_p": float(sampling.get("top_p", 1.0)),
        "top_k": 0,  # no top-k cut: the task says temperature and top_p only
    }


@torch.inference_mode()
def generate_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    batch_size: int = 32,
    add_special_tokens: bool = True,
    sampling: Mapping[str, Any] | None = None,
    eos_ids: Sequence[int] | None = None,
) -> list[str]:
    """Greedy continuations of `prompts`, cut at EOS and at the first stop string.

    `eos_ids` are the ids that end a generation (`stop_token_ids`; the tokenizer's EOS by default).

    `sampling` (``temperature``, ``top_p``) decodes by sampling instead, for the task-environment
    reliability filter, which repeats a task under its own decoding; seed torch before calling.
    Sealed evaluation never passes it.

    Batches are left-padded so every prompt ends where generation starts; the attention mask and
    the position ids derived from it make padding invisible to the model.
    """
    tokenizer.padding_side = "left"
    target = device()
    model.to(target)  # type: ignore[arg-type]  # transformers' stub wraps .to() oddly
    model.train(False)  # eval mode; .eval() is untyped in the stubs
    eos = list(eos_ids) if eos_ids else stop_token_ids(tokenizer)
    outputs: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens).to(target)
        generated: torch.Tensor = model.generate(  # type: ignore[operator]
            **enc,
            max_new_tokens=max_new_tokens,
            **_decoding_kwargs(sampling),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos or None,  # a tokenizer without an EOS: none, as before
            # Stop strings end a sequence early (the batch ends when all have); the text is cut
            # again below, so results do not depend on how generation stopped.
            stop_strings=[s for s in stop if s] or None,
            tokenizer=tokenizer,
        )
        for row in generated[:, enc["input_ids"].shape[1] :].tolist():
            text = str(tokenizer.decode(_cut_at_eos(row, eos), skip_special_tokens=True))
            outputs.append(truncate_at_stop(text, stop))
    return outputs


class GenerationFailed(RuntimeError):
    """Every step of the max-tokens retry cascade failed for some prompts."""


def sampling_settings(decoding: dict[str, Any]) -> dict[str, float] | None:
    """Explicit sampling settings (temperature, top_p, top_k), or None for greedy decoding.

    Nothing is left to an engine's or a checkpoint's defaults: HF would apply top_k=50 and vLLM
    would read generation_config.json for whatever is unset.
    """
    if not is_sampled(decoding):
        return None
    return {
        "temperature": float(decoding["temperature"]),
        "top_p": float(decoding.get("top_p", 1.0)),
        # 0 disables top-k filtering in HF; vLLM takes 0 or -1 for the same.
        "top_k": int(decoding.get("top_k", 0)),
    }


@torch.inference_mode()
def sample_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    seeds: Sequence[int],
    sampling: dict[str, float],
    max_new_tokens: int,
    stop: Sequence[str] = (),
    add_special_tokens: bool = True,
    eos_ids: Sequence[int] | None = None,
) -> list[str]:
    """Sampled continuations, one prompt at a time, each under its own seed (reproducible per sample)."""
    target = device()
    model.to(target)  # type: ignore[arg-type]  # transformers' stub wraps .to() oddly
    model.train(False)
    eos = list(eos_ids) if eos_ids else stop_token_ids(tokenizer)
    outputs: list[str] = []
    for prompt, seed in zip(prompts, seeds, strict=True):
        enc = tokenizer([prompt], return_tensors="pt", add_special_tokens=add_special_tokens).to(target)
        torch.manual_seed(int(seed))
        generated: torch.Tensor = model.generate(  # type: ignore[operator]
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            top_k=int(sampling["top_k"]),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos or None,  # a tokenizer without an EOS: none, as before
            stop_strings=[s for s in stop if s] or None,
            tokenizer=tokenizer,
        )
        row = _cut_at_eos(generated[0, enc["input_ids"].shape[1] :].tolist(), eos)
        outputs.append(truncate_at_stop(str(tokenizer.decode(row, skip_special_tokens=True)), stop))
    return outputs


# (prompts, max_tokens, seeds or None) -> texts; one engine call, which may raise.
GenerateFn = Callable[[list[str], int, "list[int] | None"], list[str]]


def generate_with_cascade(
    generate: GenerateFn,
    prompts: Sequence[str],
    ids: Sequence[str],
    *,
    max_tokens: int,
    batch_size: int,
    run_seed: int | None,
    epoch: int = 0,
) -> tuple[list[str], list[int]]:
    """Generate every prompt, retrying a failed batch with fewer max tokens (the retry cascade).

    Returns the texts and, per prompt, the cascade step that produced it (0: the benchmark's own
    max tokens). With a `run_seed` (sampled decoding) each prompt gets the per-sample seed of
    (run seed, sample id, epoch, call = cascade step). Raises GenerationFailed when the last step
    fails too.
    """
    texts: list[str] = []
    steps: list[int] = []
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        batch_ids = list(ids[start : start + batch_size])

        def attempt(call: int, limit: int, batch: list[str] = batch, batch_ids: list[str] = batch_ids) -> list[str]:
            seeds = None if run_seed is None else [sample_seed(run_seed, i, epoch, call) for i in batch_ids]
            return generate(batch, limit, seeds)

        try:
            out, call = with_cascade(attempt, max_tokens=max_tokens, failures=GENERATION_FAILURES)
        except CascadeExhausted as exc:
            raise GenerationFailed(f"samples {batch_ids[:3]}…: every retry failed: {exc}") from None
        texts.extend(out)
        steps.extend([call] * len(batch))
    return texts, steps


def evaluate(
    *,
    checkpoint_dir: Path,
    samples: list[dict[str, Any]],
    task: dict[str, Any],
    batch_size: int = 32,
    backend: Literal["hf", "vllm", "vllm-external"] = "hf",
    vllm_url: str | None = None,
    served_dir: Path | None = None,
    scorer: Callable[[str, str], bool] | None = None,
    run_seed: int = 0,
    epoch: int = 0,
    model_profile: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run the sealed samples through the checkpoint with the task's fixed inference settings.

    `samples` are rows `{"id", "prompt", "answer"}`; `task` is the task.json dict. Returns one
    `{"id", "output", "correct", "retries"}` per sample, in order (plus `"seed"`, the per-sample
    seed, under sampled decoding). Every engine renders the same prompts and applies the same
    decoding and stop strings, so their results are interchangeable. `scorer` (output, answer) ->
    correct is the benchmark's sealed evaluator when the caller has one (the evaluation job always
    does); without it the task's evaluator is looked up by name. For vLLM, `vllm_url` is the
    server and `served_dir` the folder it serves (a managed server's private copy; by default
    `checkpoint_dir`). A generation that fails is retried with fewer max tokens; when every retry
    fails, GenerationFailed is raised (the caller counts that seed as failed). `model_profile` is the
    registered model's (`stop_token_ids`): its EOS ids end generations on every engine. The context
    rule (apps.ml.context) caps each prompt's max tokens before any engine sees it; a row it touched
    says so (``max_tokens`` and ``prompt_tokens``, or ``over_context``).
    """
    decoding = task.get("decoding", {})
    sampling = sampling_settings(decoding)
    if decoding.get("do_sample") and sampling is None:
        raise ValueError("do_sample=true needs an explicit temperature above 0 (or set do_sample=false)")
    max_new_tokens = max_tokens_of(decoding)
    stop = stop_strings_of(task)
    specials = uses_special_tokens(task)

    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir, trust_remote_code=False, local_files_only=True)
    prompts = [render_prompt(task, str(s["prompt"]), tokenizer) for s in samples]
    ids = [str(s["id"]) for s in samples]
    # The context rule (apps.ml.context), before either engine sees a prompt: the tokens counted
    # as both engines tokenize the rendered text (with the same special tokens).
    fits = fit_prompts(
        prompts, count=prompt_counter(tokenizer, add_special_tokens=specials), max_tokens=max_new_tokens,
        context=model_context(checkpoint_dir),
    )  # fmt: skip
    eos = stop_token_ids(tokenizer, model_profile)
    generate: GenerateFn
    if backend == "hf":
        model, _ = load_checkpoint(checkpoint_dir)

        def generate(batch: list[str], limit: int, seeds: list[int] | None) -> list[str]:
            if sampling is None or seeds is None:
                return generate_texts(
                    model,
                    tokenizer,
                    batch,
                    max_new_tokens=limit,
                    stop=stop,
                    batch_size=len(batch),
                    add_special_tokens=specials,
                    eos_ids=eos,
                )
            return sample_texts(
                model,
                tokenizer,
                batch,
                seeds=seeds,
                sampling=sampling,
                max_new_tokens=limit,
                stop=stop,
                add_special_tokens=specials,
                eos_ids=eos,
            )

    elif backend in ("vllm", "vllm-external"):
        if not vllm_url:
            raise ValueError("a vLLM engine needs vllm_url (the base URL of a `vllm serve` process)")
        url = vllm_url
        served = str(served_dir or checkpoint_dir)

        def generate(batch: list[str], limit: int, seeds: list[int] | None) -> list[str]:
            raw = vllm_complete(
                url,
                model=served,
                prompts=batch,
                max_tokens=limit,
                stop=stop,
                batch_size=len(batch),
                add_special_tokens=specials,
                sampling=sampling,
                seeds=seeds,
                stop_token_ids=eos,
            )
            return [truncate_at_stop(text, stop) for text in raw]

    else:
        raise ValueError(f"unknown backend {backend!r}; use 'hf', 'vllm' or 'vllm-external'")

    outputs, steps = generate_with_cascade(
        within_context(generate, fits),
        prompts,
        ids,
        max_tokens=max_new_tokens,
        batch_size=batch_size,
        run_seed=None if sampling is None else run_seed,
        epoch=epoch,
    )

    if scorer is None:
        evaluator = str(task["evaluator"])

        def scorer(output: str, answer: str) -> bool:
            return score(evaluator, output, answer)

    rows: list[dict[str, Any]] = []
    for s, prompt, out, step in zip(samples, prompts, outputs, steps, strict=True):
        row = {"id": s["id"], "output": out, "correct": bool(scorer(out, str(s["answer"]))), "retries": step}
        row_context(row, fits[prompt], max_new_tokens)
        if sampling is not None:
            row["seed"] = sample_seed(run_seed, str(s["id"]), epoch, step)
        rows.append(row)
    return rows


def evaluate_seeds(*, seeds: Sequence[int], **kwargs: Any) -> list[dict[str, Any]]:
    """The final evaluation under each run seed: `{"seed", "status": "ok" | "failed", "rows" | "error"}`.

    A seed whose generation failed through the whole retry cascade is recorded as failed and left
    out of the mean (`apps.experiments.final_eval`); it is never silently dropped.
    """
    results: list[dict[str, Any]] = []
    for seed in seeds:
        try:
            rows = evaluate(run_seed=int(seed), **kwargs)
        except GenerationFailed as exc:
            results.append({"seed": int(seed), "status": "failed", "error": str(exc)[:1000]})
        else:
            results.append({"seed": int(seed), "status": "ok", "rows": rows})
    return results
