"""`note_feedback`(D) and `feedback_pairs` materialised on a warehouse holding a day's notes: the log
becomes a table (bad lines quarantined, every line accounted for), verified corrections and
up/down ratings become pairs, exported once; a re-run gives the same rows and no second export."""

from __future__ import annotations

import json

import dagster as dg
import pandas as pd

from assets.feedback.note_feedback import feedback_pairs, note_feedback
from outcome_flywheel.feedback.log import FeedbackLog
from outcome_flywheel.feedback.records import FeedbackRecord, VerificationRecord
from outcome_flywheel.storage import Warehouse

DAY = "2025-11-04"


def test_feedback_assets_end_to_end(tmp_path):
    warehouse = Warehouse(data_dir=str(tmp_path / "data"))
    prompt = json.dumps([{"role": "user", "content": "Headline: Chevron beats"}])
    warehouse.write(
        "rollouts",
        pd.DataFrame(
            [dict(date=DAY, headline_id="h1", rollout_index=i, prompt=prompt, response=f"note {i}") for i in range(3)]
        ),
        partition=DAY,
    )
    log = FeedbackLog(data_dir=str(tmp_path / "data"))
    correction = FeedbackRecord(
        date=DAY, headline_id="h1", rollout_index=1, correction="Long CVX, stop 4%.", reviewer="ana"
    )
    for record in (
        correction,
        FeedbackRecord(date=DAY, headline_id="h1", rollout_index=0, thumbs="up", reviewer="ana"),
        FeedbackRecord(date=DAY, headline_id="h1", rollout_index=2, stars=1, reviewer="bo"),
        FeedbackRecord(date="2025-11-05", headline_id="h9", rollout_index=0, thumbs="up", reviewer="bo"),
        VerificationRecord(feedback_id=correction.feedback_id, action="approve", curator="cu"),
    ):
        log.append(record)
    with open(log.file, "a") as f:
        f.write(
            '{"kind": "feedback", "date": "2025-11-04", "headline_id": "h1", "rollout_index": 0, "reviewer": "ana", "feedback_id": "'
            + "a" * 32
            + '", "stars": 9}\n'
        )
    resources = {"warehouse": warehouse, "feedback_log": log}

    result = dg.materialize([note_feedback], partition_key=DAY, resources=resources)
    assert result.success
    [check] = result.get_asset_check_evaluations()
    assert check.passed and check.metadata["lines"].value == 6 and check.metadata["quarantined"].value == 1
    table = warehouse.read("note_feedback", DAY)
    assert sorted(table["rollout_index"]) == [0, 1, 2] and set(table["status"]) == {"none", "approved"}
    assert "less than or equal to 5" in warehouse.read("note_feedback_quarantine")["reason"].iloc[0]

    assert dg.materialize([feedback_pairs], resources=resources).success
    pairs = warehouse.read("feedback_pairs")
    assert sorted(zip(pairs["source"], pairs["chosen"], pairs["rejected"])) == [
        ("correction", "Long CVX, stop 4%.", "note 1"),
        ("thumbs", "note 0", "note 2"),
    ]
    [export] = list((tmp_path / "data" / "exports" / "feedback_pairs").iterdir())
    assert (pairs["exported_at"] == export.name).all()
    assert (export / "trl.jsonl").read_text().count("\n") == 2 and json.loads((export / "pairs.meta.json").read_text())[
        "rows"
    ] == 2

    # re-runs: the same rows, nothing exported twice
    assert dg.materialize([note_feedback], partition_key=DAY, resources=resources).success
    assert dg.materialize([feedback_pairs], resources=resources).success
    again = warehouse.read("feedback_pairs")
    assert list(again["pair_id"]) == list(pairs["pair_id"]) and list(again["exported_at"]) == list(pairs["exported_at"])
    assert len(list((tmp_path / "data" / "exports" / "feedback_pairs").iterdir())) == 1
