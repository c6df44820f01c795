"""Which part of a day's update moves every held-out side margin at once (the lean)? Replays one day of a
finished world-run (`learning_grid` / `outcome_learning`): the day's examples are rebuilt from the run's
warehouse exactly as its update built them (D-1's scored notes and the matured ones, `policy/update.py`), then
the parent checkpoint is trained on them once per arm, each arm with only some parts of the loss on, and every
arm's policy is read by `side_margin` on the held-out headlines.

Arms: `all` (the day's update as it ran), `note` (the whole-note part), `relevance` and `price` (the span
parts), `counterfactual` (the counterfactual term), `anchor` (no advantage at all: only the KL to the base acts).
An arm keeps the examples that carry its part (the rest would add only the anchor) and the trainer's
normalisers as they were (each part's scale comes from its own tokens, `part_scales`), so an arm's update is
that part's pull with Adam's resumed moments; the arms' effects need not add up to `all`'s (Adam divides each
step by its own gradient's running size).

Per arm, against the parent: the change of the mean margin over the held-out headlines (the lean: every margin
moved at once) and of the gap (good - bad news, what the world's rule should move), each with a 95% bootstrap
interval over headlines, paired.

    python -m benchmarks.lean_source --run RUN_FOLDER --day YYYY-MM-DD [--grid GRID_JSON]
        [--arms all,note,relevance,price,counterfactual,anchor] [--model smollm2-135m-instruct] [--headlines 3]

RUN_FOLDER: a world's folder (holding `prices.csv` and `data/`); `--grid` (default: the grid.json two levels
above it) gives the run's config, learning rate, epochs and notes' length. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from benchmarks._results import add_record_argument, finish
from benchmarks.heldout_sides import add_held_out_arguments, held_out_set
from benchmarks.side_margin import gap_change, margins_of

ARMS = ("all", "note", "relevance", "price", "counterfactual", "anchor")


def only_part(example, arm: str):
    """The example with only `arm`'s part of the loss on (None: it carries nothing of that part)."""
    if arm == "all":
        return example
    spans = example.token_advantages is not None and any(example.token_advantages)
    keep = dict(
        note=example.advantage if arm == "note" else 0.0,
        span=spans and arm == example.token_part,
        counterfactual=example.counterfactual if arm == "counterfactual" else None,
    )
    carries = arm == "anchor" or bool(keep["note"]) or keep["span"] or keep["counterfactual"] is not None
    if not carries:
        return None
    return replace(
        example,
        advantage=keep["note"],
        token_advantages=example.token_advantages if keep["span"] else None,
        counterfactual=keep["counterfactual"],
    )


def side_mean(margins: np.ndarray, where: np.ndarray) -> float | None:
    """The mean margin over the headlines `where` picks (good or bad news); None where it picks none."""
    return round(float(margins[where].mean()), 4) if where.any() else None


def mean_change(first: np.ndarray, other: np.ndarray, n_boot: int, seed: int = 0) -> dict:
    """The mean of other - first over headlines, with its 95% bootstrap interval."""
    diff = other - first
    draws = np.random.default_rng(seed).choice(len(diff), size=(n_boot, len(diff)))
    low, high = np.percentile(diff[draws].mean(1), [2.5, 97.5])
    return {"estimate": round(float(diff.mean()), 4), "low": round(float(low), 4), "high": round(float(high), 4)}


def day_examples(run: Path, day: str, grid: dict, model: str):
    """(the models' loader, the day's parent (folder, info), the `GSPOConfig` the day trained under, its examples,
    the trainer's seed): the day's stages up to the update (`daily_rl/day.py`, `update.training_plan`), read-only."""
    from assets.daily_rl.daily_update import DailyUpdateConfig, world_follow_ups
    from outcome_flywheel.daily_rl.day import matured_notes, score_notes
    from outcome_flywheel.daily_rl.day_store import DayStore
    from outcome_flywheel.daily_rl.judge.llm_judge import Judge
    from outcome_flywheel.daily_rl.partitions import stable_seed
    from outcome_flywheel.daily_rl.policy.checkpoints import load_policy
    from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_SAMPLING, sampling_temperature
    from outcome_flywheel.daily_rl.policy.update import training_plan
    from outcome_flywheel.market_data import MarketData
    from outcome_flywheel.models.loader import ModelLoader
    from outcome_flywheel.settings import env
    from outcome_flywheel.storage import Warehouse

    prices, data = run / "prices.csv", run / "data"
    os.environ["FLYWHEEL_PRICES_FILE"] = str(prices)
    config = {"max_new_tokens": grid["max_new_tokens"]}
    config.update({"learning_rate": grid["learning_rate"]} if grid.get("learning_rate") is not None else {})
    config.update({"epochs": grid["epochs"]} if grid.get("epochs") else {})
    config.update({"reward_weights": grid["reward_weights"]} if grid.get("reward_weights") else {})
    config.update(grid.get("config") or {})
    # as the run's days made theirs: the given fields over the model's own defaults
    settings = DailyUpdateConfig(**config).settings(model)
    train_seed = int(run.name.rsplit("-", 1)[-1]) if "-train-seed-" in run.name else 0
    models = ModelLoader(data_dir=str(data), base_model=model, backend="torch", device="cpu", seed=train_seed)
    warehouse, market = Warehouse(data_dir=str(data)), MarketData(prices_file=str(prices), data_dir=str(data))
    judge = Judge(judge_model=env("FLYWHEEL_JUDGE_MODEL", ""))
    with DayStore(warehouse, market) as store:
        d = store.open(day, settings, models.seed)
        inputs = store.read(d, settings, world_follow_ups(warehouse, market, day))
        settings, _, _ = settings.sized(models)
        scores = score_notes(d, inputs, models, judge, settings)
        prev = inputs.prev_rollouts
        temperature = sampling_temperature(prev) if len(prev) else ROLLOUT_SAMPLING.temperature
        policy = load_policy(models, d.parent_dir, d.parent_info)
        tokenizer = policy.tokenizer if settings.gspo.objective == "token" else None
        matured = matured_notes(d, inputs, store.market_data, settings, temperature, tokenizer)
        examples, _, gspo = training_plan(policy, d.parent, inputs, scores, matured, settings, temperature, d.seed, day)
    del policy
    return models, (d.parent_dir, d.parent_info), gspo, examples, stable_seed(d.seed, day, "train")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a world's folder: prices.csv and data/")
    parser.add_argument("--day", required=True, help="the trained day to replay (its parent is the day before)")
    parser.add_argument("--grid", default=None, help="the run's grid.json (default: two levels above --run)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated of {', '.join(ARMS)}")
    parser.add_argument("--note-format", default="call_first", help="the prompt the margins are read under")
    parser.add_argument(
        "--gspo",
        default="{}",
        help='JSON: GSPOConfig fields every arm trains under instead, e.g. {"side_lean_anchor": 1}',
    )
    parser.add_argument("--n-boot", type=int, default=2000)
    add_held_out_arguments(parser, days=26, headlines=3)
    add_record_argument(parser)
    args = parser.parse_args()
    run = Path(args.run)
    grid_file = Path(args.grid) if args.grid else run.parent.parent.parent / "grid.json"
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not (run / "prices.csv").is_file() or not (run / "data").is_dir():
        parser.error(f"--run {run}: not a world's folder (prices.csv and data/)")
    if not grid_file.is_file():
        parser.error(f"--grid {grid_file}: no such file")
    if unknown := sorted(set(arms) - set(ARMS)):
        parser.error(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
    from outcome_flywheel.daily_rl.policy.checkpoints import load_policy
    from outcome_flywheel.daily_rl.worlds.news import news_direction
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    try:
        overrides = json.loads(args.gspo)
    except ValueError as err:
        parser.error(f"--gspo: not JSON: {err}")
    names = {f.name for f in fields(GSPOConfig)}
    if not isinstance(overrides, dict) or set(overrides) - names:  # the values are checked with the day's config
        parser.error(f"--gspo: a JSON object of GSPOConfig fields, got {args.gspo!r}")

    started = time.perf_counter()
    _, held_days, heads = held_out_set(parser, args)
    news = np.array([news_direction(t, s) for t, s in zip(heads["title"], heads["summary"])])
    grid = json.loads(grid_file.read_text())
    models, (parent_dir, parent_info), gspo, examples, train_seed = day_examples(run, args.day, grid, args.model)
    try:
        gspo = replace(gspo, **overrides)
    except ValueError as err:
        parser.error(f"--gspo: {err}")

    def read(policy) -> np.ndarray:
        policy.model.eval()
        return margins_of(policy.model, policy.tokenizer, heads, args.note_format)

    parent = load_policy(models, parent_dir, parent_info)
    first = read(parent)
    del parent
    rows = {}
    published = run / "data" / "checkpoints" / "policy" / args.day
    if (published / "adapter_config.json").is_file():  # what the run's own update made: `all` should match it
        recorded = read(models.load(adapter_path=published))
        rows["recorded"] = dict(
            lean=mean_change(first, recorded, args.n_boot), gap_change=gap_change(first, recorded, news, args.n_boot)
        )
        print(json.dumps({"arm": "recorded", **rows["recorded"]}), flush=True)
    for arm in arms:
        kept = [e for e in (only_part(x, arm) for x in examples) if e is not None]
        t0 = time.perf_counter()
        policy = load_policy(models, parent_dir, parent_info)
        policy.framework.seed(train_seed % (2**31))
        stats = train_gspo(policy, kept, gspo)
        margins = read(policy)
        del policy
        rows[arm] = dict(
            examples=len(kept),
            lean=mean_change(first, margins, args.n_boot),
            gap_change=gap_change(first, margins, news, args.n_boot),
            good=side_mean(margins, news > 0),
            bad=side_mean(margins, news < 0),
            seconds=round(time.perf_counter() - t0, 1),
        )
        if "side_lean" in stats.extra:  # the anchor's view: each step's mean move of its side pairs since pi_old
            rows[arm]["side_lean_by_step"] = [round(v, 4) for v in stats.extra["side_lean"]]
        if "side_lean_margin" in stats.extra:  # the target's view: each step's mean side margin toward long, and p
            rows[arm]["side_lean_margin_by_step"] = [round(v, 4) for v in stats.extra["side_lean_margin"]]
            rows[arm]["side_lean_share"] = stats.extra["side_lean_share"][0]
        print(json.dumps({"arm": arm, **rows[arm]}), flush=True)
    result = dict(
        run=str(run),
        day=args.day,
        model=args.model,
        held_out_days=held_days,
        headlines=len(heads),
        gspo=overrides,
        parent={"good": side_mean(first, news > 0), "bad": side_mean(first, news < 0)},
        arms=rows,
        seconds=round(time.perf_counter() - started, 1),
    )
    finish("lean_source", result, args.record)


if __name__ == "__main__":
    main()
