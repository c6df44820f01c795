"""Column descriptions of the daily loop's evaluation tables (merged into `assets.catalog.COLUMNS`); most are
described beside their columns in the module that writes the table and only gathered here."""

from __future__ import annotations

from outcome_flywheel.daily_rl.evaluation.ab import PREFERENCE_COLUMN_SCHEMA
from outcome_flywheel.daily_rl.policy.prompt_tables import EXPERIENCE_COLUMN_SCHEMA, VARIANT_COLUMN_SCHEMA
from outcome_flywheel.daily_rl.reward.ledger import LEDGER_COLUMN_SCHEMA
from outcome_flywheel.daily_rl.reward.pairs import PAIR_COLUMN_SCHEMA
from outcome_flywheel.daily_rl.reward.training_record import PRICE_TRAINING_COLUMN_SCHEMA

_NOTE = {
    "date": ("string", "Partition day D: the headlines' day."),
    "source": ("string", "policy (rollouts: the checkpoint of D) or base (baseline_rollouts: the frozen base model)."),
    "headline_id": ("string", "The headline (headlines.headline_id)."),
    "rollout_index": ("int", "Which of the headline's notes; the same index on both sides is a matched pair."),
    "policy_version": ("string", "What wrote the note: checkpoint D's version, or base:<model>."),
}

_CALL = {
    "symbol": (
        "string",
        "The call's ticker, validated against the market data's symbols (company names mapped); empty when none.",
    ),
    "side": ("string", "long, short or none."),
    "timeframe": ("string", "The note's timeframe as written."),
    "timeframe_days": ("float", "The timeframe in calendar days where it can be read."),
    "position_size_pct": ("float", "Position size, percent of the portfolio (midpoint of a range)."),
    "stop_loss_pct": ("float", "Stop loss as a percent distance from entry."),
    "stop_loss_price": ("float", "Stop loss as a price."),
    "parse_status": (
        "string",
        "ok, or why there is no usable call: no_trade, no_side, no_symbol, unknown_symbol, ambiguous, empty.",
    ),
    "parse_reason": ("string", "The parser's reason when parse_status is not ok."),
}

_OUTCOME = {
    "status": ("string", "matured, pending (exit not closed or not in the data yet), no_data (reason) or no_call."),
    "reason": ("string", "Why the call is pending, has no data or is no call; empty when matured."),
    "entry_date": ("string", "Entry session: the first XNYS session strictly after D (its close)."),
    "exit_date": ("string", "Exit session: horizon_sessions sessions after the entry (its close)."),
    "exit_close_utc": ("string", "When the exit session closes, UTC (half days close at 13:00 New York)."),
    "horizon_sessions": ("int", "Sessions between entry and exit (FLYWHEEL_OUTCOME_HORIZON)."),
    "entry_close": ("float", "The symbol's close at entry (adjusted), from the market data."),
    "exit_close": ("float", "The symbol's close at exit."),
    "symbol_return_pct": ("float", "100 (exit/entry - 1): the symbol's move, unsigned, no cost."),
    "spy_return_pct": ("float", "SPY's move over the same sessions, percent."),
    "return_pct": ("float", "100 s (exit/entry - 1) - cost_bps/100, s = +1 long, -1 short."),
    "vs_spy_pct": ("float", "100 s ((exit/entry - 1) - (SPY exit/entry - 1)) - cost_bps/100: > 0 is a hit."),
    "cost_bps": ("float", "Round-trip cost taken off, basis points (FLYWHEEL_OUTCOME_COST_BPS)."),
    "computed_at": ("string", "When the outcome was computed, UTC."),
    "look_ahead": (
        "bool",
        "The note's policy was trained on headlines dated after D (override re-run, or a lineage that cannot be traced): left out of policy_eval and backtest by default.",
    ),
    "headlines_seen_through": (
        "string",
        "Latest headline date the note's policy was trained on (empty: none, the base).",
    ),
    "look_ahead_reason": ("string", "Why the note is look-ahead; empty when it is not."),
}

_COMPARISON = {
    "date": ("string", "Partition day D."),
    "status": ("string", "complete, or how many calls have matured (price metrics wait for them)."),
    "metric": ("string", "structure_score, judge_win_rate, hit_rate or mean_vs_spy_pct."),
    "policy": ("float", "The policy's value (judge: its win rate)."),
    "base": ("float", "The base model's value (judge: 1 - win rate)."),
    "difference": ("float", "policy - base (judge: win rate - 0.5)."),
    "ci_low": ("float", "Lower end of the 95% interval of the difference (judge: of the win rate)."),
    "ci_high": ("float", "Upper end of that interval."),
    "n": ("int", "Paired units: headlines with values on both sides (judge: decided pairs)."),
    "test": ("string", "The test and interval used, in words."),
    "p_value": ("float", "Two-sided p-value of that test."),
    "label": ("string", "better / no detectable difference / worse (interval against 0, or 0.5) / not enough data."),
    "policy_version": ("string", "Checkpoint D's version."),
    "look_ahead": (
        "bool",
        "The row's inputs held look-ahead notes (a policy trained on headlines after its notes' day): left out unless run config include_look_ahead.",
    ),
    "look_ahead_days": ("string", "Those notes' days and why, after 'left out:' or 'included:'; empty when none."),
}


EVALUATION_COLUMNS: dict[str, dict[str, tuple[str, str]]] = {
    # each *_COLUMN_SCHEMA: described beside the columns, in the module that writes the table
    "reward_ledger": LEDGER_COLUMN_SCHEMA,
    "price_training": PRICE_TRAINING_COLUMN_SCHEMA,
    "rollout_outcomes": {**_NOTE, **_CALL, **_OUTCOME},
    "policy_eval": _COMPARISON,
    "policy_preferences": PREFERENCE_COLUMN_SCHEMA,
    "backtest": {
        "date": (
            "string",
            "The book's entry session (every prediction day whose calls enter at its close joins it); the file's key.",
        ),
        "entry_date": ("string", "Session whose close the book enters at."),
        "exit_date": ("string", "Session whose close it exits at."),
        "policy_return_pct": ("float", "The policy book's return, net of 10 bps per unit of turnover, percent."),
        "base_return_pct": ("float", "The base book's return, net, percent."),
        "spy_return_pct": ("float", "SPY over the same sessions, percent."),
        "policy_turnover": ("float", "Sum of |weight change| from the previous book."),
        "base_turnover": ("float", "The same for the base book."),
        "policy_positions": ("int", "Headlines with a position in the policy book."),
        "base_positions": ("int", "Headlines with a position in the base book."),
        "excess_vs_base_pct": ("float", "policy - base, percentage points."),
        "excess_vs_spy_pct": ("float", "policy - SPY, percentage points."),
        "policy_equity": ("float", "Compounded equity of the policy book (start 1.0)."),
        "base_equity": ("float", "Compounded equity of the base book."),
        "spy_equity": ("float", "Compounded equity of SPY."),
        "look_ahead": (
            "bool",
            "The book holds look-ahead notes (only with run config include_look_ahead; by default their days are left out).",
        ),
    },
    "rollout_pairs": PAIR_COLUMN_SCHEMA,
}

# The prompt evolver's state (outcome_flywheel/daily_rl/policy/prompt_evolver.py): written by daily_update for day D.
PROMPT_EVOLVER_COLUMNS = {"prompt_evolver": VARIANT_COLUMN_SCHEMA, "prompt_experiences": EXPERIENCE_COLUMN_SCHEMA}
