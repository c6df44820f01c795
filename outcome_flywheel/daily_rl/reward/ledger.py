"""The reward ledger: per note, which signals it was trained on, when, and against which policy.

`reward_ledger` is written per training day D (its partition), one row per note per step: `judged`
(the immediate signals, the day after the note) and `matured` (the `price` signal, when the call's
outcome is known). A note trains on each signal once: D looks only at the ledgers of the days before
D, so a re-run of D rebuilds the same rows. `dropped` rows settle a note too (stale, no_data), with
the reason. Columns: docs/daily_rl.md, "Delayed rewards".
"""

from __future__ import annotations

import pandas as pd

LEDGER_COLUMNS = [
    "date", "note_date", "headline_id", "rollout_index", "step", "signals", "status", "reason", "policy_version",
    "behavior_policy_version", "staleness_updates", "staleness_days", "signal_value", "advantage", "is_ratio",
]
STEPS = ("judged", "matured")
NOTE_KEY = ["note_date", "headline_id", "rollout_index"]


def ledger_frame(rows: list[dict]) -> pd.DataFrame:
    """Ledger rows in LEDGER_COLUMNS order with stable dtypes (an empty day too)."""
    frame = pd.DataFrame(rows, columns=LEDGER_COLUMNS)
    return frame.astype({"rollout_index": "int64", "staleness_updates": "int64", "staleness_days": "int64",
                         "signal_value": "float64", "advantage": "float64", "is_ratio": "float64"})


def settled_notes(earlier: pd.DataFrame, step: str) -> set[tuple[str, str, int]]:
    """(note_date, headline_id, rollout_index) of the notes a `step` already trained or dropped, in the
    ledgers of earlier days."""
    if earlier is None or earlier.empty:
        return set()
    rows = earlier[earlier["step"] == step]
    return {(str(d), str(h), int(i)) for d, h, i in zip(rows["note_date"], rows["headline_id"], rows["rollout_index"])}
