"""The status page's pictures of the daily loop's curves (reward, KL, hit rate policy vs base, price reward,
staleness and clip fraction), each with alt text that carries the last day's numbers, and its tables rounded for a
person (the JSON API keeps every digit). Tables written by the test: tests/daily_history_fixtures.py."""

from __future__ import annotations

import base64
import html
import re

import pytest

from outcome_flywheel.daily_rl.report import status as daily_status
from outcome_flywheel.storage import Warehouse
from service.pages.routes import cell
from tests.daily_history_fixtures import DAYS, PENDING_DAYS, history_tables, write_history

IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]*)">')


@pytest.fixture()
def history(world):
    tables = history_tables()
    tables["policy_training"].loc[1, "policy_version"] = '<script>alert("v")</script>'
    write_history(Warehouse(data_dir=str(world)), tables)
    return tables


def _table(page: str, table_id: str) -> tuple[list[str], list[list[str]]]:
    body = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S).group(1)
    header = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", body)]
    rows = [
        [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)[1:]
    ]
    return header, rows


def _rounded(text: str) -> bool:
    """Not a number, or one with at most 3 decimals or at most 3 significant digits."""
    m = re.fullmatch(r"-?(\d+)\.(\d+)", text)
    if not m:
        return True
    return len(m.group(2)) <= 3 or len((m.group(1) + m.group(2)).lstrip("0")) <= 3


def test_the_status_page_shows_the_curves_as_pictures_with_alt_text(client, history):
    page = client.get("/status")  # anonymous: reads are open
    assert page.status_code == 200
    images = IMG.findall(page.text)
    assert len(images) == 5
    for data, alt in images:
        assert base64.b64decode(data)[:4] == b"\x89PNG" and len(alt) > 40
    alts = {
        re.search(r'id="figure-(\w+)"><img[^>]*alt="([^"]*)"', m.group(0)).group(1): html.unescape(m.group(0))
        for m in re.finditer(r'<figure class="card" id="figure-\w+"><img[^>]*>', page.text)
    }
    assert set(alts) == {"reward", "kl", "hit_rate", "price", "off_policy"}
    # the alt text says what a sighted reader gets from the picture: the span and the last day's numbers
    price = history["price_training"].iloc[-1]
    assert (
        f"on {price['date']}: {price['mean_price_reward']:.3f} over {int(price['price_notes_trained'])} notes"
        in alts["price"]
    )
    assert f"clip fraction {price['clip_fraction']:.3f}" in alts["off_policy"] and "staleness" in alts["off_policy"]
    outcomes = history["rollout_outcomes"]
    last_matured = sorted(set(DAYS) - set(PENDING_DAYS))[-1]
    mine = outcomes[(outcomes["date"] == last_matured) & (outcomes["source"] == "policy")]
    assert f"on {last_matured}: policy {(mine['vs_spy_pct'] > 0).mean():.3f} over {len(mine)} calls" in alts["hit_rate"]
    assert f"{len(DAYS)} days from {DAYS[0]} to {DAYS[-1]}" in alts["reward"]
    # markup in a table value is text
    assert "<script>alert" not in page.text and "&lt;script&gt;alert(&#34;v&#34;)&lt;/script&gt;" in page.text


def test_the_status_tables_are_rounded_and_the_api_keeps_the_digits(client, history):
    page = client.get("/status").text
    for table_id in ("daily-history", "daily-history-vs-base", "daily-eval"):
        header, rows = _table(page, table_id)
        cells = [c for row in rows for c in row]
        assert cells and not [c for c in cells if not _rounded(c)], table_id
    by_day: dict = {}
    for table_id in ("daily-history", "daily-history-vs-base"):
        header, rows = _table(page, table_id)
        for row in rows:
            by_day.setdefault(row[0], {}).update(zip(header, row))
    report = history["daily_report"].set_index("date")
    day = DAYS[3]
    assert by_day[day]["mean structure"] == f"{report.loc[day, 'mean_structure']:.3f}"
    assert by_day[day]["kl to base"] == f"{report.loc[day, 'kl_to_base']:.3g}"
    assert by_day[day]["trained"] == "yes" and by_day[DAYS[0]]["trained"] == "no"
    assert by_day[day]["price notes trained"] == str(
        int(history["price_training"].set_index("date").loc[day, "price_notes_trained"])
    )
    assert by_day[PENDING_DAYS[-1]]["policy hit rate"] == "—"  # pending calls: no hit rate yet
    api = {r["date"]: r for r in client.get("/api/rl/history").json()["daily_rl"]}
    assert api[day]["mean_structure"] == pytest.approx(report.loc[day, "mean_structure"], abs=1e-12)
    assert {"policy_hit_rate", "base_hit_rate", "mean_price_reward", "staleness_mean", "clip_fraction"} <= set(api[day])


def test_figures_are_drawn_once_per_state_of_their_tables(world, history, monkeypatch):
    warehouse = Warehouse(data_dir=str(world))
    drawn = []
    real = daily_status._draw
    monkeypatch.setattr(daily_status, "_draw", lambda wh: drawn.append(1) or real(wh))
    first = daily_status.daily_figures(warehouse)
    assert daily_status.daily_figures(warehouse) is first and len(drawn) == 1
    frame = history["price_training"]
    warehouse.write(
        "price_training", frame[frame["date"] == DAYS[-1]].assign(mean_price_reward=0.9), partition=DAYS[-1]
    )
    again = daily_status.daily_figures(warehouse)
    assert len(drawn) == 2 and again is not first
    assert [f["png"] for f in again if f["name"] == "price"] != [f["png"] for f in first if f["name"] == "price"]


def test_a_world_without_history_shows_no_empty_pictures(client):
    page = client.get("/status")
    assert page.status_code == 200 and "<img" not in page.text


def test_the_status_page_takes_no_writes_and_reflects_no_input(client, history, world):
    before = sorted(p.relative_to(world) for p in world.rglob("*") if "__pycache__" not in p.parts)
    assert client.post("/status", data={"x": "1"}).status_code == 401  # anonymous write: refused before routing
    page = client.get("/status", params={"q": "<img src=x onerror=alert(1)>"})
    assert page.status_code == 200 and "onerror=alert(1)" not in page.text
    after = sorted(p.relative_to(world) for p in world.rglob("*") if "__pycache__" not in p.parts)
    assert before == after


@pytest.mark.parametrize(
    "value, column, shown",
    [
        (0.474512, "mean_price_reward", "0.475"),
        (0.003072, "kl_to_base", "0.00307"),
        (0.001197, "loss", "0.0012"),
        (12.0, "n", "12"),
        (48.0, "price_notes_trained", "48"),
        (0.0035, "feedback_rate", "0.0035"),
        (-0.07143, "difference", "-0.071"),
        (None, "loss", "—"),
        (float("nan"), "reward_avg", "—"),
        (True, "trained", "yes"),
        (25.0912, "wall_s", "25.091"),
        ("2026-11-22T17:40:10.715271+00:00", "finished_at", "2026-11-22 17:40 UTC"),
        ("2025-11-04@84279f95271e", "policy_version", "2025-11-04@84279f95271e"),
    ],
)
def test_cells_are_rounded_for_a_person(value, column, shown):
    assert cell(value, column) == shown
