"""What one day's update does: its settings (the `daily_update` run config is derived from them,
`RUN_CONFIG_PATHS`), their defaults, and the rule that checks the objective against the reward's signals."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from outcome_flywheel.daily_rl.partitions import DailyUpdateError
from outcome_flywheel.daily_rl.policy.gate import GateConfig
from outcome_flywheel.daily_rl.policy.prompt_evolver import EvolverConfig
from outcome_flywheel.daily_rl.reward.credit import CreditConfig
from outcome_flywheel.daily_rl.reward.matured import MaturedConfig
from outcome_flywheel.daily_rl.reward.signals import SIGNAL_SPANS, PriceReward, RewardConfig
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.models.train.gspo_config import GSPOConfig
from outcome_flywheel.settings import DEFAULTS, env

MATURED_FIELDS = {f.name: f for f in fields(MaturedConfig)}
TINY_LOCAL_MAX_NEW_TOKENS = 160  # tiny-local's notes end within ~80 tokens
DEFAULT_MAX_NEW_TOKENS = 512


@dataclass
class DailyUpdateSettings:
    """What one day's update does; the `daily_update` run config overrides any of these."""

    outcome_headlines_date: str | None = field(
        default=None,
        metadata={
            "help": (
                "Override re-run: score the previous day's rollouts against the headlines of this day (YYYY-MM-DD, must be "
                "materialised) instead of the partition's own day."
            )
        },
    )
    rollouts_per_headline: int | None = field(
        default=None,
        metadata={
            "help": (
                f"Notes sampled per headline; None = FLYWHEEL_ROLLOUTS_PER_HEADLINE (default {DEFAULTS['FLYWHEEL_ROLLOUTS_PER_HEADLINE']})."
            )
        },
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={
            "help": (
                f"Token budget per note; None = FLYWHEEL_MAX_NEW_TOKENS, else {DEFAULT_MAX_NEW_TOKENS} "
                f"({TINY_LOCAL_MAX_NEW_TOKENS} on tiny-local)."
            )
        },
    )
    gspo: GSPOConfig = field(
        default_factory=GSPOConfig,
        metadata={"help": "The GSPO trainer's settings (seed and temperature are set per day)."},
    )
    reward: RewardConfig = field(
        default_factory=RewardConfig, metadata={"help": "How each note's reward is made from its signals."}
    )
    gate: GateConfig = field(default_factory=GateConfig, metadata={"help": "The evaluation gate's thresholds."})
    kl_to_base_rollouts: int | None = field(
        default=None,
        metadata={
            "help": (
                "How many of D's notes the recorded kl_to_base is measured on (the first notes of every headline, spread "
                "evenly); None = all. Each measure is two forwards of its notes: minutes a day for a real model on a CPU."
            )
        },
    )
    price: PriceReward = field(
        default_factory=PriceReward,
        metadata={"help": "The price signal's transform and no_trade / unparseable values."},
    )
    max_staleness: int | None = field(
        default=None,
        metadata={
            "help": (
                "Most policy updates between a matured note's sampler and D's parent; None = FLYWHEEL_PRICE_MAX_STALENESS, else 4."
            )
        },
    )
    credit: CreditConfig = field(
        default_factory=CreditConfig,
        metadata={"help": "Which of the call's tokens the price and relevance parts train; relevance's baseline."},
    )
    price_baseline: str = field(default=MaturedConfig.baseline, metadata=MATURED_FIELDS["baseline"].metadata)
    price_replay_days: int = field(default=MaturedConfig.replay_days, metadata=MATURED_FIELDS["replay_days"].metadata)
    price_replay_decay: float = field(
        default=MaturedConfig.replay_decay, metadata=MATURED_FIELDS["replay_decay"].metadata
    )
    price_counterfactual_c: float = field(
        default=MaturedConfig.counterfactual_c, metadata=MATURED_FIELDS["counterfactual_c"].metadata
    )
    prompt_evolver: EvolverConfig = field(
        default_factory=EvolverConfig, metadata={"help": "The prompt evolver's bandit (tier 1b)."}
    )

    def __post_init__(self):
        if self.kl_to_base_rollouts is not None and self.kl_to_base_rollouts < 1:
            raise ValueError(f"kl_to_base_rollouts must be at least 1 or None, got {self.kl_to_base_rollouts}")

    def matured(self) -> MaturedConfig:
        """The delayed step's settings: the price transform, the staleness limit, the outcome horizon and cost."""
        stale = self.max_staleness if self.max_staleness is not None else int(env("FLYWHEEL_PRICE_MAX_STALENESS"))
        return MaturedConfig(
            price=self.price,
            max_staleness=stale,
            horizon=int(env("FLYWHEEL_OUTCOME_HORIZON")),
            cost_bps=float(env("FLYWHEEL_OUTCOME_COST_BPS")),
            baseline=self.price_baseline,
            replay_days=self.price_replay_days,
            replay_decay=self.price_replay_decay,
            span=self.credit.price_span,
            counterfactual_c=self.price_counterfactual_c,
        )

    def sized(self, models: ModelLoader) -> tuple[DailyUpdateSettings, int, int]:
        """(these settings, rollouts per headline, max new tokens) after the environment and the model's
        defaults. The gate's greedy probe is capped at the notes' own budget: past it the probe would
        judge text the policy never writes (nor trains on)."""
        n = self.rollouts_per_headline or int(env("FLYWHEEL_ROLLOUTS_PER_HEADLINE"))
        default_tokens = str(TINY_LOCAL_MAX_NEW_TOKENS if models.is_tiny_local else DEFAULT_MAX_NEW_TOKENS)
        tokens = self.max_new_tokens or int(env("FLYWHEEL_MAX_NEW_TOKENS", default_tokens))
        gate = replace(self.gate, probe_max_new_tokens=min(self.gate.probe_max_new_tokens, tokens))
        return replace(self, gate=gate), n, tokens


# The `daily_update` run config, flat: run-config field -> the `DailyUpdateSettings` field it overrides, as a
# dotted path into a nested section. The asset derives each field's type, default and help from that dataclass
# field, and the settings of a run from the fields given (resources/settings.py); a new setting a run may
# override is its dataclass field and one line here. None: the asset's own field (a full fine-tune sets
# gspo.lora to None, not a value of a LoRA field).
RUN_CONFIG_PATHS: dict[str, str | None] = {
    "outcome_headlines_date": "outcome_headlines_date",
    "rollouts_per_headline": "rollouts_per_headline",
    "max_new_tokens": "max_new_tokens",
    "objective": "gspo.objective",
    "learning_rate": "gspo.learning_rate",
    "batch_size": "gspo.batch_size",
    "epochs": "gspo.epochs",
    "kl_beta": "gspo.kl_beta",
    "kl_span": "gspo.kl_span",
    "kl_estimator": "gspo.kl_estimator",
    "frozen_span": "gspo.frozen_span",
    "epsilon_low": "gspo.epsilon_low",
    "epsilon_high": "gspo.epsilon_high",
    "full_fine_tune": None,
    "lora_r": "gspo.lora.r",
    "lora_alpha": "gspo.lora.alpha",
    "lora_target_modules": "gspo.lora.target_modules",
    "reward_weights": "reward.weights",
    "reward_clip_min": "reward.clip_min",
    "reward_clip_max": "reward.clip_max",
    "gate_enabled": "gate.enabled",
    "gate_max_kl_to_parent": "gate.max_kl_to_parent",
    "gate_max_kl_to_base": "gate.max_kl_to_base",
    "gate_max_probe_regression": "gate.max_probe_regression",
    "gate_probe_headlines": "gate.probe_headlines",
    "gate_kl_rollouts": "gate.kl_rollouts",
    "kl_to_base_rollouts": "kl_to_base_rollouts",
    "price_scale_pct": "price.scale_pct",
    "price_no_trade": "price.no_trade",
    "price_unparseable": "price.unparseable",
    "price_max_staleness": "max_staleness",
    "tis_cap": "gspo.tis_cap",
    "span_epochs": "gspo.span_epochs",
    "part_normaliser": "gspo.part_normaliser",
    "gradient_shares": "gspo.gradient_shares",
    "price_span": "credit.price_span",
    "relevance_span": "credit.relevance_span",
    "relevance_baseline": "credit.relevance_baseline",
    "relevance_counterfactual_c": "credit.relevance_counterfactual_c",
    "price_baseline": "price_baseline",
    "price_replay_days": "price_replay_days",
    "price_replay_decay": "price_replay_decay",
    "price_counterfactual_c": "price_counterfactual_c",
    "counterfactual_epochs": "gspo.counterfactual_epochs",
    "counterfactual_form": "gspo.counterfactual_form",
    "side_lean_anchor": "gspo.side_lean_anchor",
    "side_lean_target": "gspo.side_lean_target",
    "share_prompt_prefix": "gspo.share_prompt_prefix",
    "trim_unread_tail": "gspo.trim_unread_tail",
    "prompt_evolver_enabled": "prompt_evolver.enabled",
    "prompt_evolver_epsilon": "prompt_evolver.epsilon",
    "prompt_evolver_trials_per_variant": "prompt_evolver.trials_per_variant",
    "prompt_evolver_heldout_samples": "prompt_evolver.heldout_samples",
}


# A model's own defaults, in run-config fields: what its runs chose where DailyUpdateSettings' defaults (chosen on
# tiny-local by issue 46's ablation) did not serve it. A run config's fields override them; a model not named
# here (a hub id, a folder) keeps DailyUpdateSettings' defaults. docs/models.md, "SmolLM2's own defaults", gives
# the runs behind each value.
MODEL_RUN_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "smollm2-135m-instruct": {
        # The update goes to the call's name and side, the two parts the price worlds reward: structure and the
        # judge's rank carry no weight (SmolLM2 ignores the six sections either way: structure ~0.1).
        "reward_weights": {"structure": 0.0, "judge_rank": 0.0, "human": 0.5, "relevance": 1.0, "price": 1.0},
        # A company call's side against its own other side (with `loo` both sides were pushed up, Buy most).
        "price_baseline": "other_side",
        # The side's pair term sets most of the update's direction: at c = 1 it was one part among equals.
        "price_counterfactual_c": 20.0,
        "counterfactual_form": "centered_pair",
        # Single notes shuffled into a minibatch, so the pair's centre is over several headlines.
        "share_prompt_prefix": False,
        # One epoch: a day at 4 took 728 s against ~480 s at 1 on a 2-core CPU. 1e-3: at 3e-3 (relevance 0) the lean
        # to Buy grew on good and bad news alike and erased the news' conditioning.
        "learning_rate": 1e-3,
        "epochs": 1,
        # The gate's probe compares structure, which carries no weight here: on 4 headlines it refused updates on
        # noise (0.000 against 0.333). The KL bounds stay the safety net.
        "gate_max_probe_regression": 1.0,
        # Its runs had the evolver off: testing a candidate prompt added 120-220 s to a day on a 2-core CPU.
        "prompt_evolver_enabled": False,
    }
}


def model_run_defaults(base_model: str) -> dict[str, Any]:
    """dotted `DailyUpdateSettings` path -> value of each of `base_model`'s own defaults (`MODEL_RUN_DEFAULTS`);
    empty for a model that has none."""
    return {RUN_CONFIG_PATHS[name]: value for name, value in MODEL_RUN_DEFAULTS.get(base_model, {}).items()}


def check_objective(settings: DailyUpdateSettings) -> None:
    """A sequence-level objective spreads one advantage over the whole note: it cannot give the call's
    line alone what `price` and `relevance` say about it, so it trains whole-note signals only."""
    scoped = sorted(k for k, w in settings.reward.weights.items() if SIGNAL_SPANS[k] != "note" and float(w) != 0.0)
    if settings.gspo.objective != "token" and scoped:
        raise DailyUpdateError(
            f"objective {settings.gspo.objective!r} trains whole-note signals only, but {scoped} judge the trade call's line: "
            f"use objective 'token' (the default), or set their reward_weights to 0"
        )
