"""An agent's read of catalog or outside data, through the sealed-item screen (``apps.integrity.screen``).

The one way in for ``worker_inspect_data`` and the 22 discovery tools: the answer is screened
as a whole, and when anything was withheld the read is recorded (``sealed_withholding_record``)
before the answer leaves. Every agent role is screened: the Main Agent and Workers may never see
a sealed item, and a Reviewer never sees a reference answer, which a copied item carries.
"""

from __future__ import annotations

from typing import Any

from apps.expos.registry import ToolContext
from apps.integrity.screen import benchmark_screen
from apps.integrity.services import sealed_withholding_record

# How the answers list what was withheld (added to each screened tool's output schema).
WITHHELD_SCHEMA: dict[str, Any] = {
    "type": "array",
    "description": "Parts left out because they match sealed evaluation items: where (a JSON path into this "
    "answer; lines for a text) and why. The read is recorded.",
    "items": {
        "type": "object",
        "properties": {"at": {"type": "string"}, "lines": {"type": "string"}, "reason": {"type": "string"}},
        "required": ["at", "reason"],
    },
}


def screened_answer(ctx: ToolContext, *, tool: str, arguments: Any, answer: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``answer`` with every part matching a sealed item withheld, and the public list of those parts.

    Raises ``SealBroken`` (409) when a benchmark's sealed data fails its hashes: then nothing is
    known to be safe to show.
    """
    screened, withheld = benchmark_screen().value(answer)
    if withheld:
        sealed_withholding_record(
            run=ctx.run,
            node=ctx.node,
            actor=ctx.actor,
            role=ctx.role,
            tool=tool,
            arguments=arguments,
            withheld=withheld,
        )
    return screened, [part.public() for part in withheld]
