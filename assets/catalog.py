"""What the Dagster catalog shows beside the assets: owners, and the column schema of each table.

Every table asset writes Parquet files with a DuckDB view of the same name (`warehouse.duckdb`);
`table_metadata(table, columns)` gives its `dagster/column_schema` (a column per name of the
method's column constant, in that order, typed and described here or, for most daily_rl tables,
beside the constant in the module that writes the table) and `dagster/table_name`.
`tests/pipelines/test_defs.py` checks that every column of every table has a description here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import dagster as dg

from assets.daily_rl.catalog import EVALUATION_COLUMNS, PROMPT_EVOLVER_COLUMNS
from assets.daily_rl.distill_catalog import DISTILLATION_COLUMNS
from assets.feedback.catalog import FEEDBACK_TABLE_COLUMNS
from outcome_flywheel.daily_rl.feeds.headlines import HEADLINE_COLUMN_SCHEMA
from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_COLUMN_SCHEMA
from outcome_flywheel.daily_rl.report.summary import SUMMARY_COLUMN_SCHEMA
from outcome_flywheel.daily_rl.reward.rollout_scores import SCORE_COLUMN_SCHEMA
from outcome_flywheel.steps.metadata import DeclaredCheck

OWNERS = ["team:ml"]
TABLE_KINDS = {"parquet", "duckdb"}  # a table: Parquet files per partition + one DuckDB view over them
MODEL_KINDS = {"safetensors", "pytorch", "mlx"}  # a model folder: safetensors weights, loaded by either backend
UNDESCRIBED = "(no description)"

# table -> column -> (type, description)
COLUMNS: dict[str, dict[str, tuple[str, str]]] = {
    # each *_COLUMN_SCHEMA: described beside the columns, in the module that writes the table
    "headlines": HEADLINE_COLUMN_SCHEMA,
    "rollouts": ROLLOUT_COLUMN_SCHEMA,
    "rollout_scores": SCORE_COLUMN_SCHEMA,
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
        "clip_fraction": (
            "float",
            "Share of ratios whose clipped term was the active one: tokens with an advantage (objective token), sequences (gspo).",
        ),
        "kl_penalty": (
            "float",
            "Mean KL(policy || base) per token over the update's steps, on the tokens the loss's KL term covers (`kl_span`: every response token, or the call's ticker), before beta: the k3 estimate on the sampled token, or the exact sum over the vocabulary (`kl_estimator`).",
        ),
        "kl_reference": ("string", "What the KL term was taken against: the base (adapter off), or none and why."),
        "optimizer_moments": (
            "string",
            "Whether AdamW's moments were resumed from the parent checkpoint (and after how many steps) or started fresh, and why.",
        ),
        "lora_adapter": (
            "string",
            "What trained: a fresh LoRA adapter (its rank, alpha, dropout, targets), one carried from the parent (its own; then configured LoRA settings that differ, or full fine-tuning, are named as set aside: they apply to a fresh adapter, or a policy without one, only), or every weight.",
        ),
        "behavior_logprob_gap_max": (
            "float",
            "Largest |stored behaviour log-prob - recomputed pi_old| per note, over its forwarded tokens (~1e-6 in fp32).",
        ),
        "train_wall_s": ("float", "Seconds spent in the trainer."),
        "train_micro_batches": (
            "int",
            "Forward-backward parts over all steps (as many as steps when each minibatch was taken whole): the memory budget's cut, FLYWHEEL_TRAIN_MEMORY_GIB.",
        ),
        "train_recomputed": (
            "bool",
            "The decoder layers recomputed their activations in the backward pass (FLYWHEEL_TRAIN_RECOMPUTE).",
        ),
        "grad_share_note": (
            "float",
            "The whole-note part's share of the update's gradient norm (note + relevance + price + counterfactual), on a probe minibatch before the first step.",
        ),
        "grad_share_relevance": ("float", "The relevance part's share of it (the call's ticker tokens)."),
        "grad_share_price": ("float", "The price part's share of it (the call's side, matured and replayed notes)."),
        "grad_share_counterfactual": (
            "float",
            "The counterfactual term's share of it (sides: price_counterfactual_c > 0; names: relevance_counterfactual_c > 0; NaN when the probe holds no note that carries it).",
        ),
        "name_counterfactual_notes": (
            "int",
            "Judged notes carrying the counterfactual name term (relevance_counterfactual_c > 0): calls with a side, set against the headline's company or a decoy.",
        ),
        "name_probability_own": (
            "float",
            "Mean probability of those calls' own name over the update's steps that carry the term.",
        ),
        "name_probability_other": (
            "float",
            "Mean probability of the other company's name in its place (the headline's or a decoy), teacher-forced, likewise.",
        ),
        "objective": (
            "string",
            "token (token-level clipped surrogate, signal-scoped advantages), gspo or reward_weighted.",
        ),
        "learning_rate": ("float", "Optimiser learning rate."),
        "headlines": ("int", "Headlines of D."),
        "rollouts": ("int", "Rollouts generated for D."),
        "generated_tokens": ("int", "Tokens sampled for D's rollouts."),
        "mean_structure": ("float", "Mean structure score of D's rollouts."),
        "scored": ("int", "Rollouts of D-1 scored."),
        "usable": ("int", "Scored rollouts in usable groups."),
        "outcome_headlines_date": ("string", "Day whose headlines scored D-1's rollouts."),
        "gate": (
            "string",
            "Evaluation gate: accepted (the update is checkpoint D), rejected (the parent's weights stay) or not_trained.",
        ),
        "gate_reason": (
            "string",
            "Why the gate decided so (loss, KL to the parent, probe structure against the parent).",
        ),
        "gate_kl_to_parent": (
            "float",
            "Exact per-token KL(candidate || parent) on the trained rollouts, nats (NaN when not gated).",
        ),
        "gate_kl_to_base": (
            "float",
            "Exact per-token KL(candidate || base) on the trained rollouts, nats, when the gate's bound (gate_max_kl_to_base) is set; else NaN.",
        ),
        "gate_probe_structure": (
            "float",
            "Mean structure score of the candidate's greedy notes on the probe headlines.",
        ),
        "gate_probe_parent_structure": ("float", "The same for the parent."),
        "score_s": ("float", "Seconds: scoring."),
        "train_s": ("float", "Seconds: training and saving the checkpoint."),
        "generate_s": ("float", "Seconds: generating D's rollouts."),
        "kl_s": ("float", "Seconds: the KL to the base."),
    },
    "daily_report": SUMMARY_COLUMN_SCHEMA,
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
        "vs_spy_pct": (
            "float",
            "Mean over the orders of side x (return - SPY's return), percentage points: > 0 = the proposal beat SPY.",
        ),
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
        "margin_logp": (
            "float",
            "DPO implicit reward of the proposal minus that of holding (log-probs, adapter vs base).",
        ),
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
    "prompt_version": (
        "string",
        "Always base: the baseline keeps the base system prompt whatever variant the policy had.",
    ),
}
COLUMNS.update(PROMPT_EVOLVER_COLUMNS)
COLUMNS.update(EVALUATION_COLUMNS)
COLUMNS.update(FEEDBACK_TABLE_COLUMNS)
COLUMNS.update(DISTILLATION_COLUMNS)


def check_specs(declared: Iterable[DeclaredCheck]) -> list[dg.AssetCheckSpec]:
    """The asset check specs of checks a step declares (`outcome_flywheel.steps.metadata.DeclaredCheck`)."""
    return [dg.AssetCheckSpec(c.name, asset=c.asset, blocking=c.blocking, description=c.description) for c in declared]


def column_schema(table: str, columns: Iterable[str] | None = None) -> dg.TableSchema:
    """The table's columns, in the order of `columns` (the method's constant) or of `COLUMNS`."""
    described = COLUMNS.get(table, {})
    names = list(columns) if columns is not None else list(described)
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name,
                described.get(name, ("", ""))[0] or "unknown",
                description=described.get(name, ("", UNDESCRIBED))[1],
            )
            for name in names
        ]
    )


def table_metadata(table: str, columns: Iterable[str] | Mapping[str, str] | None = None) -> dict:
    """Definition metadata of a table asset: its column schema and its DuckDB view's name."""
    return {"dagster/column_schema": column_schema(table, columns), "dagster/table_name": f"warehouse.main.{table}"}


def column_names(table: str, present: Iterable[str] = ()) -> list[str]:
    """The columns of a table whose column list lives here (tables the assets layer builds), in
    order, then any of `present` not listed here (kept, never dropped; the schema test flags them)."""
    listed = list(COLUMNS[table])
    return listed + [c for c in present if c not in listed]
