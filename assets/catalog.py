"""What the Dagster catalog shows beside the assets: owners, and the column schema of each table.

Every table asset writes Parquet files with a DuckDB view of the same name (`warehouse.duckdb`);
`table_metadata(table, columns)` gives its `dagster/column_schema` (a column per name of the
method's column constant, in that order, typed and described here) and `dagster/table_name`.
`tests/test_defs.py` checks that every column of every table has a description here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import dagster as dg

from assets.daily_rl.catalog import EVALUATION_COLUMNS, PROMPT_EVOLVER_COLUMNS
from assets.daily_rl.distill_catalog import DISTILLATION_COLUMNS
from assets.feedback.catalog import FEEDBACK_TABLE_COLUMNS

OWNERS = ["team:ml"]
TABLE_KINDS = {"parquet", "duckdb"}  # a table: Parquet files per partition + one DuckDB view over them
MODEL_KINDS = {"safetensors", "pytorch", "mlx"}  # a model folder: safetensors weights, loaded by either backend
UNDESCRIBED = "(no description)"

# table -> column -> (type, description)
COLUMNS: dict[str, dict[str, tuple[str, str]]] = {
    "headlines": {
        "date": ("string", "Partition day D (YYYY-MM-DD, FLYWHEEL_TIMEZONE)."),
        "headline_id": ("string", "Stable id of the headline: hash of the day and its normalised title."),
        "title": ("string", "Headline text, HTML stripped."),
        "summary": ("string", "Feed summary/description, HTML stripped, at most 500 characters."),
        "source": ("string", "The feed's title (or its file name)."),
        "link": ("string", "The entry's link, empty when the feed gave none."),
        "published_at": ("timestamp", "Publication time, UTC (naive)."),
        "feed_file": ("string", "Feed file the entry came from (archive file or the saved live download)."),
    },
    "rollouts": {
        "date": ("string", "Partition day D: the headlines' day and the checkpoint that wrote the notes."),
        "headline_id": ("string", "The headline the note is about (headlines.headline_id)."),
        "rollout_index": ("int", "0..N-1: which of the headline's N samples."),
        "title": ("string", "Headline text given in the prompt."),
        "summary": ("string", "Headline summary given in the prompt."),
        "prompt": ("string", "Chat messages of the prompt, JSON."),
        "response": ("string", "The sampled trading note."),
        "response_ids": ("list<int>", "Token ids of the sampled note."),
        "n_tokens": ("int", "Number of sampled tokens."),
        "finished": ("bool", "The note ended on its own (EOS) rather than at max_new_tokens."),
        "structure_score": ("float", "Share of the 6 required sections present (Trade Recommendation ... Stop Loss), in [0, 1]."),
        "behavior_logprobs": ("list<float>", "Per-token log-probs under the sampling policy at the sampling temperature (GSPO's pi_old)."),
        "temperature": ("float", "Sampling temperature (0.8)."),
        "policy_version": ("string", "Checkpoint that sampled the note: D@<weights sha256, 12 hex> or D@base."),
        "seed": ("int", "Sampling seed of the headline's group."),
        "max_new_tokens": ("int", "Token budget each note was sampled with."),
        "prompt_version": ("string", "The prompt evolver's variant of the system prompt the note was sampled under (base = SYSTEM_PROMPT)."),
    },
    "rollout_scores": {
        "date": ("string", "Partition day D (the day whose headlines are the outcome)."),
        "prediction_date": ("string", "Day of the scored rollouts (D-1)."),
        "outcome_headlines_date": ("string", "Day whose headlines the judge compared against (D, or the override day)."),
        "headline_id": ("string", "The headline of the scored group (rollouts.headline_id of D-1)."),
        "rollout_index": ("int", "Which note of the group (rollouts.rollout_index)."),
        "rank": ("int", "Judge rank, 1 = best; the group's ranks are a permutation of 1..N."),
        "judge_placed": ("bool", "The judge picked this note in some round (unplaced notes share one reward)."),
        "outcome_reward": ("float", "Rank reward 1 - (rank-1)/(N-1), in [0, 1]."),
        "structure_score": ("float", "Structure score of the note, in [0, 1]."),
        "reward": ("float", "Weighted sum of the signals (reward_weights), clipped to reward_clip; default 0.5 * structure_score + 0.5 * outcome_reward in [0, 1]."),
        "advantage": ("float", "Reward normalised within the headline's group (0 for unusable groups)."),
        "usable": ("bool", "The group is trained on (the judge answered and there were outcome headlines)."),
        "unusable_reason": ("string", "Why the group is not trained on; empty when usable."),
        "judge_retries": ("int", "Greedy retries asking for exactly one letter."),
        "judge_fallback": ("bool", "The judge gave no usable letter in some round (ranks were padded)."),
        "judge_rounds_answered": ("int", "Selection rounds the judge answered."),
        "judge_first_position": ("int", "Position the note was shown at in the first round (0 = A), -1 if never shown."),
        "judge_presentation": ("string", "Per round, the notes in the order shown (A, B, ...), JSON."),
        "judge_answers": ("string", "The judge's raw answer per round, JSON."),
        "outcome_headlines_shown": ("string", "Outcome headlines shown to the judge, JSON."),
        "reward_weights": ("string", "Weight of each named signal the reward was made with (structure, judge_rank), JSON."),
        "reward_clip": ("string", "[min, max] the reward was clipped to, JSON."),
        "judge_note_tokens": ("int", "The note's length in tokens, whitespace collapsed (0 when the judge was not asked)."),
        "judge_shown_tokens": ("int", "Tokens of the note the judge saw: its fair share of the judge's prompt budget."),
        "judge_truncated": ("bool", "The note was cut to fit the judge's prompt budget."),
        "human_signal": ("float", "People's thumbs/stars on the note in [0, 1] (note_feedback of the notes' day, mean), when it has any: the `human` reward signal."),
        "relevance_signal": ("float", "1 if the call is on a company the headline names, 0 if not; empty when the headline names no known company: the `relevance` signal."),
        "relevance_advantage": ("float", "The `relevance` part's group-normalised advantage (trained on the call's line, times its share); 0 where relevance is not weighted or the headline names no company."),
    },
    "policy_training": {
        "date": ("string", "Partition day D."),
        "policy_version": ("string", "Checkpoint D: D@<weights sha256, 12 hex> or D@base."),
        "kind": ("string", "base (untrained), lora (PEFT adapter) or full (all weights)."),
        "parent_version": ("string", "Checkpoint D-1 that was trained (empty on the first day)."),
        "trained": ("bool", "GSPO ran (there were usable scores)."),
        "examples": ("int", "Training examples (usable scored rollouts)."),
        "steps": ("int", "Optimiser steps."),
        "loss": ("float", "Mean GSPO loss."),
        "mean_reward": ("float", "Mean reward of the usable scored rollouts."),
        "kl_to_base": ("float", "Exact per-token KL(policy || base) on the day's own rollouts, nats."),
        "grad_norm_median": ("float", "Median gradient norm over the steps."),
        "grad_norm_iqr": ("float", "Interquartile range of the gradient norms."),
        "clip_fraction": ("float", "Share of ratios whose clipped term was the active one: tokens with an advantage (objective token), sequences (gspo)."),
        "kl_penalty": ("float", "Mean k3 estimate of KL(policy || base) per token over the update's steps (the loss's KL term, before beta)."),
        "kl_reference": ("string", "What the KL term was taken against: the base (adapter off), or none and why."),
        "optimizer_moments": ("string", "Whether AdamW's moments were resumed from the parent checkpoint (and after how many steps) or started fresh, and why."),
        "behavior_logprob_gap_max": ("float", "Largest |stored behaviour log-prob - recomputed pi_old| (~1e-6 in fp32)."),
        "train_wall_s": ("float", "Seconds spent in the trainer."),
        "objective": ("string", "token (token-level clipped surrogate, signal-scoped advantages), gspo or reward_weighted."),
        "learning_rate": ("float", "Optimiser learning rate."),
        "headlines": ("int", "Headlines of D."),
        "rollouts": ("int", "Rollouts generated for D."),
        "generated_tokens": ("int", "Tokens sampled for D's rollouts."),
        "mean_structure": ("float", "Mean structure score of D's rollouts."),
        "scored": ("int", "Rollouts of D-1 scored."),
        "usable": ("int", "Scored rollouts in usable groups."),
        "outcome_headlines_date": ("string", "Day whose headlines scored D-1's rollouts."),
        "gate": ("string", "Evaluation gate: accepted (the update is checkpoint D), rejected (the parent's weights stay) or not_trained."),
        "gate_reason": ("string", "Why the gate decided so (loss, KL to the parent, probe structure against the parent)."),
        "gate_kl_to_parent": ("float", "Exact per-token KL(candidate || parent) on the trained rollouts, nats (NaN when not gated)."),
        "gate_kl_to_base": ("float", "Exact per-token KL(candidate || base) on the trained rollouts, nats, when the gate's bound (gate_max_kl_to_base) is set; else NaN."),
        "gate_probe_structure": ("float", "Mean structure score of the candidate's greedy notes on the probe headlines."),
        "gate_probe_parent_structure": ("float", "The same for the parent."),
        "score_s": ("float", "Seconds: scoring."),
        "train_s": ("float", "Seconds: training and saving the checkpoint."),
        "generate_s": ("float", "Seconds: generating D's rollouts."),
        "kl_s": ("float", "Seconds: the KL to the base."),
    },
    "daily_report": {
        "date": ("string", "Partition day D."),
        "headlines": ("int", "Headlines of D."),
        "rollouts": ("int", "Rollouts generated for D."),
        "mean_structure": ("float", "Mean structure score of D's rollouts."),
        "finished_share": ("float", "Share of D's notes that ended on their own (not at the length cap)."),
        "scored": ("int", "Rollouts of D-1 scored on D."),
        "usable_share": ("float", "Share of scored rollouts in groups the judge answered (pass-through)."),
        "reward_n": ("int", "Usable scored rollouts."),
        "reward_avg": ("float", "Mean reward of the usable scored rollouts."),
        "reward_min": ("float", "Lowest reward."),
        "reward_max": ("float", "Highest reward."),
        "reward_negatives": ("int", "Rewards below 0 (should stay 0)."),
        "negative_advantages": ("int", "Usable rollouts with a negative advantage (pushed down by training)."),
        "trained": ("bool", "GSPO ran on D."),
        "steps": ("int", "Optimiser steps."),
        "loss": ("float", "Mean GSPO loss."),
        "kl_to_base": ("float", "Per-token KL to the base model, nats."),
        "grad_norm_median": ("float", "Median gradient norm."),
        "grad_norm_iqr": ("float", "Interquartile range of the gradient norms."),
        "clip_fraction": ("float", "Share of clipped GSPO ratios."),
        "policy_version": ("string", "Checkpoint of D."),
        "gate": ("string", "Evaluation gate of D's update: accepted, rejected (the parent's weights stay) or not_trained."),
        "gate_reason": ("string", "Why the gate decided so."),
    },
    "operator_decisions": {
        "decision_id": ("string", "The audit log's decision id (a repeated id keeps its last line)."),
        "decision_date": ("string", "Date of the decision in FLYWHEEL_TIMEZONE: the partition."),
        "ts_utc": ("string", "Decision time, UTC, ISO 8601."),
        "ts_local": ("string", "Decision time in FLYWHEEL_TIMEZONE, ISO 8601."),
        "decision": ("string", "approve, reject or override."),
        "proposal_orders_json": ("string", "The proposal's orders (symbol, side, weight), canonical JSON."),
        "proposal_text": ("string", "The proposal's note, if any."),
        "operator_orders_json": ("string", "The operator's own orders (overrides only), canonical JSON."),
        "reason": ("string", "The operator's reason, if given."),
        "context_json": ("string", "Decision context (account, regime, ...), canonical JSON."),
        "extra_json": ("string", "Keys of the line beyond the schema, kept, JSON."),
        "symbols": ("string", "The proposal's symbols, comma-separated, sorted."),
        "n_orders": ("int", "Orders in the proposal."),
        "line_number": ("int", "Line of the audit log the decision was read from."),
        "duplicates_dropped": ("int", "Earlier lines with the same decision_id that this one replaced."),
    },
    "decision_outcomes": {
        "decision_id": ("string", "The decision (operator_decisions.decision_id)."),
        "decision_date": ("string", "Date of the decision: the partition."),
        "status": ("string", "matured, pending (exit not closed or no prices yet) or no_data."),
        "reason": ("string", "Why the outcome is pending or has no data; empty when matured."),
        "symbols": ("string", "The proposal's symbols, comma-separated."),
        "entry_date": ("string", "XNYS session whose close is the entry (first close at or after the decision)."),
        "exit_date": ("string", "XNYS session 5 sessions after the entry."),
        "exit_close_utc": ("string", "When the exit session closes, UTC."),
        "return_pct": ("float", "Mean over the orders of side x return entry -> exit, percent (buy +1, sell -1)."),
        "spy_return_pct": ("float", "SPY's return over the same window, percent."),
        "vs_spy_pct": ("float", "Mean over the orders of side x (return - SPY's return), percentage points: > 0 = the proposal beat SPY."),
        "window_days": ("int", "Sessions between entry and exit (5)."),
        "computed_at": ("string", "When the outcome was computed, UTC."),
    },
    "dpo_dataset": {
        "pair_id": ("string", "Stable pair id (hash of the decision id)."),
        "decision_id": ("string", "The decision the pair comes from."),
        "decision_date": ("string", "Date of the decision."),
        "split": ("string", "train or holdout (20% of decisions by a stable hash of the id; never trained on)."),
        "decision": ("string", "approve, reject or override."),
        "outcome_status": ("string", "The decision's outcome status (matured, pending, no_data, missing)."),
        "vs_spy_pct": ("float", "The proposal's T+5 return vs SPY, percentage points (NaN until matured)."),
        "verdict": ("string", "positive / negative when matured, else none."),
        "treatment": ("string", "Row of the weighting table: agree_boost, approve_market_down, swap or no_verdict."),
        "outcome_weight": ("float", "Weight from the table; negative = chosen and rejected swapped."),
        "effective_weight": ("float", "|outcome_weight|: the pair's weight in the DPO loss."),
        "replication": ("float", "Copies of the pair in the exports for outside trainers (x3, x1, x1.5)."),
        "swapped": ("bool", "The market proved the operator wrong: chosen and rejected were swapped."),
        "prompt": ("string", "Chat messages of the prompt, canonical JSON."),
        "chosen": ("string", "Preferred plan, rendered as text."),
        "rejected": ("string", "Dispreferred plan, rendered as text."),
        "proposal_plan": ("string", "The proposal rendered as text (what holdout_eval scores)."),
        "symbols": ("string", "The proposal's symbols, comma-separated."),
    },
    "preference_training_history": {
        "run": ("string", "Adapter run id: UTC time and the Dagster run id's first 8 characters."),
        "dagster_run_id": ("string", "The Dagster run that trained it."),
        "started_at": ("string", "Start, UTC."),
        "base_model": ("string", "FLYWHEEL_BASE_MODEL the adapter sits on."),
        "backend": ("string", "torch or mlx."),
        "n_pairs": ("int", "Training pairs."),
        "n_holdout": ("int", "Holdout pairs (not trained on)."),
        "dataset_fingerprint": ("string", "sha256 of the pairs trained on."),
        "learning_rate": ("float", "AdamW learning rate."),
        "beta": ("float", "DPO beta."),
        "epochs": ("int", "Passes over the pairs."),
        "lora_r": ("int", "LoRA rank."),
        "completion_unit": ("string", "line or sequence."),
        "steps": ("int", "Optimiser steps."),
        "loss_first": ("float", "Loss of the first step."),
        "loss_last": ("float", "Loss of the last step."),
        "wall_s": ("float", "Seconds of the run."),
        "status": ("string", "succeeded or failed."),
        "error": ("string", "The error of a failed run."),
        "adapter_path": ("string", "Folder of the adapter (adapters/preference/<run>/)."),
        "finished_at": ("string", "End, UTC."),
    },
    "holdout_eval": {
        "adapter_run": ("string", "The adapter evaluated (its run id)."),
        "decision_id": ("string", "Holdout decision."),
        "decision_date": ("string", "Date of the decision."),
        "decision": ("string", "approve, reject or override."),
        "verdict": ("string", "positive / negative when matured, else none."),
        "vs_spy_pct": ("float", "The proposal's T+5 return vs SPY, percentage points."),
        "proposal_plan": ("string", "The proposal rendered as text: what is scored."),
        "margin_logp": ("float", "DPO implicit reward of the proposal minus that of holding (log-probs, adapter vs base)."),
        "style_match_score": ("float", "sigmoid(beta * margin_logp), in [0, 1]."),
        "evaluated_at": ("string", "When it was scored, UTC."),
    },
    "style_drift": {
        "mean_auc_last": ("float", "Mean of the last 3 holdout AUCs."),
        "n_evals": ("int", "Evaluations in that mean."),
        "drift": ("string", "high (mean < 0.55), low, or unknown (no evaluation yet)."),
        "computed_at": ("string", "When it was computed, UTC."),
        "last_runs": ("string", "The adapter runs of those AUCs, comma-separated."),
    },
}


COLUMNS["baseline_rollouts"] = {
    **COLUMNS["rollouts"],
    "date": ("string", "Partition day D: the same day, headlines and prompts as rollouts(D)."),
    "policy_version": ("string", "base:<model>: the frozen base model."),
    "behavior_logprobs": ("list<float>", "Per-token log-probs under the base model at the sampling temperature."),
    "prompt_version": ("string", "Always base: the baseline keeps the base system prompt whatever variant the policy had."),
}
COLUMNS.update(PROMPT_EVOLVER_COLUMNS)
COLUMNS.update(EVALUATION_COLUMNS)
COLUMNS.update(FEEDBACK_TABLE_COLUMNS)
COLUMNS.update(DISTILLATION_COLUMNS)


def column_schema(table: str, columns: Iterable[str] | None = None) -> dg.TableSchema:
    """The table's columns, in the order of `columns` (the method's constant) or of `COLUMNS`."""
    described = COLUMNS.get(table, {})
    names = list(columns) if columns is not None else list(described)
    return dg.TableSchema(columns=[
        dg.TableColumn(name, described.get(name, ("", ""))[0] or "unknown", description=described.get(name, ("", UNDESCRIBED))[1])
        for name in names
    ])


def table_metadata(table: str, columns: Iterable[str] | Mapping[str, str] | None = None) -> dict:
    """Definition metadata of a table asset: its column schema and its DuckDB view's name."""
    return {"dagster/column_schema": column_schema(table, columns), "dagster/table_name": f"warehouse.main.{table}"}


def column_names(table: str, present: Iterable[str] = ()) -> list[str]:
    """The columns of a table whose column list lives here (tables the assets layer builds), in
    order, then any of `present` not listed here (kept, never dropped; the schema test flags them)."""
    listed = list(COLUMNS[table])
    return listed + [c for c in present if c not in listed]
