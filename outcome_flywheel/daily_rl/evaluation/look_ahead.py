"""Look-ahead: notes written by a policy whose training saw headlines dated after the notes' day.

`daily_update` for day D scores D-1's rollouts against D's headlines and trains checkpoint D from
them. An override re-run (run config `outcome_headlines_date` = H, recorded in
`policy_training.outcome_headlines_date`) trains checkpoint D on H's headlines: with H after D the
checkpoint has read news from after D, and so has every checkpoint trained from it. A note of D
written by such a policy may "know" the market move after D that its call is judged on.

The rule, over the `policy_training` rows (one per day; its `policy_version`, `parent_version`,
`trained`, `outcome_headlines_date`):

- A version's *headlines seen* = the latest `outcome_headlines_date` of every update in its lineage
  that changed weights (trained, and a new version: a gate-rejected day republishes its parent's
  version, an untrained day its parent's weights). The base has seen none.
- The notes of day N written by version V are look-ahead when V has seen headlines dated after N
  (`V.seen > N`). Normal days never are (checkpoint N has seen N's headlines, and the notes of N are
  written after N's news); a descendant written on or after the latest override date is clean again.
- A version whose lineage cannot be traced in `policy_training` (a row it descends from was replaced
  by a re-run, or never written) is flagged too: what it saw cannot be shown to be <= N.
- The base model's notes (`source` "base") are never look-ahead.

By default the evaluation leaves look-ahead notes out: `rollout_outcomes` flags its rows, and
`policy_eval` and `backtest` drop every note day holding one (both sides, so the A/B stays paired);
their run config `include_look_ahead` keeps them, still flagged.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

LOOK_AHEAD_COLUMNS: dict[str, str] = {
    "look_ahead": "bool",
    "headlines_seen_through": "string",
    "look_ahead_reason": "string",
}
TRAINING_COLUMNS = ("date", "policy_version", "parent_version", "trained", "outcome_headlines_date")


@dataclass(frozen=True)
class Seen:
    """What one policy version's weights were trained on: the latest headline date (None: none), or
    `untraced` with the reason when its lineage is not in `policy_training`."""

    through: str | None
    untraced: str | None = None


def _text(value) -> str | None:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    return str(value).strip() or None


def headlines_seen(training: pd.DataFrame) -> dict[str, Seen]:
    """policy_version -> Seen, for every version `policy_training` records (and, through them, their lineage)."""
    if training.empty:
        return {}
    missing = [c for c in TRAINING_COLUMNS if c not in training.columns]
    if missing:
        raise ValueError(f"policy_training lacks columns {missing} (needs {', '.join(TRAINING_COLUMNS)})")
    made: dict[str, dict] = {}  # version -> the row of the day that made it (a republished parent is not made again)
    for row in training.sort_values("date").to_dict("records"):
        version, parent = _text(row["policy_version"]), _text(row["parent_version"])
        if version and version != parent:
            made[version] = row
    seen: dict[str, Seen] = {}

    def resolve(version: str, chain: tuple[str, ...] = ()) -> Seen:
        if version in seen:
            return seen[version]
        row = made.get(version)
        if row is None or version in chain:
            return Seen(None, f"no policy_training row made {version} (its day was re-run or never recorded)")
        parent = _text(row["parent_version"])
        before = resolve(parent, chain + (version,)) if parent else Seen(None)
        if before.untraced:
            result = before
        else:
            own = _text(row["outcome_headlines_date"]) if bool(row["trained"]) else None
            result = Seen(max([d for d in (before.through, own) if d], default=None))
        seen[version] = result
        return result

    for version in made:
        resolve(version)
    return seen


def look_ahead_flags(notes: pd.DataFrame, training: pd.DataFrame) -> pd.DataFrame:
    """LOOK_AHEAD_COLUMNS for each row of `notes` (`date`, `policy_version`, optional `source`), same index.

    Rows of source "base" are never look-ahead; a policy row is when its version has seen headlines
    dated after the row's date, or when its lineage is untraced (see the module's rule)."""
    seen = headlines_seen(training)
    sources = notes["source"] if "source" in notes.columns else pd.Series("policy", index=notes.index)

    def flag(day, version, source) -> tuple[bool, str | None, str | None]:
        if source == "base":
            return False, None, None
        s = seen.get(_text(version) or "", Seen(None, f"no policy_training row made {version}"))
        day = pd.Timestamp(day).date().isoformat()
        if s.untraced:
            return True, None, f"lineage untraced: {s.untraced}"
        if s.through and s.through > day:
            return True, s.through, f"{version} was trained on headlines of {s.through}, after the notes' day {day}"
        return False, s.through, None

    rows = [flag(*r) for r in zip(notes["date"], notes["policy_version"], sources)]
    out = pd.DataFrame(rows, columns=list(LOOK_AHEAD_COLUMNS), index=notes.index)
    return out.astype(LOOK_AHEAD_COLUMNS)


def look_ahead_days(notes: pd.DataFrame, training: pd.DataFrame) -> dict[str, str]:
    """{note day: reason} of the days holding a look-ahead policy note."""
    if notes.empty:
        return {}
    flags = look_ahead_flags(notes, training)
    hit = flags[flags["look_ahead"]]
    days = pd.to_datetime(notes.loc[hit.index, "date"]).dt.strftime("%Y-%m-%d")
    return {d: r for d, r in zip(days, hit["look_ahead_reason"])} if len(hit) else {}


def without_days(frame: pd.DataFrame, days: set[str] | dict[str, str]) -> pd.DataFrame:
    """`frame` without the rows dated on `days` (both sources: a paired comparison stays paired)."""
    if frame.empty or not days:
        return frame
    dates = pd.to_datetime(frame["date"]).dt.strftime("%Y-%m-%d")
    return frame[~dates.isin(set(days))]


OUTCOME_METRICS = ("hit_rate", "mean_vs_spy_pct")  # policy_eval rows made from the outcomes of every day up to D


@dataclass(frozen=True)
class LookAheadInputs:
    """The look-ahead notes among one policy_eval's inputs: `own` = D's own notes ({D: reason} or {}),
    `outcomes` = the note days among the outcomes used; `include` keeps them (still flagged)."""

    own: dict[str, str]
    outcomes: dict[str, str]
    include: bool = False

    @classmethod
    def of(
        cls, rollouts: pd.DataFrame, outcomes: pd.DataFrame, training: pd.DataFrame, include: bool = False
    ) -> "LookAheadInputs":
        return cls(look_ahead_days(rollouts, training), look_ahead_days(outcomes, training), include)

    @property
    def own_left_out(self) -> bool:
        """D's structure and judge comparisons are left out (D's policy is look-ahead, not included)."""
        return bool(self.own) and not self.include

    def kept_outcomes(self, outcomes: pd.DataFrame) -> pd.DataFrame:
        return outcomes if self.include else without_days(outcomes, self.outcomes)

    def flag_rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """`table` (rows with a `metric`) with `look_ahead` (its inputs held look-ahead notes) and
        `look_ahead_days` ("left out: D (reason)" or "included: ..."; empty when none)."""
        flags, notes = [], []
        for metric in table["metric"]:
            days = self.outcomes if metric in OUTCOME_METRICS else self.own
            flags.append(bool(days))
            listed = "; ".join(f"{d} ({r})" for d, r in sorted(days.items()))
            notes.append(f"{'included' if self.include else 'left out'}: {listed}" if days else "")
        return table.assign(
            look_ahead=pd.Series(flags, index=table.index, dtype="bool"),
            look_ahead_days=pd.Series(notes, index=table.index, dtype="string"),
        )
