"""What the trainer reads from a data row, by field name and in training order (no torch, no Django).

The trainer (``apps.ml.training``) takes an SFT row's ``prompt`` then its ``completion``, and a DPO
row's ``prompt`` with ``chosen`` and the same ``prompt`` with ``rejected``, whatever order the
keys have in the JSON; a chat row (agent trajectories, ``apps.ml.agent_sft``) is its ``messages``
in list order. The contamination scanner reads rows through :func:`training_texts`, so it scans
the text the model is trained on, in the order it is trained on, not the file's key order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

FORMAT_KEYS: dict[str, tuple[str, ...]] = {"sft": ("prompt", "completion"), "dpo": ("prompt", "chosen", "rejected")}


def row_format(row: Any) -> str | None:
    """ "sft", "dpo" or "chat" when the row has that format's fields (DPO first: it has a prompt too)."""
    if not isinstance(row, dict):
        return None
    for name in ("dpo", "sft"):
        if all(isinstance(row.get(key), str) for key in FORMAT_KEYS[name]):
            return name
    if isinstance(row.get("messages"), list):
        return "chat"
    return None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def training_texts(row: Any) -> list[str]:
    """The row's texts in training order: SFT prompt, completion; DPO prompt, chosen, rejected (the
    prompt once, then each side as the trainer appends it); chat messages in order.

    Fields the trainer does not read come after, in key order, so nothing in the row goes unread.
    A row of no known format is every string in it, in order.
    """
    kind = row_format(row)
    if kind is None:
        return list(_strings(row))
    if kind == "sft":
        texts = [row["prompt"], row["completion"]]
    elif kind == "dpo":
        # Each side follows the prompt as the trainer pairs them; the prompt is read once, since a
        # second copy would put the prompt's numbers after the chosen answer and make number runs
        # that are in neither sequence the model sees ("55 ... 47 | 102 | 55 ... 47" holds 47, 55, 102).
        texts = [row["prompt"], row["chosen"], row["rejected"]]
    else:
        texts = [t for message in row["messages"] for t in _strings(message)]
    used = FORMAT_KEYS.get(kind, ("messages",))
    texts.extend(t for key, value in row.items() if key not in used for t in _strings(value))
    return texts
