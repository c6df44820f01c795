"""The learning grid's bookkeeping and figures (benchmarks/learning_grid.py, benchmarks/_grid_table.py) on made-up
cells: the planted side per world, opposite sides between news and inverted, resume and refuse, the record."""

from __future__ import annotations

import argparse
import json
import os

import pandas as pd
import pytest

from benchmarks import _results
from benchmarks import learning_grid as lg
from benchmarks._grid_table import ablation_markdown, ablation_rows, cell_name, opposite_sides, world_table
from benchmarks.outcome_learning import NOTE_COLUMNS


def _cell(world: str, ws: int, ts: int, policy_long_on_good: float, headlines: int = 12, per: int = 4) -> dict:
    """A cell whose policy goes long on good news with probability `policy_long_on_good` (and short on bad news
    as often), whose base goes long half the time; every note calls the headline's company."""
    rows, sides = [], []
    for h in range(headlines):
        date, hid, news = f"2025-11-{10 + h % 3:02d}", f"h{h}", 1 if h % 2 == 0 else -1
        majority = {}
        for source, p in (("policy", policy_long_on_good), ("base", 0.5)):
            votes = 0
            for k in range(per):
                with_news = k < round(p * per)
                long = with_news if news > 0 else not with_news
                votes += 1 if long else -1
                rows.append(
                    dict(
                        date=date,
                        headline_id=hid,
                        source=source,
                        rollout_index=k,
                        symbol="AAPL",
                        side="long" if long else "short",
                        parse_status="ok",
                        status="matured",
                        vs_spy_pct=1.0 if long == (news > 0) else -1.0,
                        entry_date=date,
                        structure_score=0.5,
                        news=news,
                        names_company=True,
                        company_call=True,
                    )
                )
            majority[source] = (votes > 0) - (votes < 0)
        sides.append(dict(date=date, headline_id=hid, news=news, names_company=True, policy_side=majority["policy"]))
    split = lambda f: json.loads(f.to_json(orient="split", index=False))  # noqa: E731
    return dict(
        name=cell_name(world, ws, ts),
        world=world,
        world_seed=ws,
        train_seed=ts,
        notes=split(pd.DataFrame(rows, columns=NOTE_COLUMNS)),
        sides=split(pd.DataFrame(sides)),
        held_out=dict(ab=dict(hit_rate=dict(label="better"))),
        per_day=[
            dict(phase="train", kl_to_base=0.01, gate="accepted"),
            dict(phase="train", kl_to_base=0.02, gate="rejected"),
            dict(phase="held_out", kl_to_base=0.02, gate="accepted"),
        ],
        wall_s=1.0,
    )


def test_side_accuracy_reads_the_planted_side_of_each_world():
    news = world_table([_cell("news", 0, 0, 0.75), _cell("news", 1, 0, 1.0)], "news", n_boot=200)
    assert news["side_accuracy"]["policy"]["estimate"] == pytest.approx(0.875)
    assert news["side_accuracy"]["base"]["estimate"] == pytest.approx(0.5)
    assert news["side_accuracy"]["per_cell_policy"]["values"] == [0.75, 1.0]
    assert news["long_gap_good_minus_bad"]["policy"]["estimate"] == pytest.approx(0.75)  # 0.875 - 0.125
    low, high = news["side_accuracy"]["difference"]["ci"]
    assert low <= 0.375 <= high and news["side_accuracy"]["difference"]["clusters"] == 12  # headlines, not notes
    assert news["company_share"]["policy"]["estimate"] == 1.0
    assert news["kl_to_base"]["values"] == [0.02, 0.02]  # the last training day's
    assert news["gate_rejections"] == dict(total=2, per_cell=[1, 1])
    # the same notes in the inverted world are wrong where they were right
    inverted = world_table([_cell("inverted", 0, 0, 0.75)], "inverted", n_boot=200)
    assert inverted["side_accuracy"]["policy"]["estimate"] == pytest.approx(0.25)
    null = world_table([_cell("null", 0, 0, 0.75)], "null", n_boot=200)
    assert "side_accuracy" not in null and null["long_share"]["policy"]["estimate"] == pytest.approx(0.5)


def test_opposite_sides_pair_news_and_inverted_of_the_same_seeds():
    cells = [_cell("news", 0, 0, 1.0), _cell("inverted", 0, 0, 0.0), _cell("news", 0, 1, 1.0)]
    cells.append(_cell("inverted", 0, 1, 1.0))
    result = opposite_sides(cells, n_boot=200)
    assert result["per_pair"]["w0-t0"]["share"] == 1.0  # news long on good, inverted short on good: opposite
    assert result["per_pair"]["w0-t1"]["share"] == 0.0
    assert result["share"]["estimate"] == pytest.approx(0.5) and result["share"]["clusters"] == 12


def _args(**overrides) -> argparse.Namespace:
    values = dict(
        arm="defaults",
        config=None,
        worlds="news,inverted",
        world_seeds="0,1",
        train_seeds="0,1,2",
        days=26,
        train_days=11,
        headlines=8,
        max_new_tokens=128,
        learning_rate=2e-3,
        epochs=None,
        reward_weights=None,
        move_pct=2.0,
        noise_pct=1.0,
        model="tiny-local",
        synthetic_days=0,
        device="cpu",
    )
    values.update(overrides)
    return argparse.Namespace(**values)


def test_a_grid_resumes_with_its_arguments_and_refuses_others(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)
    grid = lg.grid_of(_args())
    assert len(lg.cells_of(grid)) == 12
    assert lg.check_grid(tmp_path, grid) is None and (tmp_path / "grid.json").exists()
    assert lg.check_grid(tmp_path, lg.grid_of(_args())) is None  # the same arguments: resume
    problem = lg.check_grid(tmp_path, lg.grid_of(_args(config='{"epochs": 1}')))
    assert problem and "config" in problem
    # the FLYWHEEL_* variables the cells inherit are the grid's too (not those a cell sets for itself)
    monkeypatch.setenv("FLYWHEEL_PRICES_FILE", "/elsewhere/prices.csv")
    assert lg.check_grid(tmp_path, lg.grid_of(_args())) is None
    monkeypatch.setenv("FLYWHEEL_NOTE_FORMAT", "call_first")
    assert lg.grid_of(_args())["settings"] == {"FLYWHEEL_NOTE_FORMAT": "call_first"}
    problem = lg.check_grid(tmp_path, lg.grid_of(_args()))
    assert problem and "FLYWHEEL_NOTE_FORMAT" in problem
    monkeypatch.delenv("FLYWHEEL_NOTE_FORMAT")
    # the summary is over the cells that exist; the rest are listed as missing
    lg.write_json(tmp_path / "cells" / "news-w0-t0.json", _cell("news", 0, 0, 1.0))
    results = lg.summarise(tmp_path, grid, n_boot=100)
    assert results["cells"]["done"] == 1 and len(results["cells"]["missing"]) == 11
    assert results["worlds"]["news"]["side_accuracy"]["policy"]["estimate"] == 1.0
    assert results["machine"]["cpu_count"] >= 1 and results["grid"]["train_seeds"] == [0, 1, 2]
    assert results["machine"]["cpu_capability"] == _results.cpu_capability() and "cpu_model" in results["machine"]
    json.dumps(results)  # plain JSON all through


def test_record_replaces_the_same_arm_and_grid(tmp_path):
    path = tmp_path / "learning_grid.json"
    lg.record(dict(arm="a", grid={"days": 16}, x=1), path)
    lg.record(dict(arm="b", grid={"days": 16}, x=2), path)
    lg.record(dict(arm="a", grid={"days": 16}, x=3), path)
    lg.record(dict(arm="a", grid={"days": 26}, x=4), path)
    assert [(e["arm"], e["x"]) for e in json.loads(path.read_text())] == [("b", 2), ("a", 3), ("a", 4)]


def test_the_daily_benchmarks_judge_with_flywheel_judge_model(tmp_path, monkeypatch):
    from benchmarks._daily_common import resources

    monkeypatch.delenv("FLYWHEEL_JUDGE_MODEL", raising=False)
    assert resources(tmp_path, 2)["judge"].judge_model == ""  # the frozen base model
    monkeypatch.setenv("FLYWHEEL_JUDGE_MODEL", "tiny-local")
    assert resources(tmp_path, 2)["judge"].judge_model == "tiny-local"


def test_the_ablation_table_has_a_row_per_recorded_arm_with_its_intervals(tmp_path, monkeypatch, capsys):
    """Each arm's figures as recorded, policy side accuracy and hit rate, calls on the company as policy - base,
    opposite sides between worlds; an arm without a world shows `-`; `--ablation` prints the record's table."""
    for name in [k for k in os.environ if k.startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)
    grid = lg.grid_of(_args(world_seeds="0", train_seeds="0"))
    for cell in (_cell("news", 0, 0, 1.0), _cell("inverted", 0, 0, 0.0)):
        lg.write_json(tmp_path / "cells" / f"{cell['name']}.json", cell)
    both = lg.summarise(tmp_path, grid, n_boot=100)
    only_news = lg.summarise(tmp_path, dict(grid, arm="news-only", worlds=["news"]), n_boot=100)
    rows = ablation_rows([both, only_news])
    assert [r["arm"] for r in rows] == ["defaults", "news-only"]
    assert rows[0]["grid"] == "26 d, 1 w x 1 t" and rows[0]["cells"] == "2/2"
    assert rows[0]["side news"].startswith("1.000 [") and rows[0]["side inverted"].startswith("1.000 [")
    assert rows[0]["company news"].startswith("0.000 [")  # every note calls the company, as the base's do
    assert rows[0]["opposite"].startswith("1.000 [") and rows[0]["rejections"] == 2
    assert rows[0]["better"] == "2/2" and rows[0]["null gap"] == "-"
    assert rows[1]["side inverted"] == "-" and rows[1]["opposite"] == "-" and rows[1]["cells"] == "1/1"
    table = ablation_markdown(rows).splitlines()
    assert len(table) == 4 and table[0].startswith("| arm | grid |") and table[2].startswith("| defaults |")
    record = tmp_path / "learning_grid.json"
    lg.record(both, record)
    monkeypatch.setattr(lg, "RECORD", record)
    monkeypatch.setattr("sys.argv", ["learning_grid", "--ablation"])
    lg.main()
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[2].startswith("| defaults |") and json.loads(printed[-1])["arms"] == 1
