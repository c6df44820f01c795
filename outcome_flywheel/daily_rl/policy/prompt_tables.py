"""The prompt evolver's two tables, `prompt_evolver` (one row per variant) and `prompt_experiences` (one row per
scored group), their columns with descriptions, and the variants as a markdown table for the asset's metadata."""

from __future__ import annotations

import pandas as pd

# The `prompt_evolver` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
VARIANT_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Partition day D: the state after D's scores and D's assignments."),
    "version": ("string", "The variant: base (SYSTEM_PROMPT) or v<n>-<sha256 of the prompt, 8 hex>."),
    "parent": ("string", "The variant it was written from (the best when it was written)."),
    "mutation": (
        "string",
        (
            "state_rules, reorder_rules, rephrase_rule, tighten_wording, add_example, rephrase_condition; empty for base."
        ),
    ),
    "writer": ("string", "rules, or llm:<model> when the judge model (a real LLM) wrote it."),
    "system_prompt": ("string", "The system message of the variant."),
    "spec": ("string", "The variant as JSON: role, rules, example."),
    "created_date": ("string", "Day the variant was written."),
    "created_at_trial": ("int", "Scored trials when it was written (one every trials_per_variant)."),
    "status": (
        "string",
        (
            "live (an arm of the bandit), rejected (worse than the best on the held-out set) or retired (more than "
            "max_live)."
        ),
    ),
    "pulls": ("int", "Scored trials: headlines whose group was sampled under it and scored usable."),
    "pending": ("int", "Headlines of D given this variant, scored on D+1."),
    "reward_sum": ("float", "Sum of its trials' rewards (group mean reward)."),
    "reward_sq_sum": ("float", "Sum of their squares (for the interval)."),
    "reward_mean": ("float", "Mean trial reward."),
    "ci_low": ("float", "95% t-interval of the mean, low (two or more pulls)."),
    "ci_high": ("float", "95% t-interval of the mean, high."),
    "is_best": ("bool", "The best live variant (highest mean with at least min_pulls_for_best pulls; else base)."),
    "heldout_n": ("int", "Held-out headlines it was tested on before adoption (0 for base)."),
    "heldout_reward": ("float", "Its mean reward on them (structure part, rank reward at its group mean 0.5)."),
    "heldout_best_reward": ("float", "The best's mean reward on the same headlines and seeds."),
    "heldout_diff": ("float", "heldout_reward - heldout_best_reward: adopted when >= -tolerance."),
}


VARIANT_COLUMNS = list(VARIANT_COLUMN_SCHEMA)


# The `prompt_experiences` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
EXPERIENCE_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Day the group was scored."),
    "prediction_date": ("string", "Day the group was sampled."),
    "headline_id": ("string", "The headline."),
    "title": ("string", "Headline text."),
    "summary": ("string", "Headline summary."),
    "prompt_version": ("string", "The variant it was sampled under."),
    "reward": ("float", "The group's mean reward (the trial's reward)."),
}


EXPERIENCE_COLUMNS = list(EXPERIENCE_COLUMN_SCHEMA)


def variant_table(variants: pd.DataFrame) -> str:
    """Markdown: each variant's status, pulls, mean reward and 95% interval (the asset's metadata)."""
    lines = [
        "| version | status | mutation | pulls | mean reward | 95% interval | held-out diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in variants.itertuples():
        fmt = lambda x: "" if pd.isna(x) else f"{x:.3f}"  # noqa: E731
        ci = f"[{fmt(v.ci_low)}, {fmt(v.ci_high)}]" if not pd.isna(v.ci_low) else ""
        best = " (best)" if v.is_best else ""
        lines.append(
            f"| {v.version}{best} | {v.status} | {v.mutation or 'base prompt'} | {v.pulls} | {fmt(v.reward_mean)} | {ci} | {fmt(v.heldout_diff)} |"
        )
    return "\n".join(lines)
