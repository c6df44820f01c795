"""The `headlines` asset: the day's feed entries, normalised, de-duplicated, with a quarantine."""

import dagster as dg

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.feeds.headlines import (
    FEED_LEVEL_REASONS,
    HEADLINE_COLUMNS,
    build_headlines,
    feed_failures,
)
from outcome_flywheel.daily_rl.feeds.source import FeedSource
from outcome_flywheel.storage import Warehouse


def _markdown_table(df, columns, limit=10) -> str:
    if df.empty:
        return "_none_"
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, r in df.head(limit).iterrows():
        rows.append("| " + " | ".join(str(r[c]).replace("|", "/")[:90] for c in columns) + " |")
    return "\n".join(rows)


def _counts_table(counts: dict) -> str:
    if not counts:
        return "none"
    return "| reason | rows |\n| --- | --- |\n" + "".join(f"| {k} | {int(v)} |\n" for k, v in sorted(counts.items()))


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("headlines", HEADLINE_COLUMNS),
    check_specs=[
        dg.AssetCheckSpec(
            "entries_accounted_for",
            asset="headlines",
            description="Every feed entry is either a headline or a quarantine row.",
        ),
        dg.AssetCheckSpec(
            "minimum_headlines",
            asset="headlines",
            blocking=True,
            description="At least FLYWHEEL_MIN_HEADLINES (default 1) headlines on the day; otherwise the "
            "run fails here, before daily_update, with the feeds that failed and the quarantine reasons.",
        ),
    ],
)
def headlines(
    context: dg.AssetExecutionContext, warehouse: dg.ResourceParam[Warehouse], feeds: dg.ResourceParam[FeedSource]
):
    """Headlines published on day D (in FLYWHEEL_TIMEZONE) from the archive folder or live feeds:
    HTML stripped, duplicates (same normalised title) dropped, dates range-checked, capped at
    FLYWHEEL_MAX_HEADLINES. Anything unusable (a broken feed, an entry without title or with a
    nonsense date, another day's item, a duplicate, one over the cap) goes to
    `headlines_quarantine` with its file and reason; per-feed counts go to `headline_sources`."""
    day = context.partition_key
    raws = feeds.fetch(day)
    kept, quarantine, sources = build_headlines(raws, day, daily_rl_partitions.timezone, feeds.max_headlines)
    warehouse.write("headlines", kept, partition=day)
    warehouse.write("headlines_quarantine", quarantine, partition=day)
    warehouse.write("headline_sources", sources, partition=day)

    entries_in = int(sources["entries"].sum()) if not sources.empty else 0
    entry_rows = int((~quarantine["reason"].isin(FEED_LEVEL_REASONS)).sum()) if not quarantine.empty else 0
    balanced = entries_in == len(kept) + entry_rows
    reasons = quarantine["reason"].value_counts().to_dict() if not quarantine.empty else {}
    context.log.info(f"{day}: {len(kept)} headlines from {len(raws)} feeds ({feeds.describe()}), quarantined {reasons}")
    yield dg.MaterializeResult(
        metadata={
            "headlines": len(kept),
            "feeds": len(raws),
            "entries_in": entries_in,
            "quarantined": len(quarantine),
            "quarantine_reasons": dg.MetadataValue.md(_counts_table(reasons)),
            "source": feeds.describe(),
            "dagster/row_count": len(kept),
            "preview": dg.MetadataValue.md(_markdown_table(kept, ["title", "source", "published_at"])),
            "quarantine_preview": dg.MetadataValue.md(_markdown_table(quarantine, ["feed_file", "reason", "detail"])),
        }
    )
    yield dg.AssetCheckResult(
        check_name="entries_accounted_for",
        passed=bool(balanced),
        metadata={"entries_in": entries_in, "headlines": len(kept), "quarantined_entries": entry_rows},
    )
    failures = feed_failures(quarantine)
    enough = len(kept) >= feeds.min_headlines
    yield dg.AssetCheckResult(
        check_name="minimum_headlines",
        passed=bool(enough),
        description=(
            f"{len(kept)} headlines, at least FLYWHEEL_MIN_HEADLINES={feeds.min_headlines}."
            if enough
            else _shortfall(day, len(kept), len(raws), feeds, failures, reasons)
        ),
        metadata={
            "headlines": len(kept),
            "min_headlines": feeds.min_headlines,
            "feeds": len(raws),
            "entries_in": entries_in,
            "quarantined": len(quarantine),
            # Check metadata is not plotted: structured, for tools reading the check's evaluation.
            "quarantine_reasons": dg.MetadataValue.json({k: int(v) for k, v in reasons.items()}),
            "feed_failures": dg.MetadataValue.json(failures),
            "source": feeds.describe_day(day),
        },
    )


def _shortfall(
    day: str, n: int, n_feeds: int, feeds: dg.ResourceParam[FeedSource], failures: list[dict], reasons: dict
) -> str:
    """Why the day has too few headlines, for the check's description (the UI and the run's error)."""
    lines = [
        f"{day}: {n} headlines, fewer than FLYWHEEL_MIN_HEADLINES={feeds.min_headlines}; daily_update does not run for this day."
    ]
    if not n_feeds:
        lines.append(f"There were no feeds: nothing in the {feeds.describe_day(day)}.")
    if failures:
        lines.append("Feeds that gave nothing:")
        lines += [f"- {f['feed']}: {f['reason']}: {f['detail']}" for f in failures]
    entry_reasons = {k: int(v) for k, v in reasons.items() if k not in FEED_LEVEL_REASONS}
    if entry_reasons:
        lines.append(f"Entries quarantined: {entry_reasons}.")
    lines.append("Re-run the day once its feeds are readable (live feeds that failed are fetched again).")
    return "\n".join(lines)
