"""Render conversations with a Hugging Face chat template and count their tokens, without transformers.

The trajectory export (apps.dojo.export) runs in the web server, which loads no ML stack (no torch,
transformers, TRL, datasets): it states each row's token count under a tokenizer the operator
names. This module renders as ``PreTrainedTokenizerBase.apply_chat_template`` does (Jinja's
immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, ``loopcontrols``, a ``tojson`` that
does not escape HTML, ``raise_exception``, ``strftime_now``, the tokenizer's special tokens as
variables, ``{% generation %}`` blocks rendered as they are) and tokenizes the text as
``apply_chat_template(tokenize=True)`` does: with ``tokenizers`` and no special tokens added.
tests/apps/dojo/test_trajectory_trl.py checks the counts against TRL's own tokenization.

A folder is read as ``save_pretrained`` writes it: ``tokenizer.json``, the template in
``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template`` (a list of named templates:
its ``default``), the special tokens in ``tokenizer_config.json`` / ``special_tokens_map.json``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """A folder that is no chat tokenizer, or a template that refuses a conversation (its own message)."""


class _Generation(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` (training templates): the body, rendered as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().astimezone().strftime(fmt)  # local time, as HF
    return env


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"{path} is not JSON: {exc}") from None
    return value if isinstance(value, dict) else {}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ChatTokenizer:
    """A tokenizer and its chat template, as a folder holds them."""

    name: str
    tokenizer: Tokenizer
    template: jinja2.Template
    special_tokens: dict[str, str]
    tokenizer_sha256: str
    template_sha256: str

    def describe(self) -> dict[str, str]:
        return {
            "name": self.name,
            "tokenizer_sha256": self.tokenizer_sha256,
            "chat_template_sha256": self.template_sha256,
        }

    def render(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = False) -> str:  # fmt: skip
        """The template's text for the conversation (ChatTemplateError: the template refused it)."""
        try:
            return self.template.render(
                messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt,
                documents=None, **self.special_tokens,
            )  # fmt: skip
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from None

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def load_chat_tokenizer(directory: Path | str) -> ChatTokenizer:
    """The chat tokenizer saved in ``directory`` (ChatTemplateError naming what is missing)."""
    folder = Path(directory)
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ChatTemplateError(f"{folder} holds no tokenizer.json (a fast tokenizer saved with save_pretrained)")
    config = _read_json(folder / "tokenizer_config.json")
    template_file = folder / "chat_template.jinja"
    source: Any = template_file.read_text(encoding="utf-8") if template_file.is_file() else config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        raise ChatTemplateError(f"{folder} has no chat template (chat_template.jinja or tokenizer_config.json)")
    try:
        template = _environment().from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"the chat template in {folder} does not compile: {exc}") from None
    special = {**_read_json(folder / "special_tokens_map.json"), **config}
    tokens = {key: text for key in SPECIAL_TOKENS if (text := _token_text(special.get(key))) is not None}
    data = tokenizer_file.read_bytes()
    return ChatTokenizer(
        name=folder.name, tokenizer=Tokenizer.from_str(data.decode("utf-8")), template=template,
        special_tokens=tokens, tokenizer_sha256=_sha256(data), template_sha256=_sha256(source.encode("utf-8")),
    )  # fmt: skip
