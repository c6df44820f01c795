"""Audit log parsing: validation, quarantine, extra keys, repeated decision ids."""

import json

from outcome_flywheel.preferences.audit_log import parse_file, parse_lines, quarantine_frame, records_frame
from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG


def _line(decision_id="d-1", ts="2025-11-26T10:00:00-05:00", decision="approve", **extra):
    obj = {
        "decision_id": decision_id,
        "ts": ts,
        "decision": decision,
        "proposal": {"orders": [{"symbol": "nvda", "side": "BUY", "weight": 0.05}]},
        "context": {"a": 1},
    }
    obj.update(extra)
    return json.dumps(obj)


def test_bad_lines_are_quarantined_and_counts_reconcile():
    lines = [
        _line("d-1"),
        "{not json",
        "",
        json.dumps([1, 2]),
        _line("d-2", ts="2025-11-26T10:00:00"),  # naive time
        _line("d-3", decision="maybe"),
        _line("d-4", decision="override"),  # override without operator_orders
        _line("d-5", decision="reject", operator_orders=[{"symbol": "AAPL", "side": "buy", "weight": 0.02}]),
        _line("d-6", decision="override", operator_orders=[{"symbol": "AAPL", "side": "buy", "weight": 0.02}]),
        json.dumps(
            {
                "decision_id": "d-7",
                "ts": "2025-11-26T10:00:00Z",
                "decision": "approve",
                "proposal": {"orders": [{"symbol": "AAPL", "side": "buy", "weight": 1.5}]},
            }
        ),
    ]
    parsed = parse_lines(lines)
    assert parsed.n_lines == 9 and parsed.n_blank == 1
    assert [r.decision_id for _, r in parsed.records] == ["d-1", "d-6"]
    assert [q["line_number"] for q in parsed.quarantine] == [2, 4, 5, 6, 7, 8, 10]
    assert "ts must carry a UTC offset" in parsed.quarantine[2]["error"]
    assert "operator_orders" in parsed.quarantine[4]["error"]
    assert parsed.reconciles()
    q = quarantine_frame(parsed, "x.jsonl")
    assert len(q) == 7 and set(q.columns) >= {"line_number", "error", "raw"}


def test_repeated_decision_id_keeps_the_last_line_and_is_counted():
    lines = [_line("d-1", reason="first"), _line("d-2"), _line("d-1", reason="second"), _line("d-1", reason="third")]
    parsed = parse_lines(lines)
    assert parsed.duplicates == {"d-1": 2}
    assert parsed.n_valid == 2 and parsed.reconciles()
    by_id = {r.decision_id: (n, r) for n, r in parsed.records}
    assert by_id["d-1"][1].reason == "third" and by_id["d-1"][0] == 4
    frame = records_frame(parsed, "America/New_York")
    assert frame.set_index("decision_id").loc["d-1", "duplicates_dropped"] == 2


def test_extra_keys_are_kept_and_fields_normalised():
    parsed = parse_lines([_line("d-1", operator="ana", source={"ui": "console"})])
    frame = records_frame(parsed, "America/New_York")
    row = frame.iloc[0]
    assert json.loads(row["extra_json"])["record"] == {"operator": "ana", "source": {"ui": "console"}}
    orders = json.loads(row["proposal_orders_json"])
    assert orders == [{"side": "buy", "symbol": "NVDA", "weight": 0.05}]
    assert row["decision_date"] == "2025-11-26"


def test_decision_date_is_taken_in_the_partition_time_zone():
    # 02:30 UTC on the 27th is still the 26th in New York.
    parsed = parse_lines([_line("d-1", ts="2025-11-27T02:30:00+00:00")])
    assert records_frame(parsed, "America/New_York").iloc[0]["decision_date"] == "2025-11-26"
    assert records_frame(parsed, "UTC").iloc[0]["decision_date"] == "2025-11-27"


def test_bundled_sample_log_parses_with_its_documented_edge_cases():
    parsed = parse_file(BUNDLED_AUDIT_LOG)
    assert parsed.reconciles()
    assert parsed.n_quarantined == 2 and parsed.n_duplicates_dropped == 1
    frame = records_frame(parsed, "America/New_York")
    counts = frame["decision"].value_counts()
    assert set(counts.index) == {"approve", "reject", "override"} and len(frame) >= 150


def test_a_torn_live_log_keeps_the_409_on_a_changed_body(tmp_path):
    """A crash mid-write leaves the live log ending in a partial line: the next decision is still
    appended as its own line, so it is found, and a changed body under its id is refused."""
    import pytest

    from outcome_flywheel.preferences.audit_log import AuditRecord
    from outcome_flywheel.preferences.audit_log_file import AuditLog, DecisionConflict

    source = tmp_path / "audit_log.jsonl"
    source.write_text("")
    log = AuditLog(path=str(source), data_dir=str(tmp_path))
    log.live_file.parent.mkdir(parents=True)
    log.live_file.write_text('{"decision_id": "d-torn", "ts": "2025-06-')  # a writer died here
    record = AuditRecord(
        decision_id="d-1",
        ts="2025-06-10T10:00:00-04:00",
        decision="approve",
        proposal={"orders": [{"symbol": "MSFT", "side": "buy", "weight": 0.02}]},
    )
    assert log.append(record) == "created"
    parsed = log.parse()
    assert [r.decision_id for _, r in parsed.records] == ["d-1"] and parsed.n_quarantined == 1 and parsed.reconciles()
    with pytest.raises(DecisionConflict):
        log.append(record.model_copy(update={"decision": "reject"}))
    assert log.append(record) == "unchanged"


BAD_TIMES = [
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "1900-01-01T00:00:00+00:00",
    "2200-01-01T00:00:00Z",
]


def test_a_time_that_does_not_convert_or_is_out_of_range_is_refused_and_quarantined(tmp_path):
    import pytest
    from pydantic import ValidationError

    from outcome_flywheel.preferences.audit_log import AuditRecord, parse_sources

    good = {
        "decision_id": "d-ok",
        "ts": "2025-06-10T10:00:00-04:00",
        "decision": "approve",
        "proposal": {"orders": [{"symbol": "MSFT", "side": "buy", "weight": 0.02}]},
    }
    for ts in BAD_TIMES:
        with pytest.raises(ValidationError, match="ts "):
            AuditRecord.model_validate({**good, "ts": ts})
    # Lines written before this validation (or by hand) go to the quarantine; the rest of the day goes on.
    lines = [json.dumps(good)] + [
        json.dumps({**good, "decision_id": f"d-bad-{i}", "ts": ts}) for i, ts in enumerate(BAD_TIMES)
    ]
    parsed = parse_sources([("kept.jsonl", lines[:2]), ("live.jsonl", lines[2:])])
    frame = records_frame(parsed, "Pacific/Kiritimati")
    assert list(frame["decision_id"]) == ["d-ok"] and parsed.n_quarantined == 4 and parsed.reconciles()
    assert [(q["source"], q["line_number"]) for q in parsed.quarantine] == [
        ("kept.jsonl", 2),
        ("live.jsonl", 1),
        ("live.jsonl", 2),
        ("live.jsonl", 3),
    ]


def test_records_frame_quarantines_a_decision_that_does_not_convert():
    """The assets' safety net: a record that validation let through but that cannot become a row is
    moved to the quarantine with the reason (file and line), never failing the partition."""
    from datetime import datetime, timedelta, timezone

    from outcome_flywheel.preferences.audit_log import AuditRecord, parse_sources

    good = {
        "decision_id": "d-ok",
        "ts": "2025-06-10T10:00:00-04:00",
        "decision": "approve",
        "proposal": {"orders": [{"symbol": "MSFT", "side": "buy", "weight": 0.02}]},
    }
    parsed = parse_sources(
        [("kept.jsonl", [json.dumps(good)]), ("live.jsonl", [json.dumps({**good, "decision_id": "d-2"})])]
    )
    bad = AuditRecord.model_construct(
        **{**parsed.records[1][1].__dict__, "ts": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))}
    )
    parsed.records[1] = (parsed.records[1][0], bad)
    frame = records_frame(parsed, "America/New_York")
    assert list(frame["decision_id"]) == ["d-ok"] and parsed.reconciles()
    assert parsed.quarantine[0]["source"] == "live.jsonl" and parsed.quarantine[0]["line_number"] == 1
    assert "does not convert" in parsed.quarantine[0]["error"]


def test_deeply_nested_context_is_refused_without_recursing():
    import pytest
    from pydantic import ValidationError

    from outcome_flywheel.preferences.audit_log import MAX_JSON_DEPTH, AuditRecord, json_depth

    deep: dict = {}
    node = deep
    for _ in range(100_000):  # deeper than Python's recursion limit
        node["a"] = {}
        node = node["a"]
    assert json_depth(deep) == 100_001
    good = {"decision_id": "d-ok", "ts": "2025-06-10T10:00:00-04:00", "decision": "approve", "proposal": {"orders": []}}
    with pytest.raises(ValidationError, match="more than 32 deep"):
        AuditRecord.model_validate({**good, "context": deep})
    shallow: dict = {}
    node = shallow
    for _ in range(MAX_JSON_DEPTH - 2):
        node["a"] = {}
        node = node["a"]
    assert AuditRecord.model_validate({**good, "context": shallow}).context == shallow
