"""Reading what people type into the pages' forms."""

from __future__ import annotations

import json
import re
from typing import Any

from service.errors import lone_surrogate

ORDER_LINE = re.compile(
    r"^\s*(buy|sell)\s+([A-Za-z][A-Za-z0-9.\-]{0,15})\s+([0-9]*\.?[0-9]+)\s*(%?)\s*$", re.IGNORECASE
)


class FormError(ValueError):
    """What a person typed that cannot be used, said so that they can fix it."""


def parse_order_lines(text: str) -> list[dict[str, Any]]:
    """`buy NVDA 5%` / `sell XOM 0.03` (a fraction, or a percentage with %), one order a line."""
    orders = []
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        match = ORDER_LINE.match(line)
        if not match:
            raise FormError(f"order line {number} ({line.strip()[:60]!r}) is not like 'buy NVDA 5%' or 'sell XOM 0.03'")
        side, symbol, amount, percent = match.groups()
        weight = float(amount) / 100.0 if percent else float(amount)
        orders.append({"symbol": symbol.upper(), "side": side.lower(), "weight": weight})
    return orders


def parse_context(text: str) -> dict[str, Any]:
    if not (text or "").strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise FormError(f"the context is not JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None
    except RecursionError:  # nested deeper than the parser's stack
        raise FormError("the context nests objects or lists too deeply") from None
    if not isinstance(value, dict):
        raise FormError('the context must be a JSON object, like {"regime": "risk-on"}')
    surrogate = lone_surrogate(value)  # `"\ud800"` typed as JSON: valid JSON, not text (as the API refuses it)
    if surrogate is not None:
        where, why = surrogate
        raise FormError(f"the context{''.join(f'[{k!r}]' for k in where)}: {why}")
    return value


def validation_text(err: Exception) -> str:
    """A pydantic error as one line a person can read."""
    if hasattr(err, "errors"):
        return "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'input'}: {e.get('msg')}" for e in err.errors()
        )
    return str(err)
