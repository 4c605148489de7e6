"""Any local Hugging Face causal LM as θ0 or as the reference: resolve it, check it, profile it.

A model is named by a local folder or a hub id. A hub id is resolved in the local Hugging Face
cache only (``HF_HUB_OFFLINE``; `huggingface_hub.snapshot_download(local_files_only=True)`):
nothing is downloaded at run time, so an operator fetches the model once (``hf download
Qwen/Qwen3-1.7B-Base``) and registers it from the cache or from a copy.

The profile records what inference depends on beyond the weights, as PostTrainBench pins it per
model family: the family (PostTrainBench's rule: the name mentions qwen / llama / gemma / smollm,
else config.json's first architecture), the chat template (the checkpoint's own, or a pinned
template file the operator gives, like PostTrainBench's templates/qwen3.jinja — its sha256 either
way), and EOS handling: the tokenizer's EOS, every EOS id generation_config.json lists (Qwen3 ends
chat turns with <|im_end|> and documents with <|endoftext|>), and the family's end-of-turn
strings found in the vocabulary.
"""

from __future__ import annotations

import apps.ml.offline  # noqa: F401 - before transformers: the Hub stays off

# isort: split
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

# End-of-turn / end-of-text strings by family (the tokens each family's chat format ends on).
FAMILY_STOP_TOKENS: dict[str, tuple[str, ...]] = {
    "qwen": ("<|im_end|>", "<|endoftext|>"),
    "llama": ("<|eot_id|>", "<|end_of_text|>", "</s>"),
    "gemma": ("<end_of_turn>", "<eos>"),
    "smollm": ("<|im_end|>", "<|endoftext|>"),
    "other": (),
}
_FAMILY_ORDER = ("qwen", "llama", "gemma", "smollm")


class ModelRefused(ValueError):
    """The folder or hub id is not a loadable, safe causal LM (the message says what to fix)."""


def resolve_model(source: str) -> Path:
    """The local folder of `source`: a path, or a hub id found in the local Hugging Face cache."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists() or source.startswith(("/", ".", "~")) or source.count("/") != 1:
        raise ModelRefused(f"{source!r} is not a model folder nor a hub id of the form owner/name")
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - only hub ids need it
    from huggingface_hub.errors import LocalEntryNotFoundError  # noqa: PLC0415

    try:
        # Read at call time (huggingface_hub fixes its default when first imported).
        cache_dir = os.environ.get("HF_HUB_CACHE") or None
        return Path(snapshot_download(repo_id=source, local_files_only=True, cache_dir=cache_dir)).resolve()
    except LocalEntryNotFoundError:
        raise ModelRefused(
            f"{source!r} is not in the local Hugging Face cache and nothing is downloaded at run time: "
            f"fetch it once where there is network (`hf download {source}`), or give its folder"
        ) from None


def model_family(name: str, config: dict[str, Any]) -> str:
    """PostTrainBench's family rule: a family named in the model's name, else in its architecture."""
    lowered = name.lower()
    for family in _FAMILY_ORDER:
        if family in lowered:
            return family
    architecture = str((config.get("architectures") or [""])[0]).lower()
    for family in _FAMILY_ORDER:
        if family in architecture:
            return family
    return "other"


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def model_profile(directory: Path, *, name: str, chat_template: str | None = None) -> dict[str, Any]:
    """Check that `directory` holds a safe causal LM and return its inference profile.

    Refuses remote code (``auto_map``), architectures that are not causal LMs, and folders whose
    weights are not all safetensors. `chat_template` is a pinned template's text that will
    replace the checkpoint's own (the caller writes it as chat_template.jinja).
    """
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelRefused(f"{directory} has no config.json: not a Hugging Face model folder")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("auto_map"):
        raise ModelRefused(f"{name} needs remote code (config.json has auto_map); only built-in architectures load")
    model_type = str(config.get("model_type", ""))
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelRefused(f"{name}: model_type {model_type!r} is not a causal LM transformers can load")
    weights = sorted(p.name for p in directory.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth"))
    if not any(w.endswith(".safetensors") for w in weights):
        raise ModelRefused(f"{name} has no .safetensors weights (pickle weights are never loaded): {weights[:5]}")
    pickles = [w for w in weights if not w.endswith(".safetensors")]
    if pickles:
        raise ModelRefused(f"{name} also ships pickle weights {pickles[:3]}; remove them from a local copy")
    AutoConfig.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False, local_files_only=True)

    family = model_family(name, config)
    template = chat_template if chat_template is not None else tokenizer.chat_template
    generation: dict[str, Any] = {}
    gen_path = directory / "generation_config.json"
    if gen_path.is_file():
        generation = json.loads(gen_path.read_text(encoding="utf-8"))
    eos_ids: list[int] = []
    raw_eos = generation.get("eos_token_id", config.get("eos_token_id"))
    for value in raw_eos if isinstance(raw_eos, list) else [raw_eos]:
        if isinstance(value, int) and value not in eos_ids:
            eos_ids.append(value)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.insert(0, int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    return {
        "source": name,
        "family": family,
        "model_type": model_type,
        "architecture": str((config.get("architectures") or [""])[0]),
        "chat_template_source": "pinned" if chat_template is not None else ("checkpoint" if template else "none"),
        "chat_template_sha256": _sha256_text(template) if template else "",
        "eos_token": tokenizer.eos_token,
        "eos_token_ids": eos_ids,
        "bos_token": tokenizer.bos_token,
        "pad_token": tokenizer.pad_token,
        "stop_tokens": [t for t in FAMILY_STOP_TOKENS[family] if t in vocab],
        # Sampling defaults an engine could take from the checkpoint; evaluations never do.
        "generation_config_defaults": {
            k: generation[k] for k in ("do_sample", "temperature", "top_p", "top_k") if k in generation
        },
    }
