"""Any local HF causal LM as θ0 or reference: from a folder or a cached hub id, never downloaded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from apps.benchmarks.services import checkpoint_local_dir
from apps.core.errors import ApplicationError, Conflict
from apps.core.hashing import sha256_tree
from apps.experiments.base_models import model_register
from apps.experiments.models import Checkpoint
from apps.ml.checkpoints import load_checkpoint

pytestmark = pytest.mark.django_db

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _save_tiny_qwen3(folder: Path) -> Path:
    """A 2-layer Qwen3 with a small word-level tokenizer, saved as an operator's local copy would be."""
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, "[UNK]", *[f"w{i}" for i in range(60)]])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="[UNK]"
    )
    tokenizer.chat_template = TEMPLATE
    config = Qwen3Config(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        eos_token_id=vocab["<|im_end|>"], pad_token_id=vocab["<|endoftext|>"],
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    model.generation_config.temperature = 0.6  # a default evaluations must not inherit
    model.generation_config.do_sample = True
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_tiny_qwen3(tmp_path_factory.mktemp("models") / "Qwen3-tiny-Base")


@pytest.fixture
def roots(settings, tmp_path: Path) -> Path:
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.ARTIFACT_CACHE_DIR = str(tmp_path / "artifact-cache")
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    return tmp_path


def test_a_local_folder_registers_as_theta0_with_its_family_template_and_eos(tiny_qwen: Path, roots: Path) -> None:
    checkpoint, created = model_register(source=str(tiny_qwen), role="base", handle="qwen3-tiny-base")
    assert created
    assert checkpoint.is_base
    assert not checkpoint.is_reference
    assert checkpoint.parent is None
    stored = checkpoint_local_dir(checkpoint=checkpoint)
    assert stored.is_relative_to(roots / "artifacts")
    assert sha256_tree(stored) == checkpoint.manifest == sha256_tree(tiny_qwen)
    profile = checkpoint.model_profile
    assert profile["family"] == "qwen"
    assert profile["architecture"] == "Qwen3ForCausalLM"
    assert profile["chat_template_source"] == "checkpoint"
    assert profile["chat_template_sha256"] == hashlib.sha256(TEMPLATE.encode()).hexdigest()
    assert profile["eos_token"] == "<|im_end|>"
    assert profile["eos_token_ids"] == [2, 0]  # <|im_end|> first, then generation_config's <|endoftext|>
    assert profile["stop_tokens"] == ["<|im_end|>", "<|endoftext|>"]
    assert profile["generation_config_defaults"] == {"do_sample": True, "temperature": 0.6}
    model, tokenizer = load_checkpoint(stored)  # loads with the project's own safe loader
    assert model.config.model_type == "qwen3"
    assert tokenizer.eos_token == "<|im_end|>"
    # Idempotent; the same handle with other files is refused.
    assert model_register(source=str(tiny_qwen), role="base", handle="qwen3-tiny-base") == (checkpoint, False)
    other = _save_tiny_qwen3(roots / "other-qwen3")
    with pytest.raises(Conflict, match="registered with other files"):
        model_register(source=str(other), role="base", handle="qwen3-tiny-base")


def test_a_hub_id_resolves_from_the_local_cache_only(tiny_qwen: Path, roots: Path, monkeypatch) -> None:
    cache = roots / "hf-cache"
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--acme--Qwen3-tiny-Base"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    # The layout `hf download acme/Qwen3-tiny-Base` leaves: snapshot files linking into blobs.
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for path in tiny_qwen.iterdir():
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(blob)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    checkpoint, created = model_register(source="acme/Qwen3-tiny-Base", role="reference", handle="qwen3-tiny-ref")
    assert created
    assert checkpoint.is_reference
    assert not checkpoint.is_base
    stored = checkpoint_local_dir(checkpoint=checkpoint)
    assert stored.is_relative_to(roots / "sealed")  # references stay where only evaluation workers read
    assert not any(p.is_symlink() for p in stored.rglob("*"))
    assert checkpoint.manifest == sha256_tree(tiny_qwen)
    assert checkpoint.model_profile["source"] == "acme/Qwen3-tiny-Base"

    with pytest.raises(ApplicationError, match=r"not in the local Hugging Face cache.*hf download acme/Absent") as exc:
        model_register(source="acme/Absent", role="base", handle="absent")
    assert exc.value.status_code == 404


def test_a_pinned_chat_template_replaces_the_models_and_is_recorded(tiny_qwen: Path, roots: Path) -> None:
    pinned = roots / "qwen3.jinja"
    pinned.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}<|im_end|>{% endfor %}")
    out = roots / "out.json"
    call_command(
        "model_add", str(tiny_qwen), "--handle", "qwen3-pinned", "--chat-template", str(pinned), stdout=out.open("w")
    )
    printed = json.loads(out.read_text())
    checkpoint = Checkpoint.objects.get(handle="qwen3-pinned")
    assert printed["model_profile"] == checkpoint.model_profile
    assert checkpoint.model_profile["chat_template_source"] == "pinned"
    assert checkpoint.model_profile["chat_template_sha256"] == hashlib.sha256(pinned.read_bytes()).hexdigest()
    _, tokenizer = load_checkpoint(checkpoint_local_dir(checkpoint=checkpoint))
    assert tokenizer.chat_template == pinned.read_text()
    assert checkpoint.manifest != sha256_tree(tiny_qwen)  # the pinned template is part of the weights' record


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: _edit_config(d, auto_map={"AutoModelForCausalLM": "modeling.Evil"}), "needs remote code"),
        (lambda d: (d / "pytorch_model.bin").write_bytes(b"pickle"), "pickle weights"),
        (lambda d: _edit_config(d, model_type="vit"), "not a causal LM"),
        (lambda d: (d / "config.json").unlink(), "no config.json"),
    ],
    ids=["remote-code", "pickle", "not-causal", "no-config"],
)
def test_unsafe_or_unloadable_models_are_refused_and_nothing_is_written(
    tiny_qwen: Path, roots: Path, change, message: str
) -> None:
    import shutil  # noqa: PLC0415

    copy = roots / "Qwen3-copy"
    shutil.copytree(tiny_qwen, copy)
    change(copy)
    before = Checkpoint.objects.count()
    with pytest.raises(ApplicationError, match=message):
        model_register(source=str(copy), role="base", handle="refused")
    assert Checkpoint.objects.count() == before
    assert not (roots / "artifacts").exists() or not any((roots / "artifacts").rglob("*.safetensors"))


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
