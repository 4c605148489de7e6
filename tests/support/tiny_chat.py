"""A tiny chat model built locally for the agent-training tests: byte-level BPE, a tool-aware
chat template, and a randomly initialised 2-layer Llama. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
# Every turn ends with <|end|>, the EOS: a trained assistant turn learns to stop.
TOOL_TEMPLATE = (
    "{%- if tools %}<|system|>Tools: {{ tools | tojson }}<|end|>{% endif -%}"
    "{%- for m in messages -%}"
    "<|{{ m.role }}|>{% if m.content %}{{ m.content }}{% endif -%}"
    "{%- for c in m.tool_calls or [] -%}"
    '<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</tool_call>'
    "{%- endfor -%}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
)
# A common template bug: the end-of-turn token opens the next turn instead of closing this one,
# so the last assistant turn has none and the others' sits outside their span.
LEADING_END_TEMPLATE = (
    "{%- for m in messages -%}{% if not loop.first %}<|end|>{% endif %}<|{{ m.role }}|>{{ m.content }}{%- endfor -%}"
    "{%- if add_generation_prompt %}{% if messages %}<|end|>{% endif %}<|assistant|>{% endif -%}"
)


def build_tiny_chat_model(out_dir: Path, corpus: list[str], *, template: str = TOOL_TEMPLATE, seed: int = 0) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>")
    tokenizer.chat_template = template
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
