"""The reward ledger: per note, which signals it was trained on, when, and against which policy.

`reward_ledger` is written per training day D (its partition), one row per note per step: `judged`
(the immediate signals, the day after the note) and `matured` (the `price` signal, when the call's
outcome is known). A note trains on each signal once: D looks only at the ledgers of the days before
D, so a re-run of D rebuilds the same rows. `dropped` rows settle a note too (stale, no_data), with
the reason. Columns: docs/daily_rl.md, "Delayed rewards".
"""

from __future__ import annotations

import pandas as pd

# The `reward_ledger` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
LEDGER_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Training day D: the run of daily_update that trained (or dropped) the note."),
    "note_date": ("string", "The note's day (its rollouts partition)."),
    "headline_id": ("string", "The note's headline."),
    "rollout_index": ("int", "Which of the headline's notes."),
    "step": (
        "string",
        (
            "judged (immediate signals, the day after the note), matured (price, when its outcome is known) or "
            "replay (a price group trained again on a later day, decayed; it settles nothing)."
        ),
    ),
    "signals": ("string", "Comma-separated reward signals this row trained the note on."),
    "status": ("string", "trained or dropped; either way the note is settled for this step."),
    "reason": (
        "string",
        ("Why it was dropped (stale: N policy updates > limit; no_data: ...; the judge's unusable reason)."),
    ),
    "policy_version": ("string", "D's parent: the policy the update started from (the one trained against)."),
    "behavior_policy_version": ("string", "The checkpoint that sampled the note (its behaviour log-probs)."),
    "staleness_updates": ("int", "Policy updates (weight changes) between the note's sampler and D's parent."),
    "staleness_days": ("int", "Days between the note's day and D."),
    "signal_value": ("float", "The price signal in [0, 1] (matured) or the immediate reward (judged)."),
    "advantage": ("float", "The group-normalised advantage trained on (price part scaled by its weight share)."),
    "is_ratio": ("float", "exp(mean_t(log pi_parent - log pi_behaviour)), before truncation; NaN when no gradient."),
}
LEDGER_COLUMNS = list(LEDGER_COLUMN_SCHEMA)
STEPS = ("judged", "matured", "replay")
NOTE_KEY = ["note_date", "headline_id", "rollout_index"]


def ledger_frame(rows: list[dict]) -> pd.DataFrame:
    """Ledger rows in LEDGER_COLUMNS order with stable dtypes (an empty day too)."""
    frame = pd.DataFrame(rows, columns=LEDGER_COLUMNS)
    return frame.astype(
        {
            "rollout_index": "int64",
            "staleness_updates": "int64",
            "staleness_days": "int64",
            "signal_value": "float64",
            "advantage": "float64",
            "is_ratio": "float64",
        }
    )


def settled_notes(earlier: pd.DataFrame, step: str) -> set[tuple[str, str, int]]:
    """(note_date, headline_id, rollout_index) of the notes a `step` already trained or dropped, in the
    ledgers of earlier days."""
    if earlier is None or earlier.empty:
        return set()
    rows = earlier[earlier["step"] == step]
    return {(str(d), str(h), int(i)) for d, h, i in zip(rows["note_date"], rows["headline_id"], rows["rollout_index"])}
