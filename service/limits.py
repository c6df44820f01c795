"""How much model work one request may ask for: the style scorer holds one lock, so one huge proposal
would make every other score wait (600 order lines took 40 s on this project's CPU box)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from outcome_flywheel.preferences.audit_log import MAX_JSON_DEPTH, json_depth

MAX_ORDERS = 25  # a rebalance proposal is a handful of orders; the bundled log's largest has 4
# The prompt (context and note, or a verbatim prompt) in UTF-8 bytes: a byte-level BPE token covers at
# least one byte, so this also caps the prompt's tokens.
MAX_PROMPT_BYTES = 4096


def proposal_size_problem(
    orders: Sequence[Any], context: Mapping[str, Any] | None, text: str | None, prompt: str | None = None
) -> str | None:
    """Why a proposal is too big to score, or None."""
    if len(orders) > MAX_ORDERS:
        return f"{len(orders)} orders: at most {MAX_ORDERS} are scored at once"
    if context is not None and json_depth(dict(context)) > MAX_JSON_DEPTH:
        return f"the context nests objects or lists more than {MAX_JSON_DEPTH} deep"
    size = (
        len(json.dumps(context or {}, default=str).encode()) + len((text or "").encode()) + len((prompt or "").encode())
    )
    if size > MAX_PROMPT_BYTES:
        return f"the prompt (context, note or prompt text) is {size} bytes: at most {MAX_PROMPT_BYTES}"
    return None
