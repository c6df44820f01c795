"""The operator audit log: one JSON object a line, validated with pydantic.

    {"decision_id": "d-0001", "ts": "2025-11-26T10:00:00-05:00", "decision": "approve",
     "proposal": {"orders": [{"symbol": "NVDA", "side": "buy", "weight": 0.05}], "text": "optional"},
     "operator_orders": [...same shape, override only...], "reason": "optional", "context": {}}

Extra keys are kept (in `extra_json`), never refused. A line that does not parse or validate
becomes a quarantine row (line number, error, raw text) and the rest goes on. A repeated
`decision_id` keeps the last line (a correction appended later wins) and is counted, so

    n_lines (non-blank) = n_valid_unique + n_duplicates_dropped + n_quarantined.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any, Iterable, Literal
from zoneinfo import ZoneInfo

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DECISIONS = ("approve", "reject", "override")
# A decision's time must convert to every zone (year 1 at +14:00 is before year 1 in UTC) and be a
# time someone could have decided at; the T+5 window and the partition depend on it.
TS_EARLIEST = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
TS_LATEST = datetime(2100, 1, 1, tzinfo=dt_timezone.utc)
MAX_JSON_DEPTH = 32  # context and extra keys are small objects; deeper nesting is refused, not recursed into


def json_depth(value: Any) -> int:
    """How deeply `value` nests lists and dicts, counted without recursion (a hostile depth cannot
    exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


class Order(BaseModel):
    model_config = ConfigDict(extra="allow")

    symbol: str = Field(min_length=1, max_length=16)
    side: Literal["buy", "sell"]
    weight: float = Field(gt=0.0, le=1.0, description="Fraction of the portfolio, 0.05 = 5%.")

    @field_validator("symbol")
    @classmethod
    def _upper(cls, value: str) -> str:
        value = value.strip().upper()
        if not value or any(c.isspace() for c in value):
            raise ValueError("symbol must be one word")
        return value

    @field_validator("side", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


class Proposal(BaseModel):
    model_config = ConfigDict(extra="allow")

    orders: list[Order] = Field(default_factory=list)
    text: str | None = None


class AuditRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    decision_id: str = Field(min_length=1)
    ts: datetime
    decision: Literal["approve", "reject", "override"]
    proposal: Proposal
    operator_orders: list[Order] | None = None
    reason: str | None = None
    context: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep(cls, value: Any) -> Any:
        if isinstance(value, dict) and json_depth(value) > MAX_JSON_DEPTH:
            raise ValueError(f"the decision nests objects or lists more than {MAX_JSON_DEPTH} deep")
        return value

    @field_validator("decision", mode="before")
    @classmethod
    def _decision_lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("ts")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        # A naive time is ambiguous across time zones and the T+5 window depends on it.
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("ts must carry a UTC offset, e.g. 2025-11-26T10:00:00-05:00")
        try:
            utc = value.astimezone(dt_timezone.utc)
        except OverflowError:
            raise ValueError(f"ts {value.isoformat()} does not convert to UTC") from None
        if not TS_EARLIEST <= utc < TS_LATEST:
            raise ValueError(
                f"ts must lie between {TS_EARLIEST.date()} and {TS_LATEST.date()} (UTC), got {value.isoformat()}"
            )
        return value

    @model_validator(mode="after")
    def _orders_match_decision(self) -> "AuditRecord":
        if self.decision == "override" and not self.operator_orders:
            raise ValueError("an override needs operator_orders")
        if self.decision != "override" and self.operator_orders:
            raise ValueError(f"operator_orders are for overrides only, not {self.decision!r}")
        return self

    @property
    def extra(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


@dataclass
class ParsedLog:
    records: list[tuple[int, AuditRecord]]  # (line number, record), unique decision ids, file order
    quarantine: list[dict[str, Any]]
    n_lines: int  # non-blank lines
    n_blank: int = 0
    duplicates: dict[str, int] = field(default_factory=dict)  # decision_id -> lines dropped
    starts: list[tuple[str | None, int]] = field(default_factory=list)  # (file, line numbers before it) per source read

    def locate(self, line_number: int) -> tuple[str | None, int]:
        """(file, line in that file) of a line number counted across the sources."""
        source, offset = None, 0
        for name, start in self.starts:
            if start < line_number:
                source, offset = name, start
        return source, line_number - offset

    @property
    def n_valid(self) -> int:
        return len(self.records)

    @property
    def n_quarantined(self) -> int:
        return len(self.quarantine)

    @property
    def n_duplicates_dropped(self) -> int:
        return sum(self.duplicates.values())

    def reconciles(self) -> bool:
        return self.n_lines == self.n_valid + self.n_duplicates_dropped + self.n_quarantined


def _error_text(err: Exception) -> str:
    if isinstance(err, ValidationError):
        parts = []
        for e in err.errors():
            loc = ".".join(str(x) for x in e["loc"]) or "(line)"
            parts.append(f"{loc}: {e['msg']}")
        return "; ".join(parts)
    return f"{type(err).__name__}: {err}"


def parse_lines(lines: Iterable[str]) -> ParsedLog:
    """Validate every line; bad ones to quarantine; repeated decision ids keep the last line."""
    return parse_sources([(None, lines)])


def parse_sources(sources: Iterable[tuple[str | None, Iterable[str]]]) -> ParsedLog:
    """`parse_lines` over several files read as one log, in order (the audit log, then the live log
    the service appends to): `line_number` counts across them, so a later line wins; a quarantine
    row names its file (`source`) and its line in that file."""
    by_id: dict[str, tuple[int, AuditRecord]] = {}
    quarantine: list[dict[str, Any]] = []
    duplicates: dict[str, int] = {}
    n_lines = n_blank = offset = 0
    starts: list[tuple[str | None, int]] = []
    for source, lines in sources:
        starts.append((source, offset))
        local = 0
        for local, raw in enumerate(lines, start=1):
            line_number = offset + local
            text = raw.strip()
            if not text:
                n_blank += 1
                continue
            n_lines += 1
            try:
                obj = json.loads(text)
                if not isinstance(obj, dict):
                    raise ValueError(f"a line must be a JSON object, got {type(obj).__name__}")
                record = AuditRecord.model_validate(obj)
            except (ValueError, ValidationError) as err:  # JSONDecodeError is a ValueError
                row = {"line_number": local, "error": _error_text(err), "raw": text[:2000]}
                quarantine.append(row if source is None else {**row, "source": source})
                continue
            if record.decision_id in by_id:
                duplicates[record.decision_id] = duplicates.get(record.decision_id, 0) + 1
                del by_id[record.decision_id]  # re-insert so the kept line's position is its own
            by_id[record.decision_id] = (line_number, record)
        offset += local
    records = sorted(by_id.values(), key=lambda item: item[0])
    return ParsedLog(
        records=records, quarantine=quarantine, n_lines=n_lines, n_blank=n_blank, duplicates=duplicates, starts=starts
    )


def parse_file(path: str | Path) -> ParsedLog:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return parse_lines(fh)


def canonical(record: AuditRecord) -> str:
    """A decision as canonical JSON (validated, sorted keys): two posts of the same decision are
    equal here however their JSON was spelled."""
    return json.dumps(record.model_dump(mode="json"), sort_keys=True)


def canonical_or_repr(record: AuditRecord) -> str:
    try:
        return canonical(record)
    except (ValueError, OverflowError, RecursionError, TypeError):
        return repr(record)


def orders_json(orders: list[Order] | None) -> str | None:
    """Orders as canonical JSON (sorted keys, extra keys kept)."""
    if orders is None:
        return None
    return json.dumps([o.model_dump(mode="json") for o in orders], sort_keys=True)


DECISION_COLUMNS = {
    "decision_id": "string",
    "decision_date": "string",
    "ts_utc": "string",
    "ts_local": "string",
    "decision": "string",
    "proposal_orders_json": "string",
    "proposal_text": "string",
    "operator_orders_json": "string",
    "reason": "string",
    "context_json": "string",
    "extra_json": "string",
    "symbols": "string",
    "n_orders": "int64",
    "line_number": "int64",
    "duplicates_dropped": "int64",
}


def empty_decisions() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in DECISION_COLUMNS.items()})


def decision_date(ts: datetime, timezone: str) -> str:
    """The calendar day of the decision in the partitions' time zone."""
    return ts.astimezone(ZoneInfo(timezone)).date().isoformat()


def decision_row(r: AuditRecord, line_number: int, duplicates_dropped: int, timezone: str) -> dict[str, Any]:
    """The `operator_decisions` row of one decision, JSON fields kept as canonical JSON strings."""
    symbols = sorted({o.symbol for o in r.proposal.orders})
    return {
        "decision_id": r.decision_id,
        "decision_date": decision_date(r.ts, timezone),
        "ts_utc": r.ts.astimezone(ZoneInfo("UTC")).isoformat(),
        "ts_local": r.ts.astimezone(ZoneInfo(timezone)).isoformat(),
        "decision": r.decision,
        "proposal_orders_json": orders_json(r.proposal.orders),
        "proposal_text": r.proposal.text,
        "operator_orders_json": orders_json(r.operator_orders),
        "reason": r.reason,
        "context_json": json.dumps(r.context, sort_keys=True, default=str),
        "extra_json": json.dumps(
            {"record": r.extra, "proposal": dict(r.proposal.model_extra or {})}, sort_keys=True, default=str
        ),
        "symbols": ",".join(symbols),
        "n_orders": len(r.proposal.orders),
        "line_number": line_number,
        "duplicates_dropped": duplicates_dropped,
    }


def records_frame(parsed: ParsedLog, timezone: str) -> pd.DataFrame:
    """One row per unique decision. A decision that validated but does not convert (a line written
    before the validation that now refuses it) moves from `parsed.records` to `parsed.quarantine`
    with the reason, so one line cannot fail the day and the counts still reconcile."""
    rows, kept = [], []
    for line_number, r in parsed.records:
        try:
            rows.append(decision_row(r, line_number, parsed.duplicates.get(r.decision_id, 0), timezone))
        except (ValueError, OverflowError, RecursionError, TypeError) as err:
            source, local = parsed.locate(line_number)
            row = {
                "line_number": local,
                "error": f"does not convert: {type(err).__name__}: {err}",
                "raw": canonical_or_repr(r)[:2000],
            }
            parsed.quarantine.append(row if source is None else {**row, "source": source})
            continue
        kept.append((line_number, r))
    parsed.records[:] = kept
    if not rows:
        return empty_decisions()
    return pd.DataFrame(rows).astype(DECISION_COLUMNS)


def quarantine_frame(parsed: ParsedLog, source: str) -> pd.DataFrame:
    """Quarantined lines; `source` names the file of rows that do not name their own."""
    cols = {"line_number": "int64", "error": "string", "raw": "string", "source": "string"}
    if not parsed.quarantine:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in cols.items()})
    df = pd.DataFrame([{"source": source, **row} for row in parsed.quarantine])
    return df[list(cols)].astype(cols)


def load_orders(orders_json_text: str | None) -> list[dict[str, Any]]:
    if orders_json_text is None or (isinstance(orders_json_text, float)) or pd.isna(orders_json_text):
        return []
    return json.loads(orders_json_text)
