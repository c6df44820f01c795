"""Best-vs-worst preference pairs from the daily loop's judged groups (`rollout_pairs`).

For each judged (usable) group of D-1's notes scored on D, the best note is preferred to the worst.
Order inside a group: higher reward first, then higher structure score, then the shorter note (a
tie on both scores should not reward length), then the lower rollout index (only so the order is
total). A pair is kept only when the reward gap is at least `min_reward_gap` (default 0.3): a
smaller gap is mostly judge noise. The comparison allows for float rounding (0.7 - 0.4 is
0.29999999999999993 in binary floating point, and is a gap of 0.3). Groups without such a contrast go to `no_contrast` with the
reason. Pairs whose (prompt, chosen, rejected) text repeats an earlier pair of the day are dropped,
as are pairs whose two notes read the same.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pandas as pd

from outcome_flywheel.exports import EXPORT_FORMATS, jsonl_bytes

DEFAULT_MIN_REWARD_GAP = 0.3
# Rewards are weighted sums of signals in [0, 1], so the float error of a gap is ~1e-16; 1e-9 is far
# above that and far below any difference a judge can make (a rank step is 1/7 for 8 notes).
REWARD_GAP_TOLERANCE = 1e-9
# The `rollout_pairs` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
PAIR_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "pair_id": ("string", "Stable id: hash of the day, headline and the two rollout indices."),
    "date": ("string", "Partition day D (the scoring day)."),
    "prediction_date": ("string", "Day of the notes (D-1)."),
    "headline_id": ("string", "The judged group."),
    "prompt": ("string", "Chat messages of the prompt, JSON."),
    "chosen": ("string", "The group's best note."),
    "rejected": ("string", "The group's worst note."),
    "chosen_rollout_index": ("int", "rollout_index of the chosen note."),
    "rejected_rollout_index": ("int", "rollout_index of the rejected note."),
    "chosen_reward": ("float", "Reward of the chosen note."),
    "rejected_reward": ("float", "Reward of the rejected note."),
    "reward_gap": ("float", "chosen_reward - rejected_reward (at least the minimum gap)."),
    "chosen_structure": ("float", "Structure score of the chosen note."),
    "rejected_structure": ("float", "Structure score of the rejected note."),
    "chosen_rank": ("int", "Judge rank of the chosen note."),
    "rejected_rank": ("int", "Judge rank of the rejected note."),
    "seed": ("int", "Sampling seed of the group."),
    "policy_version": ("string", "Checkpoint that wrote the notes."),
    "reward_weights": ("string", "Reward weights the scores were made with, JSON."),
}
PAIR_COLUMNS = list(PAIR_COLUMN_SCHEMA)
NO_CONTRAST_COLUMNS = ["date", "prediction_date", "headline_id", "notes", "reward_gap", "reason"]


def _shown_below(gap: float, limit: float) -> str:
    """`gap` with 3 decimals, or as many more as it takes not to read as `limit` (0.2999 is not "0.300")."""
    for digits in range(3, 17):
        text = f"{gap:.{digits}f}"
        if float(text) < limit:
            return text
    return repr(gap)


def _ordered(group: pd.DataFrame) -> pd.DataFrame:
    """Best first: reward, then structure, then the shorter note, then the lower index."""
    g = group.assign(_length=group["response"].str.len())
    return g.sort_values(
        ["reward", "structure_score", "_length", "rollout_index"], ascending=[False, False, True, True]
    )


def build_rollout_pairs(
    scores: pd.DataFrame, rollouts: pd.DataFrame, min_reward_gap: float = DEFAULT_MIN_REWARD_GAP
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, no_contrast) of one day's scores (rollout_scores(D)) and the notes they scored (rollouts(D-1))."""
    if not 0.0 <= min_reward_gap:
        raise ValueError(f"min_reward_gap must be >= 0, got {min_reward_gap}")
    if scores.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS), pd.DataFrame(columns=NO_CONTRAST_COLUMNS)
    cols = ["headline_id", "rollout_index", "prompt", "response", "seed", "policy_version"]
    merged = scores.merge(rollouts[cols], on=["headline_id", "rollout_index"], how="left", validate="one_to_one")
    pairs, none, seen = [], [], set()
    for headline_id, group in merged.groupby("headline_id", sort=True):
        base = dict(
            date=group["date"].iloc[0],
            prediction_date=group["prediction_date"].iloc[0],
            headline_id=headline_id,
            notes=len(group),
        )
        if group["response"].isna().any():
            none.append(
                {
                    **base,
                    "reward_gap": float("nan"),
                    "reason": "scored notes missing from the rollouts of the prediction day",
                }
            )
            continue
        if not bool(group["usable"].iloc[0]):
            none.append(
                {**base, "reward_gap": float("nan"), "reason": f"unusable group: {group['unusable_reason'].iloc[0]}"}
            )
            continue
        if len(group) < 2:
            none.append({**base, "reward_gap": float("nan"), "reason": "fewer than 2 notes"})
            continue
        ordered = _ordered(group)
        best, worst = ordered.iloc[0], ordered.iloc[-1]
        gap = float(best["reward"] - worst["reward"])
        if gap < min_reward_gap - REWARD_GAP_TOLERANCE:
            none.append(
                {
                    **base,
                    "reward_gap": gap,
                    "reason": f"reward gap {_shown_below(gap, min_reward_gap)} < {min_reward_gap:g}",
                }
            )
            continue
        if best["response"].strip() == worst["response"].strip():
            none.append({**base, "reward_gap": gap, "reason": "best and worst notes read the same"})
            continue
        key = (best["prompt"], best["response"], worst["response"])
        if key in seen:
            none.append({**base, "reward_gap": gap, "reason": "duplicate of an earlier pair of the day"})
            continue
        seen.add(key)
        pairs.append(
            dict(
                pair_id=hashlib.sha256(
                    "|".join(
                        str(x) for x in (base["date"], headline_id, best["rollout_index"], worst["rollout_index"])
                    ).encode()
                ).hexdigest()[:16],
                date=base["date"],
                prediction_date=base["prediction_date"],
                headline_id=headline_id,
                prompt=best["prompt"],
                chosen=best["response"],
                rejected=worst["response"],
                chosen_rollout_index=int(best["rollout_index"]),
                rejected_rollout_index=int(worst["rollout_index"]),
                chosen_reward=float(best["reward"]),
                rejected_reward=float(worst["reward"]),
                reward_gap=gap,
                chosen_structure=float(best["structure_score"]),
                rejected_structure=float(worst["structure_score"]),
                chosen_rank=int(best["rank"]),
                rejected_rank=int(worst["rank"]),
                seed=int(best["seed"]),
                policy_version=str(best["policy_version"]),
                reward_weights=str(best.get("reward_weights", "")),
            )
        )
    return pd.DataFrame(pairs, columns=PAIR_COLUMNS), pd.DataFrame(none, columns=NO_CONTRAST_COLUMNS)


def pair_exports(pairs: pd.DataFrame) -> dict[str, bytes]:
    """`{format}.jsonl` for TRL, NeMo-RL and Together/OpenAI, plus `pairs.meta.json`: line i of every
    format is pair i of the sidecar (rollout ids, scores, seed, policy version) and the files' sha256."""
    files: dict[str, bytes] = {}
    for fmt, make in EXPORT_FORMATS.items():
        files[f"{fmt}.jsonl"] = jsonl_bytes(
            make(json.loads(r.prompt), r.chosen, r.rejected) for r in pairs.itertuples(index=False)
        )
    sidecar: dict[str, Any] = {
        "source": "rollout_pairs: best vs worst note of each judged group of the daily loop",
        "rows": int(len(pairs)),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
        "pairs": [
            {
                "pair_id": r.pair_id,
                "date": r.date,
                "prediction_date": r.prediction_date,
                "headline_id": r.headline_id,
                "chosen": {
                    "rollout_index": r.chosen_rollout_index,
                    "reward": r.chosen_reward,
                    "structure": r.chosen_structure,
                    "rank": r.chosen_rank,
                },
                "rejected": {
                    "rollout_index": r.rejected_rollout_index,
                    "reward": r.rejected_reward,
                    "structure": r.rejected_structure,
                    "rank": r.rejected_rank,
                },
                "reward_gap": r.reward_gap,
                "seed": r.seed,
                "policy_version": r.policy_version,
                "reward_weights": json.loads(r.reward_weights) if r.reward_weights else None,
            }
            for r in pairs.itertuples(index=False)
        ],
    }
    files["pairs.meta.json"] = json.dumps(sidecar, indent=1, sort_keys=True).encode()
    return files
