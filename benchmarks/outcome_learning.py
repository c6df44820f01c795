"""Does the daily loop learn what the prices reward, and nothing where they reward nothing? Runs the whole
`daily_rl` group in order, day by day, on tiny-local in three SYNTHETIC worlds (`flywheel make-world`,
outcome_flywheel/daily_rl/worlds/prices.py): `news` (the headline's company moves with its news), `inverted`
(against it) and `null` (random walks). Same archive days, headlines, seeds and settings in every world;
only the price file differs. The settings are the project's defaults (what anyone running the assets
gets: the model's own, `MODEL_RUN_DEFAULTS`, over `RewardConfig` and `GSPOConfig`), unless
`--reward-weights`, `--learning-rate`, `--epochs` or `--config` say otherwise.
`--train-seeds` repeats each world per training seed (FLYWHEEL_SEED: sampling, minibatch order, LoRA
init) and prints each figure's mean and range over them; `--synthetic-days N` runs on a SYNTHETIC
archive of N days made from the bundled one's event templates (`worlds/synthetic_feeds.py`) instead.

The first `--train-days` days train; the later days are held out: the policy is frozen (learning rate 0)
and writes notes on headlines it never trained on. Printed per world, over the held-out days only, with
the project's own tests (`evaluation.ab.evaluate_day`, `evaluation.backtest.run_backtest`): hit rate and mean
`vs_spy_pct` of policy and base (t-test over entry sessions; 10 are needed for a label), the share of
calls on the headline's company, the long share of company calls on good and on bad news, and the
back-test. Then, `inverted` vs `news`: the share of held-out headlines on which the two policies take
opposite sides (each policy's majority side among its notes' calls on the headline's company).

    python -m benchmarks.outcome_learning [--days 26] [--train-days 11] [--headlines 8] [--worlds news,inverted,null]
        [--train-seeds 0,1,2] [--synthetic-days 0] [--model tiny-local | smollm2-135m-instruct | a local folder]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks._daily_common import archive_days, resources, tiny_local_data_dir
from benchmarks._results import add_record_argument, finish

WORLDS = ("news", "inverted", "null")
DEFAULT_WEIGHTS = None  # the project's defaults (RewardConfig): what anyone running the assets gets
SIDE_SIGN = {"long": 1, "short": -1}


def _read_days(warehouse, table: str, days: list[str]) -> pd.DataFrame:
    frames = [warehouse.read(table, d) for d in days if warehouse.exists(table, d)]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def company_sides(warehouse, days: list[str]) -> pd.DataFrame:
    """Per (date, headline_id) of `days`: the headline's news (+1 / -1 / 0) and, per source (policy, base),
    the majority side (+1 long, -1 short, 0 none or tied) of its notes' calls on the headline's company,
    with the number of such calls and of notes."""
    from outcome_flywheel.daily_rl.notes.relevance import headline_symbols
    from outcome_flywheel.daily_rl.worlds.news import news_direction

    outcomes = _read_days(warehouse, "rollout_outcomes", days)
    heads = _read_days(warehouse, "headlines", days)[["date", "headline_id", "title", "summary"]]
    rows = []
    for h in heads.itertuples(index=False):
        companies = set(headline_symbols(h.title, h.summary))
        notes = outcomes[(outcomes["date"] == h.date) & (outcomes["headline_id"] == h.headline_id)]
        row = dict(
            date=h.date,
            headline_id=h.headline_id,
            news=news_direction(h.title, h.summary),
            names_company=bool(companies),
        )
        for source in ("policy", "base"):
            mine = notes[notes["source"] == source]
            on = mine[
                (mine["parse_status"] == "ok") & mine["symbol"].isin(companies) & mine["side"].isin(list(SIDE_SIGN))
            ]
            votes = sum(SIDE_SIGN[side] for side in on["side"])
            row.update(
                {
                    f"{source}_side": int(np.sign(votes)),
                    f"{source}_company_calls": len(on),
                    f"{source}_notes": len(mine),
                }
            )
        rows.append(row)
    return pd.DataFrame(rows)


def long_share_by_news(sides: pd.DataFrame, warehouse, days: list[str], source: str) -> dict:
    """Among `source`'s calls on the headline's company: the share that are long, on good and on bad news."""
    from outcome_flywheel.daily_rl.notes.relevance import headline_symbols

    outcomes = _read_days(warehouse, "rollout_outcomes", days)
    calls = outcomes[
        (outcomes["source"] == source) & (outcomes["parse_status"] == "ok") & outcomes["side"].isin(list(SIDE_SIGN))
    ]
    calls = calls.merge(
        _read_days(warehouse, "headlines", days)[["date", "headline_id", "title", "summary"]],
        on=["date", "headline_id"],
    )
    calls = calls.merge(sides[["date", "headline_id", "news"]], on=["date", "headline_id"])
    # A boolean Series, not a list: an empty list would select no columns (SmolLM2's held-out base made no company call).
    on = calls[
        pd.Series(
            [sym in headline_symbols(t, s) for sym, t, s in zip(calls["symbol"], calls["title"], calls["summary"])],
            index=calls.index,
            dtype=bool,
        )
    ]
    out = {}
    for name, sign in (("good_news", 1), ("bad_news", -1)):
        part = on[on["news"] == sign]
        out[name] = dict(long_share=_round((part["side"] == "long").mean()) if len(part) else None, calls=len(part))
    return out


NOTE_COLUMNS = [
    "date",
    "headline_id",
    "source",
    "rollout_index",
    "symbol",
    "side",
    "parse_status",
    "status",
    "vs_spy_pct",
    "entry_date",
    "structure_score",
    "news",
    "names_company",
    "company_call",
]


def notes_frame(warehouse, days: list[str]) -> pd.DataFrame:
    """One row per note of `days`, policy's and base's (NOTE_COLUMNS): its call and outcome (`rollout_outcomes`), its
    structure score (`rollouts` / `baseline_rollouts`), its headline's news (+1 / -1 / 0), whether the headline names
    a company the alias map knows, and whether the note's call is a long or short on one of those companies."""
    from outcome_flywheel.daily_rl.notes.relevance import headline_symbols
    from outcome_flywheel.daily_rl.worlds.news import news_direction

    outcomes = _read_days(warehouse, "rollout_outcomes", days)
    if outcomes.empty:
        return pd.DataFrame(columns=NOTE_COLUMNS)
    keys = ["date", "headline_id", "rollout_index"]
    structure = pd.concat(
        [
            _read_days(warehouse, table, days).reindex(columns=[*keys, "structure_score"]).assign(source=source)
            for table, source in (("rollouts", "policy"), ("baseline_rollouts", "base"))
        ],
        ignore_index=True,
    )
    heads = _read_days(warehouse, "headlines", days)[["date", "headline_id", "title", "summary"]]
    heads = heads.assign(
        companies=[set(headline_symbols(t, s)) for t, s in zip(heads["title"], heads["summary"])],
        news=[news_direction(t, s) for t, s in zip(heads["title"], heads["summary"])],
    )
    notes = outcomes.merge(structure, on=[*keys, "source"], how="left").merge(
        heads[["date", "headline_id", "companies", "news"]], on=["date", "headline_id"], how="left"
    )
    companies = notes["companies"].apply(lambda c: c if isinstance(c, set) else set())
    notes["names_company"] = [bool(c) for c in companies]
    notes["company_call"] = [
        status == "ok" and side in SIDE_SIGN and symbol in c
        for status, side, symbol, c in zip(notes["parse_status"], notes["side"], notes["symbol"], companies)
    ]
    notes["news"] = notes["news"].fillna(0).astype(int)
    return notes.reindex(columns=NOTE_COLUMNS).reset_index(drop=True)


def held_out_summary(warehouse, held: list[str]) -> dict:
    """The held-out days' A/B (evaluate_day over those days only), the back-test of their books, and sides."""
    from outcome_flywheel.daily_rl.evaluation.ab import PREFERENCE_COLUMNS, evaluate_day
    from outcome_flywheel.daily_rl.evaluation.backtest import run_backtest

    rollouts, baseline = _read_days(warehouse, "rollouts", held), _read_days(warehouse, "baseline_rollouts", held)
    preferences = _read_days(warehouse, "policy_preferences", held)
    preferences = preferences if len(preferences) else pd.DataFrame(columns=PREFERENCE_COLUMNS)
    outcomes = _read_days(warehouse, "rollout_outcomes", held)
    table = evaluate_day(rollouts, baseline, outcomes, preferences, day=held[-1])
    ab = {
        r.metric: dict(
            policy=_round(r.policy),
            base=_round(r.base),
            difference=_round(r.difference),
            ci=[_round(r.ci_low), _round(r.ci_high)],
            n=int(r.n),
            label=r.label,
        )
        for r in table.itertuples(index=False)
    }
    bt = run_backtest(outcomes).summary
    backtest = {k: (_round(v) if isinstance(v, float) else v) for k, v in bt.items()}
    sides = company_sides(warehouse, held)
    return dict(
        ab=ab,
        backtest=backtest,
        sides=sides,
        notes=notes_frame(warehouse, held),
        policy_long_share=long_share_by_news(sides, warehouse, held, "policy"),
        base_long_share=long_share_by_news(sides, warehouse, held, "base"),
    )


def model_data_dir(data_dir: Path, model: str) -> Path:
    """A data dir holding tiny-local and, for `smollm2-135m-instruct`, its folder (built once into .cache/)."""
    data = tiny_local_data_dir(str(data_dir))
    if model == "smollm2-135m-instruct":
        from outcome_flywheel.models.provision.smollm2 import cached_smollm2

        link = data / "models" / model
        if not link.exists():
            os.symlink(cached_smollm2(), link)
    return data


def model_settings(model: str):
    """The `DailyUpdateSettings` a day on `model` gets from an empty run config, resolved as the asset resolves
    them: the model's own defaults (`MODEL_RUN_DEFAULTS`) over the dataclasses'."""
    from assets.daily_rl.daily_update import DailyUpdateConfig

    return DailyUpdateConfig().settings(model)


def run_world(
    kind: str,
    root: Path,
    days: list[str],
    train_days: int,
    headlines: int,
    seed: int,
    move_pct: float,
    noise_pct: float,
    weights: dict,
    learning_rate: float | None,
    max_new_tokens: int,
    epochs: int | None = None,
    model: str = "tiny-local",
    extra_config: dict | None = None,
    train_seed: int = 0,
    archive: Path | None = None,
    device: str = "cpu",
) -> dict:
    import dagster as dg

    from outcome_flywheel.daily_rl.feeds.source import FeedSource
    from outcome_flywheel.daily_rl.worlds.prices import WorldConfig, make_world, write_world
    from outcome_flywheel.market_data import MarketData
    from outcome_flywheel.models.loader import ModelLoader
    from pipelines.daily_rl import DAILY_RL_ASSETS

    folder = root / (kind if train_seed == 0 else f"{kind}-train-seed-{train_seed}")
    data = model_data_dir(folder / "data", model)
    world_file = folder / "prices.csv"
    world = WorldConfig(kind, seed=seed, move_pct=move_pct, noise_pct=noise_pct)
    prices, manifest = (
        make_world(world, archive_dir=archive, max_headlines=headlines)
        if archive is not None
        else make_world(world, max_headlines=headlines)
    )
    manifest = write_world(world_file, prices, manifest)
    os.environ["FLYWHEEL_PRICES_FILE"] = str(world_file)  # anything that reads the variable sees the world too
    res = resources(data, headlines)
    res["market_data"] = MarketData(prices_file=str(world_file), data_dir=str(data))
    if archive is not None:  # a synthetic archive (`worlds/synthetic_feeds.py`): its days and headlines
        os.environ["FLYWHEEL_FEEDS_ARCHIVE"] = str(archive)
        res["feeds"] = FeedSource(archive_dir=str(archive), max_headlines=headlines, data_dir=str(data))
    # the training seed: sampling, minibatch order and the LoRA init (the model folder is built once, seed 0)
    res["model_backend"] = ModelLoader(
        data_dir=str(data), base_model=model, backend="torch", device=device, seed=train_seed
    )
    warehouse = res["warehouse"]
    default_weights = dict(model_settings(model).reward.weights)
    per_day, started = [], time.perf_counter()
    for i, day in enumerate(days):
        t0 = time.perf_counter()
        phase = "train" if i < train_days else "held_out"
        # Held out: learning rate 0 freezes the policy (no step, no gate: `update_policy`), and without the
        # price weight the delayed step is skipped rather than computed for nothing.
        day_weights = weights if phase == "train" else {k: v for k, v in weights.items() if k != "price"}
        settings = {"max_new_tokens": max_new_tokens}
        if phase != "train" or learning_rate is not None:  # None: the model's own learning rate, else GSPOConfig's
            settings["learning_rate"] = learning_rate if phase == "train" else 0.0
        settings.update({"epochs": epochs} if epochs else {})
        settings.update({"reward_weights": day_weights} if day_weights != default_weights else {})
        settings.update({k: v for k, v in (extra_config or {}).items() if phase == "train" or k != "learning_rate"})
        config = {"ops": {"daily_update": {"config": settings}}}
        result = dg.materialize(DAILY_RL_ASSETS, partition_key=day, resources=res, run_config=config)
        assert result.success, f"{kind} {day} failed"
        sides = company_sides(warehouse, [day])
        row = dict(
            world=kind,
            date=day,
            phase=phase,
            seconds=round(time.perf_counter() - t0, 1),
            policy_company_calls=int(sides["policy_company_calls"].sum()),
            notes=int(sides["policy_notes"].sum()),
            policy_side_with_news=_round(((sides["policy_side"] * sides["news"]) > 0).mean()),
            **training_row(warehouse, day),
        )
        per_day.append(row)
        print(json.dumps(row), flush=True)
    held = held_out_summary(warehouse, days[train_days:])
    return dict(
        world=kind,
        train_seed=train_seed,
        planted_moves=manifest["planted_moves"],
        world_file=str(world_file),
        held_out=held,
        per_day=per_day,
        wall_s=round(time.perf_counter() - started, 1),
    )


def training_row(warehouse, day: str) -> dict:
    """The day's `policy_training` figures that show drift: the KL of D's policy to the base and the gate's verdict."""
    if not warehouse.exists("policy_training", day):
        return {}
    row = warehouse.read("policy_training", day).iloc[0]
    return dict(
        kl_to_base=_round(row["kl_to_base"]), gate=str(row["gate"]), gate_kl_to_parent=_round(row["gate_kl_to_parent"])
    )


def opposite_share(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    """Share of held-out headlines (naming a company) on which the two worlds' policies take opposite sides."""
    both = a.merge(b, on=["date", "headline_id"], suffixes=("_a", "_b"))
    both = both[both["names_company_a"]]
    opposite = (both["policy_side_a"] * both["policy_side_b"]) < 0
    sided = (both["policy_side_a"] != 0) & (both["policy_side_b"] != 0)
    return dict(
        share=_round(opposite.mean()) if len(both) else None,
        headlines=len(both),
        share_where_both_take_a_side=_round(opposite[sided].mean()) if sided.any() else None,
        both_take_a_side=int(sided.sum()),
    )


def print_world(w: dict) -> None:
    h = w["held_out"]
    print(
        f"\n== world {w['world']} ({w['planted_moves']} planted moves; held-out days {w['per_day'][-1]['date'] if w['per_day'] else ''}) =="
    )
    for metric in ("hit_rate", "mean_vs_spy_pct", "headline_company_share", "structure_score", "judge_win_rate"):
        r = h["ab"].get(metric)
        if r:
            print(
                f"  {metric}: policy {r['policy']} vs base {r['base']}, difference {r['difference']} {r['ci']} (n={r['n']}): {r['label']}"
            )
    for source in ("policy", "base"):
        ls = h[f"{source}_long_share"]
        print(
            f"  {source}: long share of company calls on good news {ls['good_news']['long_share']} ({ls['good_news']['calls']} calls), "
            f"on bad news {ls['bad_news']['long_share']} ({ls['bad_news']['calls']} calls)"
        )
    bt = h["backtest"]
    print(
        f"  back-test over {bt.get('days')} held-out books: policy {bt.get('policy_total_return_pct')}% vs base "
        f"{bt.get('base_total_return_pct')}% vs SPY {bt.get('spy_total_return_pct')}%; mean excess over the base "
        f"{bt.get('mean_excess_vs_base_pct')} pp [{bt.get('excess_vs_base_ci_low')}, {bt.get('excess_vs_base_ci_high')}]: {bt.get('label_vs_base')}"
    )


def prepare_days(
    root: Path, days: int, headlines: int, seed: int, synthetic_days: int
) -> tuple[list[str], Path | None]:
    """(the days to run, the archive): the bundled archive's first `days` days, or with `synthetic_days` a SYNTHETIC
    archive written under `root` (seeded by the world's seed) and its first `days` days. Sets the environment the
    daily partitions are made from (before the definitions load)."""
    if not synthetic_days:
        return archive_days(days), None
    from outcome_flywheel.daily_rl.worlds.synthetic_feeds import archive_day_list, write_synthetic_archive

    archive = root / "synthetic_feeds"  # SYNTHETIC headlines from the archive's event templates
    write_synthetic_archive(archive, days=synthetic_days, per_day=max(headlines, 8), seed=seed)
    day_list = archive_day_list(archive)[:days] if days else archive_day_list(archive)
    os.environ["FLYWHEEL_FEEDS_ARCHIVE"] = str(archive)
    os.environ["FLYWHEEL_DAILY_RL_START_DATE"] = day_list[0]
    return day_list, archive


def run(
    worlds=WORLDS,
    days: int = 26,
    train_days: int = 11,
    headlines: int = 8,
    seed: int = 0,
    move_pct: float = 2.0,
    noise_pct: float = 1.0,
    weights: dict | None = None,
    learning_rate: float | None = None,
    max_new_tokens: int = 128,
    out_dir: str | None = None,
    epochs: int | None = None,
    model: str = "tiny-local",
    extra_config: dict | None = None,
    train_seeds: tuple[int, ...] = (0, 1, 2),
    synthetic_days: int = 0,
    device: str = "cpu",
) -> dict:
    if not 0 < train_days < days:
        raise ValueError(f"--train-days must be between 1 and --days - 1, got {train_days} of {days}")
    own = model_settings(model)  # where the weights or the learning rate are not given
    weights = dict(own.reward.weights if weights is None else weights)
    root = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="flywheel-worlds-"))
    day_list, archive = prepare_days(root, days, headlines, seed, synthetic_days)
    started = time.perf_counter()
    runs, opposites = [], []
    for train_seed in train_seeds:
        results = {}
        for kind in worlds:
            results[kind] = run_world(
                kind,
                root,
                day_list,
                train_days,
                headlines,
                seed,
                move_pct,
                noise_pct,
                weights,
                learning_rate,
                max_new_tokens,
                epochs,
                model,
                extra_config,
                train_seed,
                archive,
                device,
            )
            print_world(results[kind])  # as each world ends: a long run stopped early keeps what it has
        runs.append(results)
        if "news" in results and "inverted" in results:
            opposite = opposite_share(results["news"]["held_out"]["sides"], results["inverted"]["held_out"]["sides"])
            opposites.append(opposite)
            print(
                f"\ninverted vs news (training seed {train_seed}): opposite sides on {opposite['share']} of {opposite['headlines']} "
                f"held-out headlines ({opposite['share_where_both_take_a_side']} of the {opposite['both_take_a_side']} where both take a side)"
            )
    over_seeds = {kind: seed_spread([r[kind] for r in runs]) for kind in worlds}
    for kind, spread in over_seeds.items():
        print(
            f"{kind} over training seeds {list(train_seeds)}: "
            + "; ".join(
                f"{k} mean {v['mean']} [{v['min']}, {v['max']}]" if isinstance(v, dict) else f"{k} {v}"
                for k, v in spread.items()
            )
        )
    opposite = dict(share=_spread([o["share"] for o in opposites]), per_seed=opposites) if opposites else None
    if opposite:
        print(
            f"inverted vs news, opposite sides over training seeds: mean {opposite['share']['mean']} [{opposite['share']['min']}, {opposite['share']['max']}]"
        )
    results = runs[-1]
    summary = dict(
        benchmark="outcome_learning",
        model=model,
        worlds=list(worlds),
        days=len(day_list),
        first_day=day_list[0],
        last_day=day_list[-1],
        train_days=train_days,
        held_out_days=len(day_list) - train_days,
        headlines_per_day=headlines,
        seed=seed,
        move_pct=move_pct,
        noise_pct=noise_pct,
        reward_weights=weights,
        learning_rate=own.gspo.learning_rate if learning_rate is None else learning_rate,
        epochs=epochs,
        max_new_tokens=max_new_tokens,
        train_seeds=list(train_seeds),
        over_training_seeds=over_seeds,
        held_out_last_seed={
            k: {key: v["held_out"][key] for key in ("ab", "policy_long_share", "base_long_share")}
            for k, v in results.items()
        },
        inverted_vs_news_opposite=opposite,
        wall_s=round(time.perf_counter() - started, 1),
        out_dir=str(root),
    )
    return summary


def _spread(values) -> dict:
    values = [v for v in values if v is not None]
    return dict(
        mean=_round(np.mean(values)) if values else None,
        min=_round(min(values)) if values else None,
        max=_round(max(values)) if values else None,
        n=len(values),
    )


def seed_spread(results: list[dict]) -> dict:
    """Per figure, its mean and range over the training seeds' runs of one world."""

    def ab(r, metric, source):
        return r["held_out"]["ab"].get(metric, {}).get(source)

    def gap(r, source):
        ls = r["held_out"][f"{source}_long_share"]
        good, bad = ls["good_news"]["long_share"], ls["bad_news"]["long_share"]
        return None if good is None or bad is None else good - bad

    return {
        "hit_rate_policy": _spread([ab(r, "hit_rate", "policy") for r in results]),
        "hit_rate_base": _spread([ab(r, "hit_rate", "base") for r in results]),
        "company_share_policy": _spread([ab(r, "headline_company_share", "policy") for r in results]),
        "company_share_base": _spread([ab(r, "headline_company_share", "base") for r in results]),
        "structure_policy": _spread([ab(r, "structure_score", "policy") for r in results]),
        "long_gap_good_minus_bad_policy": _spread([gap(r, "policy") for r in results]),
        "long_gap_good_minus_bad_base": _spread([gap(r, "base") for r in results]),
        "hit_rate_labels": [r["held_out"]["ab"].get("hit_rate", {}).get("label") for r in results],
    }


def _round(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return round(value, 4) if value == value else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default=",".join(WORLDS), help="comma-separated, from news, inverted, null")
    parser.add_argument("--days", type=int, default=26, help="archive days from its first (26 = all)")
    parser.add_argument("--train-days", type=int, default=11, help="the first N days train; the rest are held out")
    parser.add_argument(
        "--headlines", type=int, default=8, help="headlines per day (FLYWHEEL_MAX_HEADLINES; the world plants these)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the world's seed (the walks)")
    parser.add_argument("--move-pct", type=float, default=2.0)
    parser.add_argument("--noise-pct", type=float, default=1.0)
    parser.add_argument(
        "--reward-weights",
        default=None,
        help="JSON object, signal -> weight (default: the model's own, else RewardConfig's)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="default: the model's own (MODEL_RUN_DEFAULTS), else GSPOConfig's",
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="passes over each training day's examples (default: GSPOConfig's)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: the box is shared)")
    parser.add_argument(
        "--model",
        default="tiny-local",
        help="FLYWHEEL_BASE_MODEL of the policy and (frozen) judge: tiny-local, smollm2-135m-instruct or a folder",
    )
    parser.add_argument(
        "--synthetic-days",
        type=int,
        default=0,
        help="run on a SYNTHETIC archive of this many days (worlds/synthetic_feeds.py) instead of the bundled one; --days then caps it",
    )
    parser.add_argument(
        "--train-seeds",
        default="0,1,2",
        help="FLYWHEEL_SEED of each training run (sampling, minibatch order, LoRA init)",
    )
    parser.add_argument(
        "--config", default=None, help="JSON object of other daily_update run-config fields, e.g. '{\"kl_beta\": 0}'"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="the torch device of the policy and judge: cpu (the figures' default), auto, cuda, cuda:N or mps; "
        "auto and cuda compute in bf16 (FLYWHEEL_DTYPE's auto)",
    )
    parser.add_argument(
        "--out-dir", default=None, help="where the worlds and their data dirs go (default: a temp folder)"
    )
    add_record_argument(parser)
    args = parser.parse_args()
    import torch

    from outcome_flywheel.cli_arguments import CliError, quiet_libraries, require_device

    try:
        require_device(args.device)
    except CliError as err:
        parser.error(str(err))

    torch.set_num_threads(args.threads)  # on a shared box, more threads than free cores slow every step down

    quiet_libraries()  # no progress bars or library warnings between the figures
    worlds = tuple(w.strip() for w in args.worlds.split(",") if w.strip())
    unknown = sorted(set(worlds) - set(WORLDS))
    if unknown:
        parser.error(f"unknown world(s) {unknown}: choose from {', '.join(WORLDS)}")
    summary = run(
        worlds,
        args.days,
        args.train_days,
        args.headlines,
        args.seed,
        args.move_pct,
        args.noise_pct,
        json.loads(args.reward_weights) if args.reward_weights else None,
        args.learning_rate,
        args.max_new_tokens,
        args.out_dir,
        args.epochs,
        args.model,
        json.loads(args.config) if args.config else None,
        tuple(int(x) for x in args.train_seeds.split(",") if x.strip()),
        args.synthetic_days,
        args.device,
    )
    finish("outcome_learning", summary, args.record)


if __name__ == "__main__":
    main()
