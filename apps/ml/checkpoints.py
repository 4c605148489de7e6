"""Local HF checkpoints: load (safetensors only, no remote code), device choice, tokenizer files."""

from __future__ import annotations

import apps.ml.offline  # noqa: F401 - before transformers: the Hub stays off

# isort: split
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

# Workers report progress through hooks; per-load progress bars would only clutter job logs.
hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


# Files that define the tokenizer; copied verbatim from the base so that training never changes
# the vocabulary, special tokens or chat template (which the integrity checks compare).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_checkpoint(checkpoint_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local HF checkpoint; refuses pickle weights and remote code."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir, trust_remote_code=False, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint_dir,
        dtype=torch.float32,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
    )
    return model, tokenizer
