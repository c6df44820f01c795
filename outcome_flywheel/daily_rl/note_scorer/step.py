"""The `note_scorer` step: one day of the online note scorer (docs/tiers.md, "Online note scorer"),
in its own process through Dagster Pipes like the other training steps.

Day D: the features of D's notes (`note_features(D)`), then D's events (events.py) applied
in their fixed order, one Adam step each, on the state as of D-1 (`days/<D-1>.safetensors`, never `latest`:
a re-run of D gives the same state, unless feedback was posted since). People's feedback that the
service stepped the live state on is taken by the next day's state (each feedback once), so a
materialised day never drops what people taught. The state after D is `days/D.safetensors`; `latest` moves to it unless
a later day exists already (a re-run of an old day leaves the newest state served).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import date, timedelta

import pandas as pd

from outcome_flywheel.daily_rl.note_scorer.events import day_events
from outcome_flywheel.daily_rl.note_scorer.features import (
    FEATURES_TABLE,
    HiddenStates,
    feature_lookup,
    note_features,
    with_sources,
)
from outcome_flywheel.daily_rl.note_scorer.model import (
    SOURCES,
    ScorerSettings,
    ScorerStore,
    accuracy_summary,
    by_day,
    label,
    learn,
    resume,
)
from outcome_flywheel.feedback.log import FeedbackLog
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.settings import resolve_path
from outcome_flywheel.steps import Step
from outcome_flywheel.steps.metadata import md, present
from outcome_flywheel.storage import Warehouse

# This step, as its asset names it (the step runner launches `python -m outcome_flywheel.daily_rl.note_scorer.step`).
STEP = Step("note_scorer", "outcome_flywheel.daily_rl.note_scorer.step")


@dataclass
class NoteScorerDay:
    """What one day did: the state's figures and the counts, as the asset's metadata shows them."""

    day: str
    updates: int
    parameters: int
    feature_dim: int
    events: dict[str, int]
    counts: dict[str, int]
    fresh_start: str | None
    accuracy: list[dict] = field(default_factory=list)  # per source, all days so far
    accuracy_today: list[dict] = field(default_factory=list)
    over_time: list[dict] = field(default_factory=list)
    features_written: int = 0
    seconds: float = 0.0


def previous_day(day: str) -> str:
    return (date.fromisoformat(day) - timedelta(days=1)).isoformat()


class FeatureSource:
    """Features of any note day: the stored `note_features` rows of the current spec, else computed
    from that day's rollouts (in memory) when an event reaches a day stored before the scorer."""

    def __init__(self, warehouse: Warehouse, hidden: HiddenStates, universe=None):
        self.warehouse, self.hidden, self.universe = warehouse, hidden, universe
        self._days: dict[str, dict] = {}
        self._groups: dict[str, dict[str, list[int]]] = {}

    def compute(self, day: str) -> pd.DataFrame:
        rollouts = self.warehouse.read("rollouts", day) if self.warehouse.exists("rollouts", day) else pd.DataFrame()
        if rollouts.empty:
            return pd.DataFrame()
        headlines = self.warehouse.read("headlines", day) if self.warehouse.exists("headlines", day) else pd.DataFrame()
        return note_features(with_sources(rollouts, headlines), self.hidden, self.universe)

    def day(self, day: str) -> dict:
        if day not in self._days:
            stored = (
                self.warehouse.read(FEATURES_TABLE, day)
                if self.warehouse.exists(FEATURES_TABLE, day)
                else pd.DataFrame()
            )
            lookup = feature_lookup(stored, self.hidden.spec.key)
            self._days[day] = lookup or feature_lookup(self.compute(day))
        return self._days[day]

    def for_keys(self, keys) -> dict:
        out = {}
        for d in sorted({k[0] for k in keys}):
            out.update(self.day(d))
        return out

    def group_indices(self, day: str, headline_id: str) -> list[int]:
        if day not in self._groups:
            rollouts = (
                self.warehouse.read("rollouts", day) if self.warehouse.exists("rollouts", day) else pd.DataFrame()
            )
            groups: dict[str, list[int]] = {}
            for h, i in zip(rollouts.get("headline_id", []), rollouts.get("rollout_index", [])):
                groups.setdefault(str(h), []).append(int(i))
            self._groups[day] = groups
        return self._groups[day].get(headline_id, [])


def run_note_scorer_day(
    warehouse: Warehouse,
    models: ModelLoader,
    feedback_log: FeedbackLog,
    day: str,
    settings: ScorerSettings,
    universe=None,
    log=print,
) -> NoteScorerDay:
    started = time.perf_counter()
    store = ScorerStore(resolve_path(warehouse.data_dir))
    hidden = HiddenStates(models.base_model_dir(), device="cpu")
    features = FeatureSource(warehouse, hidden, universe)
    today = features.compute(day)
    if len(today):
        warehouse.write(FEATURES_TABLE, today, partition=day)
        features._days[day] = feature_lookup(today)
    scores = warehouse.read("rollout_scores", day) if warehouse.exists("rollout_scores", day) else pd.DataFrame()
    outcomes = warehouse.read_all("rollout_outcomes")
    feedback = feedback_log.read().feedback
    with store.lock():
        state, reason = resume(store.state_before(day, previous_day(day)), hidden.spec.size, hidden.spec.key, settings)
        if reason:
            log(f"note_scorer {day}: starting afresh ({reason})")
        events = day_events(scores, outcomes, feedback, day, features.group_indices, state.applied_people)
        vectors = features.for_keys([k for e in events for k in e.keys])
        newest = not store.days() or day >= store.days()[-1]
        counts = learn(state, events, vectors, store, move_latest=newest)
        state.meta["last_day"] = day
        store.save_day(day, state, move_latest=newest)
    history = state.meta["history"]
    return NoteScorerDay(
        day=day,
        updates=state.updates,
        parameters=state.parameters(),
        feature_dim=state.feature_dim,
        events={s: sum(e.source == s for e in events) for s in SOURCES},
        counts=counts,
        fresh_start=reason,
        accuracy=[accuracy_summary(history, s) for s in SOURCES],
        accuracy_today=[accuracy_summary(history, s, {day}) for s in SOURCES],
        over_time=by_day(history),
        features_written=len(today),
        seconds=round(time.perf_counter() - started, 2),
    )


def _accuracy_table(rows: list[dict]) -> str:
    lines = [
        "| source | events | pairs | held-out accuracy | 95% interval | constant | p (vs 0.5) | verdict |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for r in rows:
        interval = f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if r["ci_low"] is not None else "—"
        acc = f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "—"
        p = f"{r['p_value']:.3g}" if r["p_value"] is not None else "—"
        lines.append(f"| {r['source']} | {r['events']} | {r['pairs']} | {acc} | {interval} | 0.5 | {p} | {label(r)} |")
    return "\n".join(lines)


def day_metadata(result: NoteScorerDay) -> dict:
    """The asset's metadata: counts, the fresh start (if any), accuracy per source with intervals, over time."""
    meta = {
        "updates": result.updates,
        "parameters": result.parameters,
        "feature_dim": result.feature_dim,
        "features_written": result.features_written,
        "seconds": result.seconds,
        "fresh_start": result.fresh_start or "no (carried on from the day before)",
        **{f"events_{s}": n for s, n in result.events.items()},
        **{f"skipped_{k}": v for k, v in result.counts.items() if k in ("no_pairs", "no_features")},
        "clipped_labels": result.counts.get("clipped_labels", 0),
        "held_out_accuracy": md(_accuracy_table(result.accuracy)),
        "held_out_accuracy_today": md(_accuracy_table(result.accuracy_today)),
        "accuracy_over_time": md(
            "| day | source | events | accuracy |\n| --- | --- | ---: | ---: |\n"
            + "\n".join(
                f"| {r['day']} | {r['source']} | {r['events']} | {r['accuracy']:.3f} |" for r in result.over_time[-60:]
            )
        ),
    }
    for r in result.accuracy:
        if r["accuracy"] is not None:
            meta[f"accuracy_vs_{r['source']}"] = r["accuracy"]
    return meta


def run(pipes) -> None:
    from outcome_flywheel.steps.codec import from_payload

    extras = pipes.extras
    warehouse = from_payload(Warehouse, extras["warehouse"])
    models = from_payload(ModelLoader, extras["models"])
    feedback_log = from_payload(FeedbackLog, extras["feedback_log"])
    settings = from_payload(ScorerSettings, extras["settings"])
    day = pipes.partition_key
    result = run_note_scorer_day(warehouse, models, feedback_log, day, settings, extras.get("universe"), pipes.log.info)
    pipes.log.info(
        f"note_scorer {day}: {sum(result.events.values())} events, {result.updates} updates in all, {result.seconds} s"
    )
    pipes.report_asset_materialization(asset_key="note_scorer", metadata=present(day_metadata(result)))


if __name__ == "__main__":
    from outcome_flywheel.steps.entry import main

    main(STEP, run)
