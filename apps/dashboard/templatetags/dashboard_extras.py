"""Template filters of the dashboard pages."""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

from apps.integrity.choices import ADJUDICATION_MEANING, OBSERVATION_MEANING

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON for <pre> blocks (autoescaped by the template like any other text)."""
    return json.dumps(value, indent=2, sort_keys=True, cls=DjangoJSONEncoder, ensure_ascii=False)


@register.filter
def percent(value: Any, digits: int = 1) -> str:
    """0.4567 -> "45.7%"; None -> "—"."""
    if value is None:
        return "—"
    return f"{100 * float(value):.{int(digits)}f}%"


@register.filter
def humanize_key(value: Any) -> str:
    """weight_provenance -> weight provenance."""
    return str(value).replace("_", " ")


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    """dict lookup with a variable key: {{ experiments|get_item:handle }}."""
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def code_meaning(code: Any) -> str:
    """An observation or adjudication code's meaning (apps.integrity.choices), for titles and legends."""
    key = str(code or "")
    return OBSERVATION_MEANING.get(key) or ADJUDICATION_MEANING.get(key) or ""


# CommonMark with raw HTML off: a note's "<script>" or "<img onerror>" is shown as text, and
# markdown-it refuses javascript:, vbscript: and data: (non-image) link targets.
_MARKDOWN = MarkdownIt("commonmark", {"html": False})


@register.filter
def markdown(value: str) -> SafeString:
    """A person's markdown note as HTML that carries no markup of their own."""
    rendered: str = _MARKDOWN.render(value or "")
    return mark_safe(rendered)  # noqa: S308 - html disabled: every tag is escaped
