"""The demo's summary says what its outcome figures can show: on the bundled real closes no edge is
expected; on a world file, that its prices are synthetic."""

from scripts.demo_daily_rl import prices_line


def test_the_demo_says_no_edge_is_expected_on_the_bundled_real_prices(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_PRICES_FILE", raising=False)
    monkeypatch.delenv("FLYWHEEL_MARKET_DATA", raising=False)
    line = prices_line()
    assert "bundled real closes" in line and "No edge over the base is expected" in line


def test_the_demo_names_a_synthetic_world(monkeypatch, tmp_path):
    world = tmp_path / "news.csv"
    world.write_text("date,symbol,close\n")
    (tmp_path / "news.csv.world.json").write_text("{}")
    monkeypatch.setenv("FLYWHEEL_PRICES_FILE", str(world))
    assert "SYNTHETIC" in prices_line()
