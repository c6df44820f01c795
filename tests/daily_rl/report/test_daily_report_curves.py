"""`daily_report` shows, inline, the price reward per day, the staleness and clip fraction of the delayed price step,
and the hit rate of policy vs base over days, from tables written by the test (tests/daily_history_fixtures.py);
and it says which prices the outcomes come from (the bundled real closes: no edge expected; a world: synthetic)."""

import base64
import re

import dagster as dg
import pandas as pd
import pytest

from assets.daily_rl.daily_report import daily_report
from outcome_flywheel.daily_rl.report.charts import hit_rate_figure, off_policy_figure, price_reward_figure
from outcome_flywheel.daily_rl.report.summary import hit_rate_by_day, over_days, prices_note
from outcome_flywheel.market_data import BUNDLED_PRICES, MarketData
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from tests.daily_history_fixtures import DAYS, PENDING_DAYS, PRICE_DAYS, write_history

PNG = b"\x89PNG"


@pytest.fixture()
def reported(tmp_path):
    warehouse = Warehouse(data_dir=str(tmp_path))
    tables = write_history(warehouse)
    day = DAYS[-1]
    result = dg.materialize(
        [daily_report],
        partition_key=day,
        resources={
            "warehouse": warehouse,
            "market_data": MarketData(data_dir=str(tmp_path)),
            "tracking": Tracker(data_dir=str(tmp_path), tracking_uri="off"),
        },
    )
    assert result.success
    meta = result.asset_materializations_for_node("daily_report")[0].metadata
    return tmp_path, tables, meta["report"].value, meta


def _table_row(markdown: str, day: str, header: str) -> dict[str, str]:
    """The row of `day` in the markdown table whose header line starts with `| {header}`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header}"))
    names = [c.strip() for c in lines[start].strip("|").split("|")]
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == day:
            return dict(zip(names, cells))
    raise AssertionError(f"no row for {day}")


def test_the_report_holds_price_reward_staleness_clip_fraction_and_hit_rates_over_days(reported):
    root, tables, markdown, meta = reported
    price = tables["price_training"].set_index("date")
    outcomes = tables["rollout_outcomes"]
    # numbers: the price step of each training day, as written
    day = PRICE_DAYS[-3]
    row = _table_row(markdown, day, "day | price reward")
    assert row["price reward"] == f"{price.loc[day, 'mean_price_reward']:.3f}"
    assert row["staleness"] == f"{price.loc[day, 'staleness_mean']:.3f}"
    assert row["clip fraction"] == f"{price.loc[day, 'clip_fraction']:.3f}"
    assert row["notes on price"] == str(int(price.loc[day, "price_notes_trained"]))
    # the hit rate of that day's matured calls, counted here independently of the code under test
    mine = outcomes[(outcomes["date"] == day) & (outcomes["status"] == "matured")]
    for side in ("policy", "base"):
        expected = (mine.loc[mine["source"] == side, "vs_spy_pct"] > 0).mean()
        assert row[f"hit rate {side}"] == f"{expected:.3f}"
    assert row["matured calls"] == str(int((mine["source"] == "policy").sum()))
    # a pending day has no hit rate yet; a day before the first price step has no price reward
    assert _table_row(markdown, PENDING_DAYS[-1], "day | price reward")["hit rate policy"] == "–"
    # the curves, inline and on disk, each with its title as alt text
    for name, title in (
        ("hit_rate", "Hit rate of each day's calls, policy vs base"),
        ("price", "Price reward per training day"),
        ("off_policy", "Staleness and truncated IS ratio of the price step, clip fraction of the update"),
    ):
        inline = re.search(rf"!\[{re.escape(title)}\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
        assert inline, name
        on_disk = (root / "reports" / "daily_rl" / DAYS[-1] / f"{name}.png").read_bytes()
        assert base64.b64decode(inline.group(1)) == on_disk and on_disk[:4] == PNG
    # the demo's prices are the bundled real closes, and the report says no edge is expected there
    assert "bundled real closes" in markdown and "No edge over the base is expected" in markdown
    assert meta["bundled_real_prices"].value is True


def test_the_curves_draw_what_they_are_given():
    """The same figure from other numbers is another picture; empty tables still give a picture that says so."""
    outcomes = pd.DataFrame(
        dict(
            date=["2025-11-03"] * 4 + ["2025-11-04"] * 4,
            source=["policy", "policy", "base", "base"] * 2,
            status="matured",
            vs_spy_pct=[1.0, -1.0, 2.0, -0.5, 0.3, 0.2, -0.1, 0.4],
        )
    )
    by_day = hit_rate_by_day(outcomes)
    assert list(by_day["policy_hit_rate"]) == [0.5, 1.0] and list(by_day["base_hit_rate"]) == [0.5, 0.5]
    flipped = hit_rate_by_day(outcomes.assign(vs_spy_pct=-outcomes["vs_spy_pct"]))
    assert hit_rate_figure(by_day) != hit_rate_figure(flipped)
    for figure in (
        hit_rate_figure(by_day.iloc[:0]),
        price_reward_figure(pd.DataFrame()),
        off_policy_figure(pd.DataFrame()),
    ):
        assert figure[:4] == PNG
    assert over_days(pd.DataFrame(), by_day)["date"].tolist() == ["2025-11-03", "2025-11-04"]


def test_hit_rates_leave_out_pending_calls_and_look_ahead_days():
    outcomes = pd.DataFrame(
        dict(
            date=["d1", "d1", "d1", "d1", "d2", "d2"],
            source=["policy", "policy", "base", "base", "policy", "base"],
            status=["matured", "pending", "matured", "no_data", "matured", "matured"],
            vs_spy_pct=[1.0, None, -1.0, None, 2.0, 3.0],
            look_ahead=[False, False, False, False, True, False],
        )
    )
    by_day = hit_rate_by_day(outcomes).set_index("date")
    assert by_day.loc["d1", "policy_calls"] == 1 and by_day.loc["d1", "base_calls"] == 1
    assert by_day.loc["d1", "policy_hit_rate"] == 1.0 and by_day.loc["d1", "base_hit_rate"] == 0.0
    assert "d2" not in by_day.index  # a look-ahead day is left out on both sides, as in the A/B


def test_the_report_names_its_prices(tmp_path):
    assert "No edge over the base is expected" in prices_note("file", str(BUNDLED_PRICES), str(BUNDLED_PRICES))
    world = tmp_path / "news.csv"
    world.write_text("date,symbol,close\n")
    assert "SYNTHETIC" not in prices_note("file", str(world), str(BUNDLED_PRICES))
    (tmp_path / "news.csv.world.json").write_text("{}")
    note = prices_note("file", str(world), str(BUNDLED_PRICES))
    assert "SYNTHETIC" in note and "news.csv.world.json" in note and "No edge" not in note
    assert "Yahoo" in prices_note("yfinance", None, str(BUNDLED_PRICES))
