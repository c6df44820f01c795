"""The daily recipe's edges: everything one day reads (at its start) and writes (at its end).

The stages the recipe calls (`day.py`) take data and return data; this module alone holds the
warehouse and the dated checkpoints for them. `DayStore.open` checks the day can run (its dates, a
parent it may train from), `read` gathers every table the stages read into one `DayInputs`, and
`write` puts the day's tables in the warehouse and publishes its staged checkpoint, which the
recipe verifies and only then marks verified (`latest` moves).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pandas as pd

from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings
from outcome_flywheel.daily_rl.note_scorer.features import FEATURES_TABLE
from outcome_flywheel.daily_rl.note_scorer.model import ScorerStore
from outcome_flywheel.daily_rl.partitions import DailyUpdateError, previous_day
from outcome_flywheel.daily_rl.policy.checkpoints import (
    CheckpointStore,
    StagedCheckpoint,
    UnverifiedCheckpoint,
    load_policy,
)
from outcome_flywheel.daily_rl.policy.prompt_tables import VARIANT_COLUMNS
from outcome_flywheel.daily_rl.policy.rollouts import check_behaviour_policy
from outcome_flywheel.daily_rl.reward.matured import matured_days, note_days
from outcome_flywheel.settings import resolve_path
from outcome_flywheel.storage import Warehouse


@dataclass
class Day:
    """One partition as the recipe runs it: D, the day its scored notes were written (D-1), the day whose
    headlines are the outcome, the loop's seed, and the checkpoint D trains from (None: the base)."""

    day: str
    prediction_day: str
    outcome_day: str
    seed: int
    parent: tuple[Path, dict] | None
    lineage: list[str]  # the policy versions whose notes D may train from (a distilled parent's ancestors)

    @property
    def parent_dir(self) -> Path | None:
        return self.parent[0] if self.parent else None

    @property
    def parent_info(self) -> dict | None:
        return self.parent[1] if self.parent else None

    @property
    def parent_version(self) -> str | None:
        return self.parent[1]["policy_version"] if self.parent else None


@dataclass
class DayInputs:
    """Every table a day's stages read, read once at the start."""

    prev_rollouts: pd.DataFrame  # rollouts(D-1): the notes scored today
    headlines: pd.DataFrame  # headlines(D): the notes written today
    outcome_titles: list[str]  # what happened next, shown to the judge
    human: pd.DataFrame | None = None  # note_feedback(D-1): people's ratings
    scorer_state: object = None  # the online note scorer after D-1, when its signal is weighted
    scorer_features: pd.DataFrame | None = None
    evolver_variants: list[dict] = field(default_factory=list)  # the prompt evolver's state before D
    evolver_experiences: pd.DataFrame = field(default_factory=pd.DataFrame)
    earlier_ledgers: pd.DataFrame | None = None  # the delayed step's: ledgers of the price window
    note_rollouts: pd.DataFrame | None = None  # and the notes it may train on price
    versions: dict[str, str] = field(default_factory=dict)  # day -> its checkpoint's policy version
    universe: set[str] | None = None  # the symbols the market data knows (None: no market data)


@dataclass
class DayTables:
    """What a day writes, each table partitioned by D."""

    rollout_scores: pd.DataFrame
    reward_ledger: pd.DataFrame
    price_training: pd.DataFrame
    rollouts: pd.DataFrame
    policy_training: pd.DataFrame
    prompt_evolver: pd.DataFrame
    prompt_experiences: pd.DataFrame


def outcome_day_for(day: str, override: str | None) -> tuple[str, str]:
    """(prediction day D-1, outcome day) of partition D; the outcome day must come after D-1."""
    prediction_day = previous_day(day)
    outcome_day = override or day
    try:
        date.fromisoformat(outcome_day)
    except ValueError as err:
        raise DailyUpdateError(f"outcome_headlines_date must be YYYY-MM-DD, got {outcome_day!r}") from err
    if outcome_day <= prediction_day:
        raise DailyUpdateError(f"outcome headlines ({outcome_day}) must come after the predictions ({prediction_day})")
    return prediction_day, outcome_day


def variant_rows(variants: pd.DataFrame | None) -> list[dict]:
    """The prompt evolver's variants as it keeps them (its own columns, in the order they were written)."""
    if variants is None or variants.empty:
        return []
    ordered = variants.sort_values("created_at_trial", kind="stable").to_dict("records")
    return [{k: v for k, v in r.items() if k in VARIANT_COLUMNS} for r in ordered]


class DayStore:
    """The warehouse, the dated checkpoints and the market data, as one day reads and writes them."""

    def __init__(self, warehouse: Warehouse, market_data=None):
        self.warehouse, self.market_data = warehouse, market_data
        self.checkpoints = CheckpointStore(warehouse.path("checkpoints", "policy"))
        self._staged: list[StagedCheckpoint] = []  # staged and not yet published: removed if the day fails

    def open(self, day: str, settings: DailyUpdateSettings, seed: int) -> Day:
        """The day, or `DailyUpdateError` when it cannot run: its parent is checked first, so nothing is
        scored or written when it may not be trained from."""
        prediction_day, outcome_day = outcome_day_for(day, settings.outcome_headlines_date)
        try:
            parent = self.checkpoints.parent(day)
        except UnverifiedCheckpoint as err:
            raise DailyUpdateError(str(err)) from err
        return Day(day, prediction_day, outcome_day, seed, parent, self.checkpoints.lineage(parent))

    def read(self, d: Day, settings: DailyUpdateSettings, follow_ups: list[str] | None = None) -> DayInputs:
        """Every input of the day's stages. `follow_ups`: what happened next in a synthetic world (its own
        follow-ups of D-1's companies), shown to the judge instead of the outcome day's headlines."""
        evolver_day = max((p for p in self.warehouse.partitions("prompt_evolver") if p < d.day), default=None)
        wanted = {
            "prev_rollouts": ("rollouts", d.prediction_day),
            "headlines": ("headlines", d.day),
            "outcome_headlines": ("headlines", d.outcome_day),
            "human": ("note_feedback", d.prediction_day),
            "variants": ("prompt_evolver", evolver_day),  # the evolver's state of the newest day before D
            "experiences": ("prompt_experiences", evolver_day),
            "scorer_features": (FEATURES_TABLE, d.prediction_day if settings.reward.weighs("scorer") else None),
        }
        t = self._tables(wanted)
        prev = t["prev_rollouts"] if t["prev_rollouts"] is not None else pd.DataFrame()
        try:  # pi_old must be the checkpoint this day trains, or one it was distilled from (off-policy, with TIS)
            check_behaviour_policy(prev, d.parent_version, d.prediction_day, d.lineage)
        except ValueError as err:
            raise DailyUpdateError(str(err)) from err
        if len(prev) and follow_ups is None and t["outcome_headlines"] is None:
            raise DailyUpdateError(
                f"headlines of {d.outcome_day} are not materialised: materialise `headlines` for that day first"
            )
        outcome = t["outcome_headlines"] if t["outcome_headlines"] is not None else pd.DataFrame()
        inputs = DayInputs(
            prev_rollouts=prev,
            headlines=t["headlines"] if t["headlines"] is not None else pd.DataFrame(),
            outcome_titles=[]
            if not len(prev)
            else follow_ups
            if follow_ups is not None
            else list(outcome.get("title", pd.Series(dtype=str))),
            human=t["human"],
            scorer_features=t["scorer_features"],
            evolver_variants=variant_rows(t["variants"]),
            evolver_experiences=t["experiences"] if t["experiences"] is not None else pd.DataFrame(),
            universe=self.market_data.universe() if self.market_data is not None else None,
        )
        if t["scorer_features"] is not None:  # the scorer's state after D-1, beside its features
            scorers = ScorerStore(resolve_path(self.warehouse.data_dir))
            path = scorers.day_file(d.prediction_day)
            inputs.scorer_state = scorers.load(path) if path.exists() else None
        if self.market_data is not None and settings.reward.weighs("price"):
            self._matured_inputs(d.day, settings, inputs)
        return inputs

    def _matured_inputs(self, day: str, settings: DailyUpdateSettings, inputs: DayInputs) -> None:
        """The delayed step's inputs: the price window's ledgers (a day the gate rejected kept its parent's
        weights, so its price rows settle nothing: its groups are pending again), the notes that may
        train on price, and each day's checkpoint version."""
        config = settings.matured()
        days, _ = matured_days(day, config)
        ledgers = self._tables({d: ("reward_ledger", d) for d in days if not self.checkpoints.rejected(d)})
        ledgers = [f for f in ledgers.values() if f is not None]
        inputs.earlier_ledgers = pd.concat(ledgers, ignore_index=True) if ledgers else None
        notes = self._tables({d: ("rollouts", d) for d in note_days(inputs.earlier_ledgers, day, config)})
        notes = [f for f in notes.values() if f is not None and len(f)]
        inputs.note_rollouts = pd.concat(notes, ignore_index=True) if notes else None
        inputs.versions = {d: v for d in days if (v := self.checkpoints.version_of(d)) is not None}

    def _tables(self, wanted: dict) -> dict:
        """name -> (table, partition) read as name -> its rows; None where the partition is absent (or None)."""
        return {name: self.warehouse.find(t, p) if p is not None else None for name, (t, p) in wanted.items()}

    def stage(self, policy, d: Day, info: dict, update) -> StagedCheckpoint:
        """Checkpoint D staged beside the dated folders (its version is known, nothing published): the
        update's policy, or the parent's files when the gate rejected the update."""
        if update.gate.verdict == "rejected":
            staged = self.checkpoints.stage_parent(d.day, d.parent, info)
        else:
            is_base = update.stats is None and (d.parent_info is None or d.parent_info["kind"] == "base")
            staged = self.checkpoints.stage(policy, d.day, info, is_base)
        self._staged.append(staged)
        return staged

    def write(self, d: Day, tables: DayTables, staged: StagedCheckpoint) -> dict:
        """Checkpoint D published (not yet verified), then the day's tables; the checkpoint's info. The publish
        goes first because it is fenced (`fencing.publishing`): a training that lost the trainer lock
        meanwhile is refused there, before it writes any of the day's rows."""
        info = self.checkpoints.publish(staged)
        self._staged.remove(staged)
        for name, frame in vars(tables).items():
            self.warehouse.write(name, frame, partition=d.day)
        return info

    def load_checkpoint(self, models, day: str, dtype: str | None = None):
        """Checkpoint D as published on disk (what the next day trains from), in `dtype` (None: the loader's)."""
        return load_policy(models, self.checkpoints.root / day, self.checkpoints.info(day), dtype)

    def __enter__(self) -> "DayStore":
        return self

    def __exit__(self, *exc) -> None:
        """A day that failed after staging its checkpoint leaves no staging folder behind."""
        for staged in self._staged:
            shutil.rmtree(staged.folder, ignore_errors=True)
        self._staged.clear()
