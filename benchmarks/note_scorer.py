"""Does the online note scorer learn what the judge, the prices and people reward? Replays the daily
loop's days of a data dir (or runs them first: the bundled archive on tiny-local, through the real
assets) through `run_note_scorer_day` day by day, then reports the held-out (test-then-train)
pairwise accuracy per source with 95% bootstrap intervals against a constant scorer's 0.5, per day
(over time) and overall, and against the structure score alone (the strongest single feature: does
the model add anything to it?). Feedback: the data dir's feedback log, if any (the embedded defaults
have none, so the people row is empty unless `--simulate-people` rates notes by their structure).

    python -m benchmarks.note_scorer [--data-dir DIR] [--days 8] [--headlines 10] [--simulate-people]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from datetime import date, timedelta
from pathlib import Path

import numpy as np

from benchmarks._daily_common import archive_days, resources, tiny_local_data_dir
from benchmarks._results import add_record_argument, finish


def run_days(root: Path, days: int, headlines: int, max_new_tokens: int | None = None) -> None:
    import dagster as dg

    from pipelines.daily_rl import DAILY_RL_ASSETS

    res = resources(root, headlines)
    config = {"ops": {"daily_update": {"config": {"max_new_tokens": max_new_tokens}}}} if max_new_tokens else None
    for day in archive_days(days):
        if not res["warehouse"].exists("rollouts", day):
            assert dg.materialize(DAILY_RL_ASSETS, partition_key=day, resources=res, run_config=config).success


def structure_baseline(warehouse, history: list[dict]) -> dict:
    """Pairwise accuracy of ranking by the structure score alone on the same events (ties 0.5)."""
    from outcome_flywheel.daily_rl.note_scorer.events import judge_events, price_events

    structure: dict = {}
    for day in sorted(warehouse.partitions("rollouts")):
        r = warehouse.read("rollouts", day)
        structure.update(
            {(day, h, int(i)): float(s) for h, i, s in zip(r["headline_id"], r["rollout_index"], r["structure_score"])}
        )
    out = {}
    outcomes = warehouse.read_all("rollout_outcomes")
    for source in ("judge", "price"):
        values = []
        for day in sorted({h["day"] for h in history if h["source"] == source}):
            events = (
                judge_events(warehouse.read("rollout_scores", day), day)
                if source == "judge"
                else price_events(outcomes, day)
            )
            for e in events:
                pairs = e.pairs()
                if pairs:
                    s = [structure.get(k, np.nan) for k in e.keys]
                    values.append(np.mean([1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0 for i, j, _ in pairs]))
        out[source] = round(float(np.mean(values)), 4) if values else None
    return out


def simulate_people(root: Path, warehouse, seed: int = 0) -> int:
    """Rate two notes per headline the way a reader who wants complete notes would: the more
    complete one up, the other down (created on the day after the notes). Labelled as simulated."""
    from outcome_flywheel.feedback.log import FeedbackLog
    from outcome_flywheel.feedback.records import FeedbackRecord

    log = FeedbackLog(data_dir=str(root))
    if log.file.exists():
        return 0
    rng, n = np.random.default_rng(seed), 0
    for day in sorted(warehouse.partitions("rollouts")):
        r = warehouse.read("rollouts", day)
        written = f"{(date.fromisoformat(day) + timedelta(days=1)).isoformat()}T15:00:00+00:00"
        for headline_id, group in r.groupby("headline_id"):
            a, b = rng.choice(len(group), size=2, replace=False)
            ra, rb = group.iloc[a], group.iloc[b]
            if ra["structure_score"] == rb["structure_score"]:
                continue
            better, worse = (ra, rb) if ra["structure_score"] > rb["structure_score"] else (rb, ra)
            for row, thumbs in ((better, "up"), (worse, "down")):
                log.append(
                    FeedbackRecord(
                        date=day,
                        headline_id=headline_id,
                        rollout_index=int(row["rollout_index"]),
                        thumbs=thumbs,
                        reviewer="simulated",
                        created_at=written,
                    )
                )
                n += 1
    return n


def run(data_dir: str | None, days: int, headlines: int, people: bool, max_new_tokens: int | None = None) -> dict:
    from outcome_flywheel.daily_rl.note_scorer.model import (
        SOURCES,
        ScorerSettings,
        ScorerStore,
        accuracy_summary,
        by_day,
        label,
    )
    from outcome_flywheel.daily_rl.note_scorer.step import run_note_scorer_day
    from outcome_flywheel.feedback.log import FeedbackLog
    from outcome_flywheel.models.loader import ModelLoader
    from outcome_flywheel.storage import Warehouse

    root = tiny_local_data_dir(data_dir)
    warehouse = Warehouse(data_dir=str(root))
    if not warehouse.partitions("rollouts"):
        run_days(root, days, headlines, max_new_tokens)
    shutil.rmtree(ScorerStore(root).root, ignore_errors=True)  # the scorer from scratch over every day
    simulated = simulate_people(root, warehouse) if people else 0
    models = ModelLoader(data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu")
    all_days = sorted(warehouse.partitions("rollouts"))
    last = max(all_days)
    extra = [d for d in sorted(warehouse.partitions("rollout_outcomes")) if d > last]
    started = time.perf_counter()
    for day in all_days + extra:
        result = run_note_scorer_day(warehouse, models, FeedbackLog(data_dir=str(root)), day, ScorerSettings())
        print(json.dumps({"day": day, **result.events, "updates": result.updates, "seconds": result.seconds}))
    state = ScorerStore(root).load_latest()
    history = state.meta["history"]
    overall = {s: accuracy_summary(history, s) for s in SOURCES}
    for s in overall.values():
        s["label"] = label(s)
    print("\nheld-out pairwise accuracy (each event scored before its step), constant scorer = 0.5")
    for s in overall.values():
        ci = f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}]" if s["ci_low"] is not None else "-"
        acc = f"{s['accuracy']:.3f}" if s["accuracy"] is not None else "-"
        print(
            f"  {s['source']:6s} events {s['events']:4d} pairs {s['pairs']:5d} accuracy {acc} {ci} p={s['p_value']} {s['label']}"
        )
    over_time = by_day(history)
    for row in over_time:
        print(f"  {row['day']} {row['source']:6s} {row['events']:3d} events  accuracy {row['accuracy']:.3f}")
    baseline = structure_baseline(warehouse, history)
    print(f"  structure score alone on the same events: {baseline}")
    return dict(
        benchmark="note_scorer",
        machine=f"{platform.machine()}, {os.cpu_count()} CPU cores",
        days=len(all_days),
        updates=state.updates,
        parameters=state.parameters(),
        feature_dim=state.feature_dim,
        simulated_people_ratings=simulated,
        held_out=overall,
        structure_alone=baseline,
        over_time=over_time,
        seconds=round(time.perf_counter() - started, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir", default=None, help="a data dir with the daily loop's days (else a fresh one, runs them)"
    )
    parser.add_argument("--days", type=int, default=8)
    parser.add_argument("--headlines", type=int, default=10)
    parser.add_argument(
        "--simulate-people",
        action="store_true",
        help="rate notes by structure (labelled simulated) when the log is empty",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=None, help="the notes' token budget when it runs the days (the loop's)"
    )
    add_record_argument(parser)
    args = parser.parse_args()
    result = run(args.data_dir, args.days, args.headlines, args.simulate_people, args.max_new_tokens)
    finish("note_scorer", result, args.record)


if __name__ == "__main__":
    main()
