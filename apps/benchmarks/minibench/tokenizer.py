"""Character-level tokenizer for the minibench, trained locally with `tokenizers`.

Character level keeps the vocabulary tiny (a few dozen symbols), so a ~1M-parameter model spends its
capacity on the tasks rather than on embeddings, and every string the tasks use round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD = "<pad>"
BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]

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


def train_tokenizer(corpus: Iterable[str]) -> PreTrainedTokenizerFast:
    """Learn the character alphabet of `corpus` and wrap it as a HF fast tokenizer.

    A BPE model whose vocabulary budget equals the alphabet size learns no merges, i.e. it is a
    character tokenizer that still saves and loads through the standard `tokenizer.json` path.
    """
    texts = list(corpus)
    alphabet = sorted({ch for text in texts for ch in text})
    trainer = trainers.BpeTrainer(
        vocab_size=len(SPECIAL_TOKENS) + len(alphabet),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    core = Tokenizer(models.BPE(unk_token=UNK))
    # No pre-tokenizer: spaces and newlines are ordinary characters, so decode(encode(x)) == x.
    core.train_from_iterator(texts, trainer=trainer)
    bos_id = core.token_to_id(BOS)
    # A BOS anchor at position 0 helps a tiny model; both TRL and the evaluators tokenize with
    # add_special_tokens=True, so training and inference see the same prefix.
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
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
