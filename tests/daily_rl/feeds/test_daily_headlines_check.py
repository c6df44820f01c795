"""The blocking `minimum_headlines` check: a day without headlines stops before `daily_update`."""

import dagster as dg

from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.headlines import headlines
from outcome_flywheel.daily_rl.feeds.source import FeedSource
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.settings import SAMPLE_DATA
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from resources.daily_rl import FeedsResource
from resources.steps import StepRunnerResource

ARCHIVE = SAMPLE_DATA / "feeds_archive"
DAY = "2025-11-05"
# Loopback, discard port: nothing listens there, so the connection is refused at once.
UNREACHABLE = "http://127.0.0.1:9/feed.xml"


def _resources(root, feeds: FeedSource) -> dict:
    # daily_update never runs in these tests, so its resources are never loaded (no model needed).
    return dict(
        warehouse=Warehouse(data_dir=str(root)),
        model_backend=ModelLoader(data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu"),
        feeds=feeds,
        judge=Judge(),
        market_data=MarketData(data_dir=str(root)),
        step_runner=StepRunnerResource(runner="in_process"),
        tracking=Tracker(data_dir=str(root), tracking_uri="off"),
    )


def _check(result, name: str):
    found = [c for c in result.get_asset_check_evaluations() if c.check_name == name]
    assert len(found) == 1, [c.check_name for c in result.get_asset_check_evaluations()]
    return found[0]


def _started_steps(result) -> set[str]:
    return {e.step_key for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START}


def test_a_day_whose_every_live_feed_fails_stops_before_daily_update(tmp_path):
    # A real, valid feed behind a file:// URL: it must be quarantined, not read.
    local = tmp_path / "feed.xml"
    local.write_bytes((ARCHIVE / DAY / "market-wire.xml").read_bytes())
    file_url = local.as_uri()
    feeds = FeedSource(feed_urls=f"{UNREACHABLE},{file_url}", data_dir=str(tmp_path / "data"), timeout_s=5)
    res = _resources(tmp_path / "data", feeds)

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        [headlines, daily_update], partition_key=DAY, resources=res, instance=instance, raise_on_error=False
    )

    assert not result.success
    check = _check(result, "minimum_headlines")
    assert check.passed is False and check.blocking
    meta = {k: v.value for k, v in check.metadata.items()}
    assert meta["headlines"] == 0 and meta["min_headlines"] == 1 and meta["feeds"] == 2
    assert meta["quarantine_reasons"] == {"fetch_failed": 2}
    failures = {f["feed"]: f for f in meta["feed_failures"]}
    assert set(failures) == {UNREACHABLE, file_url}
    assert all(f["reason"] == "fetch_failed" for f in failures.values())
    assert "refused" in failures[UNREACHABLE]["detail"].lower()
    assert "http(s)" in failures[file_url]["detail"] and "FLYWHEEL_FEEDS_ARCHIVE" in failures[file_url]["detail"]
    assert UNREACHABLE in check.description and file_url in check.description
    # Counts still balance: 0 entries in = 0 headlines + 0 quarantined entries (2 feed-level rows).
    assert _check(result, "entries_accounted_for").passed
    # The blocking check stopped the day: daily_update did not run, nothing of it was materialised.
    assert _started_steps(result) == {"headlines"}
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    assert "Dependencies for step daily_update failed: ['headlines']. Not executing." in messages
    assert not result.asset_materializations_for_node("daily_update")
    wh = res["warehouse"]
    assert wh.partitions("rollouts") == [] and wh.partitions("policy_checkpoint") == []
    # What did happen is on record: the (empty) day and its quarantine rows, with the reasons.
    assert len(wh.read("headlines", DAY)) == 0
    assert sorted(wh.read("headlines_quarantine", DAY)["feed_file"]) == sorted([UNREACHABLE, file_url])


def test_a_normal_archive_day_passes(tmp_path):
    feeds = FeedSource(archive_dir=str(ARCHIVE), data_dir=str(tmp_path))
    result = dg.materialize(
        [headlines], partition_key=DAY, resources={"warehouse": Warehouse(data_dir=str(tmp_path)), "feeds": feeds}
    )
    assert result.success
    check = _check(result, "minimum_headlines")
    assert check.passed and check.blocking
    assert check.metadata["headlines"].value >= 20 and check.metadata["min_headlines"].value == 1
    assert _check(result, "entries_accounted_for").passed


def test_the_minimum_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_FEEDS_ARCHIVE", str(ARCHIVE))
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FLYWHEEL_MIN_HEADLINES", "29")
    monkeypatch.setenv("FLYWHEEL_MAX_HEADLINES", "29")
    feeds = FeedsResource.from_env(max_headlines=5)  # the demo's small days: 5 kept, fewer than 29
    result = dg.materialize(
        [headlines],
        partition_key=DAY,
        resources={"warehouse": Warehouse(data_dir=str(tmp_path)), "feeds": feeds},
        raise_on_error=False,
    )
    assert not result.success
    check = _check(result, "minimum_headlines")
    assert not check.passed
    assert check.metadata["headlines"].value == 5 and check.metadata["min_headlines"].value == 29
    assert "over_cap" in check.metadata["quarantine_reasons"].value
    assert "5 headlines" in check.description and "29" in check.description


def test_a_day_missing_from_the_archive_fails_and_says_so(tmp_path):
    archive = tmp_path / "archive"  # the day is a partition (the bundled archive's window); its folder is missing here
    archive.mkdir()
    feeds = FeedSource(archive_dir=str(archive), data_dir=str(tmp_path))
    result = dg.materialize(
        [headlines],
        partition_key=DAY,
        resources={"warehouse": Warehouse(data_dir=str(tmp_path)), "feeds": feeds},
        raise_on_error=False,
    )
    check = _check(result, "minimum_headlines")
    assert not result.success and not check.passed
    assert check.metadata["feeds"].value == 0
    assert "no feeds" in check.description and str(archive / DAY) in check.description
