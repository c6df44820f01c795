"""`note_feedback`(D) and `feedback_pairs`: the feedback log as a table, and the preference pairs it makes."""

import uuid
from datetime import datetime, timezone

import dagster as dg
import pandas as pd

from assets.catalog import OWNERS, TABLE_KINDS, column_names, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.feedback.curation import (
    FEEDBACK_COLUMNS,
    PAIR_COLUMNS,
    carry_exports,
    feedback_metrics,
    feedback_table,
    new_export,
    orphans,
)
from outcome_flywheel.feedback.curation import feedback_pairs as build_feedback_pairs
from outcome_flywheel.feedback.log import FeedbackLog
from outcome_flywheel.storage import Warehouse, atomic_write_bytes

EXPORT_DIR = ("exports", "feedback_pairs")
QUARANTINE_COLUMNS = column_names("note_feedback_quarantine")


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="feedback",
    deps=["rollouts"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("note_feedback", FEEDBACK_COLUMNS),
    check_specs=[
        dg.AssetCheckSpec(
            "log_lines_accounted_for",
            asset="note_feedback",
            blocking=True,
            description="Every line of the feedback log is a feedback, a verdict or a quarantined line (with its reason).",
        )
    ],
)
def note_feedback(
    context: dg.AssetExecutionContext,
    warehouse: dg.ResourceParam[Warehouse],
    feedback_log: dg.ResourceParam[FeedbackLog],
):
    """People's feedback on day D's notes (thumbs, stars, corrections), validated from the feedback
    log (FLYWHEEL_FEEDBACK_LOG) with each correction's latest curator verdict folded in. Bad lines go
    to `note_feedback_quarantine` with the reason; feedback on a note that rollouts(D) does not hold
    is kept and counted (`unknown_notes`)."""
    day = context.partition_key
    parsed = feedback_log.read()
    table = feedback_table(parsed.feedback, parsed.verifications)
    todays = table[table["date"] == day].reset_index(drop=True)
    warehouse.write("note_feedback", todays, partition=day)
    warehouse.write("note_feedback_quarantine", pd.DataFrame(parsed.quarantine, columns=QUARANTINE_COLUMNS))
    notes = (
        warehouse.read("rollouts", day)
        if warehouse.exists("rollouts", day)
        else pd.DataFrame(columns=["headline_id", "rollout_index"])
    )
    known = set(zip(notes["headline_id"], notes["rollout_index"].astype(int)))
    unknown = int(sum((h, int(i)) not in known for h, i in zip(todays["headline_id"], todays["rollout_index"])))
    metrics = feedback_metrics(todays, notes_shown=len(notes), pairs=pd.DataFrame(columns=PAIR_COLUMNS))
    accounted = len(parsed.feedback) + len(parsed.verifications) + len(parsed.quarantine)
    yield dg.MaterializeResult(
        metadata={
            "dagster/row_count": len(todays),
            "log": dg.MetadataValue.path(str(feedback_log.file)),
            "log_lines": parsed.lines,
            "quarantined_lines": len(parsed.quarantine),
            "unknown_notes": unknown,
            "verdicts_on_unknown_feedback": len(orphans(parsed.feedback, parsed.verifications)),
            **{k: v for k, v in metrics.items() if not k.startswith("pairs")},
        }
    )
    yield dg.AssetCheckResult(
        check_name="log_lines_accounted_for",
        passed=accounted == parsed.lines,
        metadata={
            "lines": parsed.lines,
            "feedback": len(parsed.feedback),
            "verdicts": len(parsed.verifications),
            "quarantined": len(parsed.quarantine),
        },
    )


@dg.asset(
    group_name="feedback",
    deps=["note_feedback"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("feedback_pairs", PAIR_COLUMNS),
)
def feedback_pairs(context: dg.AssetExecutionContext, warehouse: dg.ResourceParam[Warehouse]):
    """Preference pairs from people: a verified correction over the note it corrects (the curator's
    edit when there is one), and on one headline an up-rated note over a down-rated one. Pairs not
    exported before go to exports/feedback_pairs/<export id>/ (TRL, NeMo-RL, Together/OpenAI and
    `pairs.meta.json`); `exported_at` records the export, so a pair is exported once."""
    table = (
        warehouse.read_all("note_feedback")
        if warehouse.partitions("note_feedback")
        else pd.DataFrame(columns=FEEDBACK_COLUMNS)
    )
    days = sorted(set(table["date"]))
    notes = pd.concat(
        [warehouse.read("rollouts", d) for d in days if warehouse.exists("rollouts", d)]
        or [pd.DataFrame(columns=["date", "headline_id", "rollout_index", "prompt", "response"])]
    )
    previous = warehouse.read("feedback_pairs") if warehouse.exists("feedback_pairs") else None
    pairs = carry_exports(build_feedback_pairs(table, notes), previous)
    metrics = feedback_metrics(table, notes_shown=len(notes), pairs=pairs)
    export_id = f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"
    pairs, files = new_export(pairs, export_id)
    folder = warehouse.path(*EXPORT_DIR, export_id)
    for name, data in files.items():  # the files first: a pair is marked exported only once they exist
        atomic_write_bytes(folder / name, data)
    warehouse.write("feedback_pairs", pairs)
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": len(pairs),
            **metrics,
            "exported_now": int((pairs["exported_at"] == export_id).sum()),
            "export_dir": dg.MetadataValue.path(str(folder)) if files else "nothing new to export",
            "by_source": dg.MetadataValue.md(
                "\n".join(
                    ["| source | pairs |", "| --- | --- |"]
                    + [f"| {k} | {int(v)} |" for k, v in pairs["source"].value_counts().items()]
                )
            ),
        }
    )
