"""The `flywheel` command line: each command in a subprocess, as a user runs it. Bad input is one
line `flywheel: error: ...` on stderr and a non-zero exit, never a traceback; a command that works
prints no progress bar or library warning on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pandas as pd
import pytest
import torch

from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG
from outcome_flywheel.settings import PROJECT_ROOT

PREFERRED = [{"symbol": "MSFT", "side": "buy", "weight": 0.02}]  # a liked sector, a small size
DISPREFERRED = [{"symbol": s, "side": "buy", "weight": 0.10} for s in ("JPM", "GS", "BAC")]  # a sector turned down


def flywheel(*args: str, **env: str) -> subprocess.CompletedProcess:
    """`flywheel ARGS` with the FLYWHEEL_* variables of `env` only (one torch thread: a shared box)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    clean.update(OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        [sys.executable, "-m", "outcome_flywheel.cli", *args],
        cwd=PROJECT_ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str, code: int | None = None) -> str:
    assert result.returncode != 0 and (code is None or result.returncode == code), (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flywheel: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


def test_flywheel_is_a_console_script():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("flywheel") == "outcome_flywheel.cli:main"


def test_help_lists_the_commands():
    result = flywheel("--help")
    assert result.returncode == 0 and result.stderr == ""
    for command in ("status", "style-score", "make-audit-log", "make-world", "check-settings"):
        assert command in result.stdout
    assert flywheel("style-score", "--help").returncode == 0
    assert_one_line_error(flywheel(), "COMMAND", code=2)
    assert_one_line_error(flywheel("train"), "invalid choice", code=2)
    assert_one_line_error(flywheel("status", "--min-new-pairs", "0"), "--min-new-pairs", code=2)


def test_status_on_an_empty_data_dir(tmp_path):
    result = flywheel("status", FLYWHEEL_DATA_DIR=str(tmp_path))
    assert result.returncode == 0 and result.stderr == ""
    status = json.loads(result.stdout)
    assert status["n_preferences"] == status["n_dpo_pairs"] == 0 and status["latest_adapter"] is None
    assert not status["ready_to_train"] and "no operator decisions materialised yet" in status["blocking_reasons"]
    assert_one_line_error(flywheel("status", FLYWHEEL_DATA_DIR=str(tmp_path / "missing")), "does not exist", code=1)
    assert_one_line_error(
        flywheel("status", FLYWHEEL_DATA_DIR=str(tmp_path), FLYWHEEL_MIN_NEW_PAIRS="many"),
        "FLYWHEEL_MIN_NEW_PAIRS='many'",
        code=2,
    )


def test_check_settings():
    line = assert_one_line_error(
        flywheel("check-settings", FLYWHEEL_SEED="abc"), "FLYWHEEL_SEED='abc'", "not an integer", code=2
    )
    assert "allowed: an integer" in line
    assert_one_line_error(flywheel("check-settings", FLYWHEEL_DEVISE="cpu"), "did you mean FLYWHEEL_DEVICE?", code=2)
    two = flywheel("check-settings", FLYWHEEL_SEED="abc", FLYWHEEL_BACKEND="jax")
    assert two.returncode == 2 and "Traceback" not in two.stderr
    assert [line.split("=")[0] for line in two.stderr.splitlines()] == [
        "flywheel: error: FLYWHEEL_BACKEND",
        "flywheel: error: FLYWHEEL_SEED",
    ]
    ok = flywheel("check-settings", FLYWHEEL_SEED="3", FLYWHEEL_DEVICE="cpu")
    assert ok.returncode == 0 and ok.stderr == "" and "settings ok" in ok.stdout and "FLYWHEEL_SEED=3" in ok.stdout


@pytest.mark.parametrize(
    "orders, needle",
    [
        ("not json", "--orders is not valid JSON"),
        ('{"symbol": "MSFT", "side": "buy", "weight": 0.02}', "must be a JSON list"),
        ("[]", "holds no orders"),
        ('["MSFT"]', "item 1 is not an object"),
        ('[{"symbol": "MSFT", "side": "hold", "weight": 0.02}]', "side"),
        ('[{"symbol": "MSFT", "side": "buy", "weight": 5}]', "weight"),
        ('[{"symbol": "BRK B", "side": "buy", "weight": 0.02}]', "symbol must be one word"),
        ('[{"side": "buy", "weight": 0.02}]', "symbol"),
    ],
)
def test_style_score_refuses_bad_orders_in_one_line(tmp_path, orders, needle):
    assert_one_line_error(flywheel("style-score", "--orders", orders, FLYWHEEL_DATA_DIR=str(tmp_path)), needle, code=2)


def test_style_score_other_bad_input(tmp_path):
    env = {"FLYWHEEL_DATA_DIR": str(tmp_path)}
    good = json.dumps(PREFERRED)
    assert_one_line_error(
        flywheel("style-score", "--orders", "@" + str(tmp_path / "nope.json"), **env), "does not exist", code=1
    )
    assert_one_line_error(
        flywheel("style-score", "--orders", good, "--context", "[1]", **env), "--context must be a JSON object", code=2
    )
    assert_one_line_error(
        flywheel("style-score", "--orders", good, "--adapter", str(tmp_path / "nope"), **env), "adapter folder", code=1
    )
    (tmp_path / "empty").mkdir()
    assert_one_line_error(
        flywheel("style-score", "--orders", good, "--adapter", str(tmp_path / "empty"), **env),
        "no adapter_config.json",
        code=1,
    )
    assert_one_line_error(
        flywheel("style-score", "--orders", good, FLYWHEEL_DATA_DIR=str(tmp_path), FLYWHEEL_BACKEND="jax"),
        "FLYWHEEL_BACKEND",
        code=2,
    )
    assert_one_line_error(flywheel("style-score"), "--orders", code=2)
    # No adapter yet: a result that says so, not an error.
    (tmp_path / "orders.json").write_text(good)
    none_yet = flywheel("style-score", "--orders", "@" + str(tmp_path / "orders.json"), **env)
    assert none_yet.returncode == 0 and none_yet.stderr == ""
    assert json.loads(none_yet.stdout)["available"] is False


def test_make_audit_log_writes_a_file(tmp_path):
    out = tmp_path / "logs" / "ticker.jsonl"
    result = flywheel("make-audit-log", "--operator", "ticker", "--n", "40", "--seed", "3", "--out", str(out))
    assert result.returncode == 0 and result.stderr == "" and str(out) in result.stdout
    lines = out.read_text().splitlines()
    assert len(lines) == 44  # 40 decisions, 2 malformed lines, 1 correction, 1 symbol without prices
    assert json.loads(lines[0])["decision_id"] == "d-0001"
    # The defaults to stdout are the bundled sample.
    sample = flywheel("make-audit-log")
    assert sample.returncode == 0 and sample.stdout.splitlines() == BUNDLED_AUDIT_LOG.read_text().splitlines()
    assert_one_line_error(flywheel("make-audit-log", "--operator", "nobody"), "invalid choice", code=2)
    assert_one_line_error(flywheel("make-audit-log", "--n", "5"), "at least 20", code=2)
    assert_one_line_error(flywheel("make-audit-log", "--out", str(tmp_path)), "is a folder", code=2)


def test_make_world_writes_a_price_file_the_loop_reads(tmp_path):
    from outcome_flywheel.daily_rl.worlds.prices import WorldConfig, make_world, price_csv
    from outcome_flywheel.market_data import MarketData

    out = tmp_path / "worlds" / "inverted.csv"
    result = flywheel(
        "make-world",
        "--kind",
        "inverted",
        "--seed",
        "3",
        "--move-pct",
        "1.5",
        "--noise-pct",
        "0.8",
        "--drift-pct",
        "0.01",
        "--max-headlines",
        "12",
        "--out",
        str(out),
    )
    assert result.returncode == 0 and result.stderr == "" and "SYNTHETIC inverted world" in result.stdout
    # The same file as the Python function's, and one the loop's price reader takes as FLYWHEEL_PRICES_FILE.
    prices, _ = make_world(
        WorldConfig("inverted", seed=3, move_pct=1.5, noise_pct=0.8, drift_pct=0.01), max_headlines=12
    )
    assert out.read_bytes() == price_csv(prices)
    assert "SPY" in MarketData(prices_file=str(out)).universe()
    manifest = json.loads((tmp_path / "worlds" / "inverted.csv.world.json").read_text())
    assert manifest["synthetic"] is True and (manifest["kind"], manifest["move_pct"], manifest["max_headlines"]) == (
        "inverted",
        1.5,
        12,
    )
    assert_one_line_error(flywheel("make-world", "--kind", "bullish", "--out", str(out)), "invalid choice", code=2)
    assert_one_line_error(flywheel("make-world", "--kind", "news"), "--out", code=2)
    assert_one_line_error(flywheel("make-world", "--kind", "news", "--out", str(tmp_path)), "is a folder", code=2)
    assert_one_line_error(
        flywheel("make-world", "--kind", "news", "--out", str(tmp_path / "w.parquet")), ".csv", code=2
    )
    assert_one_line_error(
        flywheel("make-world", "--kind", "news", "--noise-pct", "inf", "--out", str(out)), "finite", code=2
    )
    assert_one_line_error(
        flywheel("make-world", "--kind", "news", "--move-pct", "-1", "--out", str(out)), ">= 0", code=2
    )
    assert_one_line_error(
        flywheel("make-world", "--kind", "null", "--archive", str(tmp_path / "none"), "--out", str(out)),
        "no day folders",
        code=1,
    )


# -- on a trained adapter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_data_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """A data dir holding tiny-local and a preference adapter trained on the bundled sample (3 epochs:
    the default 8 separate more, at 4x the time), published as the adapter asset does."""
    from outcome_flywheel.market_data import BUNDLED_PRICES, read_price_file
    from outcome_flywheel.models.loader import ModelLoader
    from outcome_flywheel.models.train.dpo_config import WeightedDPOConfig
    from outcome_flywheel.preferences.audit_log import load_orders, parse_file, records_frame
    from outcome_flywheel.preferences.status import ADAPTERS_DIR, TRAIN_INFO
    from outcome_flywheel.preferences.style_match import training_pairs
    from outcome_flywheel.preferences.weighting import build_pairs
    from outcome_flywheel.preferences.windows import compute_outcome
    from outcome_flywheel.storage import atomic_symlink
    from outcome_flywheel.trading_sessions import PriceTable

    root = tmp_path_factory.mktemp("trained") / "data"
    (root / "models").mkdir(parents=True)
    os.symlink(tiny_model_dir, root / "models" / "tiny-local")
    decisions = records_frame(parse_file(BUNDLED_AUDIT_LOG), "America/New_York")
    prices = PriceTable(read_price_file(BUNDLED_PRICES))
    outcomes = pd.DataFrame(
        [
            {**compute_outcome(r.ts_utc, load_orders(r.proposal_orders_json), prices), "decision_id": r.decision_id}
            for r in decisions.itertuples(index=False)
        ]
    )
    pairs, _ = build_pairs(decisions, outcomes)
    config = WeightedDPOConfig(epochs=3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        backend = ModelLoader(data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu").load()
        train_weighted_dpo(backend, training_pairs(pairs), config)
    finally:
        torch.set_num_threads(threads)
    run_dir = root.joinpath(*ADAPTERS_DIR, "test-run")
    run_dir.mkdir(parents=True)
    backend.save(run_dir)
    (run_dir / TRAIN_INFO).write_text(
        json.dumps({"run": "test-run", "config": config.as_dict(), "prompt_context_keys": []})
    )
    atomic_symlink(run_dir, root.joinpath(*ADAPTERS_DIR, "latest"))
    return root


def test_preferred_and_dispreferred_proposals_read_differently(trained_data_dir):
    from outcome_flywheel.preferences.metrics import STYLE_BANDS

    env = {"FLYWHEEL_DATA_DIR": str(trained_data_dir), "FLYWHEEL_DEVICE": "cpu"}
    results = []
    # The latest adapter, then the same folder named with --adapter.
    for orders, extra in (
        (PREFERRED, ()),
        (DISPREFERRED, ("--adapter", str(trained_data_dir / "adapters" / "preference" / "test-run"))),
    ):
        run = flywheel(
            "style-score", "--orders", json.dumps(orders), "--context", '{"regime": "neutral"}', *extra, **env
        )
        assert run.returncode == 0, run.stderr
        assert run.stderr == ""  # no progress bar, no library warning
        results.append(json.loads(run.stdout))
    liked, disliked = results
    assert liked["available"] and disliked["available"]
    assert (
        liked["adapter_path"]
        == disliked["adapter_path"]
        == str((trained_data_dir / "adapters" / "preference" / "test-run").resolve())
    )
    assert liked["style_match_score"] > disliked["style_match_score"]
    comments = [comment for _, comment in STYLE_BANDS]
    # Different bands, the liked plan's the higher one.
    assert comments.index(liked["comment"]) < comments.index(disliked["comment"]), (liked, disliked)
