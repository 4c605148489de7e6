"""The minibench tokenizer: a small byte-level BPE trained locally with `tokenizers`.

Why not character level: a word problem is ~85 characters but ~30 BPE tokens, and training cost on
2 CPU cores is linear in tokens (measured: a character-level build needed ~15 min for the
reference run, over the budget). Digits are always split into single tokens, so arithmetic still
works digit by digit, and the byte-level alphabet means any text an agent brings is encodable.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD = "<pad>"
BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
VOCAB_SIZE = 1024

# Plain-text turns: the generation prompt ("Assistant:") is a prefix of the rendered assistant turn,
# which TRL needs to split prompt from completion when it applies the template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}System: {{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def train_tokenizer(corpus: Iterable[str], *, vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus` and wrap it as a HF fast tokenizer with explicit specials."""
    core = Tokenizer(models.BPE(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        # All 256 byte symbols, not just those seen: no input can fall back to <unk>.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer=trainer)
    bos_id = core.token_to_id(BOS)
    # A BOS anchor at position 0 helps a tiny model; TRL and the evaluators both tokenize with
    # add_special_tokens=True, so training and inference see the same prefix.
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        # Left padding is what batched generation needs; training collators pad explicitly anyway.
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
