"""The note-feedback log: validated records, durable concurrent appends, bad lines quarantined with
the reason (lines in = records + quarantined), curation folded in, pairs, exports once, metrics."""

from __future__ import annotations

import json
import threading

import pandas as pd
import pytest
from pydantic import ValidationError

from outcome_flywheel.feedback.curation import (
    carry_exports,
    feedback_metrics,
    feedback_pairs,
    feedback_table,
    new_export,
)
from outcome_flywheel.feedback.log import read_feedback_log
from outcome_flywheel.feedback.records import (
    FeedbackIn,
    FeedbackRecord,
    VerificationIn,
    VerificationRecord,
    human_signal,
)
from outcome_flywheel.jsonl_log import append_record, append_unless

DAY = "2025-11-04"


def fb(**kw) -> FeedbackRecord:
    base = dict(date=DAY, headline_id="h1", rollout_index=0, reviewer="ana")
    return FeedbackRecord(**{**base, **kw})


def notes() -> pd.DataFrame:
    prompt = json.dumps([{"role": "user", "content": "Headline: Oil rises"}])
    return pd.DataFrame(
        [dict(date=DAY, headline_id="h1", rollout_index=i, prompt=prompt, response=f"note {i}") for i in range(4)]
    )


@pytest.mark.parametrize(
    "body, problem",
    [
        (dict(rollout_index=0), "needs thumbs, stars or a correction"),
        (dict(rollout_index=0, stars=9), "less than or equal to 5"),
        (dict(rollout_index=9, thumbs="up"), "less than or equal to 7"),
        (dict(rollout_index=0, thumbs="sideways"), "'up' or 'down'"),
        (dict(rollout_index=0, correction="x" * 8001), "at most 8000"),
        (dict(rollout_index=0, thumbs="up", surprise=1), "Extra inputs"),
    ],
)
def test_bad_feedback_is_refused_with_the_reason(body, problem):
    with pytest.raises(ValidationError, match=problem):
        FeedbackIn(date=DAY, headline_id="h1", reviewer="ana", **body)
    with pytest.raises(ValidationError, match="Input should be a valid date"):
        FeedbackIn(date="2025-13-40", headline_id="h1", rollout_index=0, thumbs="up", reviewer="ana")


def test_human_signal():
    assert human_signal("up", None) == 1.0 and human_signal("down", None) == 0.0
    assert human_signal(None, 5) == 1.0 and human_signal(None, 1) == 0.0 and human_signal("up", 3) == 0.75
    assert human_signal(None, None) is None


def test_concurrent_appends_leave_every_line_whole(tmp_path):
    log = tmp_path / "feedback.jsonl"

    def client(k: int) -> None:
        for i in range(10):
            append_record(log, fb(rollout_index=i % 8, thumbs="up", correction=f"client {k} line {i} " + "z" * 3000))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parsed = read_feedback_log(log)
    assert len(parsed.feedback) == 200 and not parsed.quarantine
    assert len({f.feedback_id for f in parsed.feedback}) == 200


def test_bad_lines_are_quarantined_and_counted(tmp_path):
    log = tmp_path / "feedback.jsonl"
    append_record(log, fb(thumbs="up"))
    with open(log, "a") as f:
        f.write("{not json\n")
        f.write(
            json.dumps({"kind": "feedback", "date": DAY, "headline_id": "h1", "rollout_index": 0, "reviewer": "x"})
            + "\n"
        )
        f.write(json.dumps({"kind": "vote"}) + "\n\n")
    parsed = read_feedback_log(log)
    assert parsed.lines == 4 and len(parsed.feedback) == 1 and len(parsed.quarantine) == 3
    reasons = [q["reason"] for q in parsed.quarantine]
    assert (
        reasons[0].startswith("not JSON")
        and "thumbs, stars or a correction" in reasons[1]
        and "unknown kind 'vote'" in reasons[2]
    )


def test_append_unless_checks_and_writes_under_one_lock(tmp_path):
    log = tmp_path / "decisions.jsonl"
    results = []

    def writer():
        results.append(append_unless(log, '{"decision_id": "d1"}', lambda lines: "exists" if lines else None))

    threads = [threading.Thread(target=writer) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(None) == 1 and results.count("exists") == 9
    assert log.read_text().count("d1") == 1


def test_curation_pairs_and_a_pair_is_exported_once():
    corrected = fb(rollout_index=1, correction="Buy XOM; stop 5%.")
    edited = fb(rollout_index=2, correction="Sell it")
    rejected = fb(rollout_index=3, correction="nonsense")
    up, down = fb(rollout_index=0, thumbs="up", stars=5), fb(rollout_index=3, thumbs="down")
    waiting = fb(rollout_index=0, correction="later")
    verdicts = [
        VerificationRecord(feedback_id=corrected.feedback_id, action="approve", curator="cu"),
        VerificationRecord(
            feedback_id=edited.feedback_id, action="edit", correction="Sell XOM, stop 4%.", curator="cu"
        ),
        VerificationRecord(feedback_id=rejected.feedback_id, action="reject", curator="cu"),
    ]
    table = feedback_table([corrected, edited, rejected, up, down, waiting], verdicts)
    assert dict(
        zip(
            table["rollout_index"].astype(str) + table["status"],
            [v if isinstance(v, str) else None for v in table["verified_correction"]],
        )
    ) == {
        "1approved": "Buy XOM; stop 5%.",
        "2edited": "Sell XOM, stop 4%.",
        "3rejected": None,
        "0none": None,
        "3none": None,
        "0unverified": None,
    }
    pairs = feedback_pairs(table, notes())
    assert sorted(zip(pairs["source"], pairs["chosen"], pairs["rejected"])) == [
        ("correction", "Buy XOM; stop 5%.", "note 1"),
        ("correction", "Sell XOM, stop 4%.", "note 2"),
        ("thumbs", "note 0", "note 3"),
    ]
    assert list(feedback_pairs(table, notes())["pair_id"]) == list(pairs["pair_id"])  # stable

    first, files = new_export(carry_exports(pairs, None), "export-1")
    assert set(files) == {"trl.jsonl", "nemo_rl.jsonl", "openai.jsonl", "pairs.meta.json"}
    assert files["trl.jsonl"].decode().count("\n") == 3 and (first["exported_at"] == "export-1").all()
    metrics = feedback_metrics(table, notes_shown=8, pairs=carry_exports(pairs, None))
    assert (
        metrics["pairs_ready_to_export"] == 3 and metrics["verified_share"] == 0.75 and metrics["feedback_rate"] == 0.5
    )

    more = feedback_table(
        [corrected, edited, rejected, up, down, waiting, fb(rollout_index=2, thumbs="down")], verdicts
    )
    again, files = new_export(carry_exports(feedback_pairs(more, notes()), first), "export-2")
    assert (again["exported_at"] == "export-2").sum() == 1  # only the new thumbs pair (0 over 2)
    assert json.loads(files["pairs.meta.json"])["rows"] == 1
    _, nothing = new_export(carry_exports(feedback_pairs(more, notes()), again), "export-3")
    assert nothing == {}


def test_verification_rules():
    with pytest.raises(ValidationError, match="an edit needs the corrected text"):
        VerificationIn(action="edit", curator="cu")
    with pytest.raises(ValidationError, match="only an edit carries a correction"):
        VerificationIn(action="approve", correction="x", curator="cu")


def test_a_torn_last_line_does_not_eat_the_next_append(tmp_path):
    """A crash mid-write leaves a partial last line: the next acknowledged append is a whole line of
    its own (readable), and the torn part alone is quarantined."""
    log = tmp_path / "feedback.jsonl"
    kept = fb(thumbs="up")
    append_record(log, kept)
    with open(log, "a") as f:
        f.write('{"kind": "feedback", "date": "2025-11-0')  # torn: no newline
    after = fb(rollout_index=1, stars=3)
    append_record(log, after)
    parsed = read_feedback_log(log)
    assert [f.feedback_id for f in parsed.feedback] == [kept.feedback_id, after.feedback_id]
    assert len(parsed.quarantine) == 1 and parsed.quarantine[0]["raw"].endswith('"2025-11-0') and parsed.lines == 3
    # append_unless (the verdicts' and the decisions' path) ends a torn tail too.
    with open(log, "a") as f:
        f.write("{torn")
    assert append_unless(log, '{"kind": "vote"}', lambda lines: None) is None
    assert log.read_text().endswith('{torn\n{"kind": "vote"}\n')
