"""`operator_decisions`: the audit log's decisions, one partition per decision date."""

from pathlib import Path

import dagster as dg

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import preference_partitions
from outcome_flywheel.preferences.audit_log import DECISION_COLUMNS, empty_decisions, quarantine_frame, records_frame
from outcome_flywheel.preferences.audit_log_file import AuditLog
from outcome_flywheel.settings import env
from outcome_flywheel.storage import Warehouse

QUARANTINE_TABLE = "operator_decisions_quarantine"


@dg.asset(
    group_name="flywheel",
    partitions_def=preference_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("operator_decisions", DECISION_COLUMNS),
    check_specs=[
        dg.AssetCheckSpec(
            "counts_reconcile",
            asset="operator_decisions",
            blocking=True,
            description="Non-blank lines of the audit log = unique valid decisions + repeated ids dropped + quarantined lines.",
        )
    ],
)
def operator_decisions(
    context: dg.AssetExecutionContext, audit_log: dg.ResourceParam[AuditLog], warehouse: dg.ResourceParam[Warehouse]
):
    """Operator approve / reject / override decisions from the JSONL audit log (FLYWHEEL_AUDIT_LOG, then
    the live log the review service appends to, FLYWHEEL_LIVE_AUDIT_LOG), validated with pydantic,
    partitioned by decision date in FLYWHEEL_TIMEZONE. Extra keys are kept (`extra_json`); a bad line
    goes to `operator_decisions_quarantine` (file, line number, error); a repeated
    `decision_id` keeps the last line. Re-running a partition rewrites the same rows."""
    parsed = audit_log.parse()
    frame = records_frame(parsed, env("FLYWHEEL_TIMEZONE"))
    keys = list(context.partition_keys)
    written = {}
    for key in keys:
        rows = frame[frame["decision_date"] == key]
        warehouse.write("operator_decisions", rows if len(rows) else empty_decisions(), partition=key)
        written[key] = len(rows)
    # The quarantine is a property of the whole file: every run rewrites the same table.
    warehouse.write(QUARANTINE_TABLE, quarantine_frame(parsed, str(audit_log.file)))
    all_keys = set(preference_partitions.get_partition_keys())
    outside = int((~frame["decision_date"].isin(all_keys)).sum()) if len(frame) else 0
    counts = {
        "n_lines": parsed.n_lines,
        "n_valid": parsed.n_valid,
        "n_quarantined": parsed.n_quarantined,
        "n_duplicates_dropped": parsed.n_duplicates_dropped,
    }
    by_type = frame[frame["decision_date"].isin(keys)]["decision"].value_counts().to_dict() if len(frame) else {}
    context.log.info(
        f"audit log {audit_log.describe()}: {counts}; {sum(written.values())} decisions in {len(keys)} partition(s)"
    )
    yield dg.MaterializeResult(
        asset_key="operator_decisions",
        metadata={
            **counts,
            "n_in_partitions": sum(written.values()),
            "n_partitions": len(keys),
            "n_outside_partition_range": outside,
            **{f"n_{kind}": int(by_type.get(kind, 0)) for kind in ("approve", "reject", "override")},
            "audit_log": dg.MetadataValue.path(str(audit_log.file)),
            "live_audit_log": dg.MetadataValue.path(str(audit_log.live_file)) if audit_log.live_file else "none",
            "quarantine": dg.MetadataValue.md(
                "\n".join(
                    f"- {Path(q.get('source', audit_log.file)).name} line {q['line_number']}: {q['error']}"
                    for q in parsed.quarantine
                )
                or "none"
            ),
        },
    )
    yield dg.AssetCheckResult(
        check_name="counts_reconcile",
        asset_key="operator_decisions",
        passed=parsed.reconciles(),
        metadata={**counts, "repeated_ids": dg.MetadataValue.json(parsed.duplicates)},
    )
