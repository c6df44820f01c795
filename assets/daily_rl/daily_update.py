"""`daily_update`: the daily outcome RL step as one non-subsettable multi-asset.

The loop is a cycle (policy -> rollouts -> scores -> policy). Dagster accepts a cycle only as an
asset depending on its own earlier partition, so all three keys live in one multi-asset and each
depends on the day's `headlines` and on its own previous partition (docs/daily_rl.md, "Why one
multi-asset": other shapes break asset backfills or run days out of order). The work itself is
`outcome_flywheel.daily_rl.day.run_daily_update` (score, train, generate, verify), run by the
step process `outcome_flywheel.steps.daily_update` where the `step_runner` resource says
(docs/pipes.md); its metadata and checks come back through Dagster Pipes.
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from assets.catalog import MODEL_KINDS, OWNERS, TABLE_KINDS, column_names, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.policy.gate import GateConfig
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_COLUMNS
from outcome_flywheel.daily_rl.reward.rollout_scores import SCORE_COLUMNS
from outcome_flywheel.daily_rl.reward.matured import longest_wait_days
from outcome_flywheel.daily_rl.policy.prompt_evolver import VARIANT_COLUMNS, EvolverConfig
from outcome_flywheel.daily_rl.reward.signals import REWARD_SIGNALS, PriceReward, RewardConfig
from outcome_flywheel.daily_rl.day import DailyUpdateSettings
from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.train.gspo_config import GSPOConfig
from outcome_flywheel.settings import env
from outcome_flywheel.steps.codec import to_payload
from outcome_flywheel.storage import Warehouse
from resources.settings import field_default, mirrored, set_fields
from resources.steps import StepRunnerResource

KEYS = ("rollout_scores", "policy_checkpoint", "rollouts", "prompt_evolver")
# The body reads D-1 (rollouts to score, the parent) and every earlier day whose notes' prices can
# mature by D: the longest wait from a note's day to its exit close on the XNYS calendar. One mapping
# per key (Dagster refuses two deps on one key); an asset backfill still runs the days in order.
PRICE_WINDOW_DAYS = longest_wait_days(int(env("FLYWHEEL_OUTCOME_HORIZON")))
EARLIER_DAYS = dg.TimeWindowPartitionMapping(start_offset=-PRICE_WINDOW_DAYS, end_offset=-1)

_DESCRIPTIONS = {
    "rollout_scores": "Yesterday's rollouts scored against today's headlines: judge rank (iterative A-H selection), "
                      "rank reward, structure score, reward = 0.5/0.5 mix, group-normalised advantage, usable flag.",
    "policy_checkpoint": "The policy of day D: yesterday's checkpoint trained with GSPO on today's usable scores and on "
                         "earlier days' notes whose price matured by D (truncated IS, staleness limit; LoRA by default), "
                         "saved under checkpoints/policy/D/ with `latest` moved atomically. Each day's training is recorded "
                         "as one row of the table `policy_training` (its columns below), what each note trained on in "
                         "`reward_ledger` and the delayed step in `price_training`.",
    "rollouts": "Notes sampled by today's checkpoint for each of today's headlines (8 each by default; temperature 0.8, "
                "top-p 0.95, top-k 50), with the sampled token ids and per-token behaviour log-probs at the sampling "
                "temperature (log-softmax of logits / T, before top-k/top-p): the behaviour policy GSPO uses as pi_old. "
                "Each headline's group is written under the system prompt the prompt evolver picked (`prompt_version`; the "
                "stored `prompt` is what GSPO trains on, so its ratio uses the prompt the note was sampled under).",
    "prompt_evolver": "The prompt evolver's state of day D (tier 1b): a UCB1 bandit (epsilon-greedy 0.1) over variants of the "
                      "note-writing system prompt, one row per variant with its pulls, mean reward and 95% interval. A trial is one "
                      "headline's group; its reward the group's mean reward once scored. A candidate is written every 25 trials and "
                      "adopted only if not worse than the best on the last 50 scored headlines (`prompt_experiences`, also written). "
                      "The baseline, the gate's probe and the A/B keep the base prompt.",
}


# Column schema shown per key: the table each key writes (policy_checkpoint: its record `policy_training`).
_TABLES = {
    "rollout_scores": table_metadata("rollout_scores", SCORE_COLUMNS),
    "policy_checkpoint": table_metadata("policy_training", column_names("policy_training")),  # also writes reward_ledger, price_training
    "rollouts": table_metadata("rollouts", ROLLOUT_COLUMNS),
    "prompt_evolver": table_metadata("prompt_evolver", VARIANT_COLUMNS),  # also writes prompt_experiences
}


class DailyUpdateConfig(dg.Config):
    """Run config of `daily_update`; a field left out falls back to `DailyUpdateSettings` / `GSPOConfig`."""

    outcome_headlines_date: Optional[str] = mirrored(DailyUpdateSettings, "outcome_headlines_date")
    rollouts_per_headline: Optional[int] = mirrored(DailyUpdateSettings, "rollouts_per_headline")
    max_new_tokens: Optional[int] = mirrored(DailyUpdateSettings, "max_new_tokens")
    objective: Optional[str] = mirrored(GSPOConfig, "objective", optional=True)
    learning_rate: Optional[float] = mirrored(GSPOConfig, "learning_rate", optional=True)
    batch_size: Optional[int] = mirrored(GSPOConfig, "batch_size", optional=True)
    epochs: Optional[int] = mirrored(GSPOConfig, "epochs", optional=True)
    kl_beta: Optional[float] = mirrored(GSPOConfig, "kl_beta", optional=True)
    epsilon_low: Optional[float] = mirrored(GSPOConfig, "epsilon_low", optional=True)
    epsilon_high: Optional[float] = mirrored(GSPOConfig, "epsilon_high", optional=True)
    full_fine_tune: bool = Field(default=False, description="Train every weight instead of a LoRA adapter.")
    lora_r: Optional[int] = Field(default=None, description=f"LoRA rank. Default: {field_default(LoraSettings, 'r')} (LoraSettings).")
    lora_alpha: Optional[int] = Field(default=None, description=f"LoRA alpha (scale = alpha / r). Default: {field_default(LoraSettings, 'alpha')} (LoraSettings).")
    reward_weights: Optional[dict[str, float]] = Field(default=None, description=(
        f"Weight of each named reward signal ({', '.join(f'{k}: {v}' for k, v in REWARD_SIGNALS.items())}). "
        f"Default: {dict(RewardConfig().weights)} (RewardConfig); recorded in rollout_scores."
    ))
    reward_clip_min: Optional[float] = mirrored(RewardConfig, "clip_min", optional=True)
    reward_clip_max: Optional[float] = mirrored(RewardConfig, "clip_max", optional=True)
    gate_enabled: Optional[bool] = mirrored(GateConfig, "enabled", optional=True)
    gate_max_kl_to_parent: Optional[float] = mirrored(GateConfig, "max_kl_to_parent", optional=True)
    gate_max_kl_to_base: Optional[float] = mirrored(GateConfig, "max_kl_to_base", optional=True)
    gate_max_probe_regression: Optional[float] = mirrored(GateConfig, "max_probe_regression", optional=True)
    gate_probe_headlines: Optional[int] = mirrored(GateConfig, "probe_headlines", optional=True)
    price_scale_pct: Optional[float] = mirrored(PriceReward, "scale_pct", optional=True)
    price_no_trade: Optional[float] = mirrored(PriceReward, "no_trade", optional=True)
    price_unparseable: Optional[float] = mirrored(PriceReward, "unparseable", optional=True)
    price_max_staleness: Optional[int] = mirrored(DailyUpdateSettings, "max_staleness")
    tis_cap: Optional[float] = mirrored(GSPOConfig, "tis_cap", optional=True)
    prompt_evolver_enabled: Optional[bool] = mirrored(EvolverConfig, "enabled", optional=True)
    prompt_evolver_epsilon: Optional[float] = mirrored(EvolverConfig, "epsilon", optional=True)
    prompt_evolver_trials_per_variant: Optional[int] = mirrored(EvolverConfig, "trials_per_variant", optional=True)
    prompt_evolver_heldout_samples: Optional[int] = mirrored(EvolverConfig, "heldout_samples", optional=True)

    def settings(self) -> DailyUpdateSettings:
        lora = None if self.full_fine_tune else LoraSettings(**{k: v for k, v in (("r", self.lora_r), ("alpha", self.lora_alpha)) if v is not None})
        gspo = GSPOConfig(**set_fields(self, ("objective", "learning_rate", "batch_size", "epochs", "tis_cap", "kl_beta", "epsilon_low", "epsilon_high")), lora=lora)
        price = PriceReward(**{k.removeprefix("price_"): v for k, v in set_fields(
            self, ("price_scale_pct", "price_no_trade", "price_unparseable")).items()})
        reward = RewardConfig(**{k.removeprefix("reward_"): v for k, v in set_fields(self, ("reward_weights", "reward_clip_min", "reward_clip_max")).items()})
        gate = GateConfig(**{k.removeprefix("gate_"): v for k, v in set_fields(
            self, ("gate_enabled", "gate_max_kl_to_parent", "gate_max_kl_to_base", "gate_max_probe_regression", "gate_probe_headlines")).items()})
        evolver = EvolverConfig(**{k.removeprefix("prompt_evolver_"): v for k, v in set_fields(self, (
            "prompt_evolver_enabled", "prompt_evolver_epsilon", "prompt_evolver_trials_per_variant", "prompt_evolver_heldout_samples")).items()})
        return DailyUpdateSettings(
            **set_fields(self, ("outcome_headlines_date", "rollouts_per_headline", "max_new_tokens")), gspo=gspo, reward=reward, gate=gate,
            price=price, max_staleness=self.price_max_staleness, prompt_evolver=evolver,
        )


def _check(key: str, name: str, description: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(name, asset=key, blocking=True, description=description)


@dg.multi_asset(
    name="daily_update",
    specs=[
        dg.AssetSpec(
            # Every key has the same deps (an asset backfill refuses keys of different shapes): the day's
            # headlines, the base model (the first policy and the frozen judge), itself the day before.
            key, deps=[dg.AssetDep("headlines"), dg.AssetDep("base_model"), dg.AssetDep(key, partition_mapping=EARLIER_DAYS)],
            partitions_def=daily_rl_partitions, group_name="daily_rl", description=_DESCRIPTIONS[key],
            kinds=MODEL_KINDS if key == "policy_checkpoint" else TABLE_KINDS, owners=OWNERS, metadata=_TABLES[key],
        )
        for key in KEYS
    ],
    partitions_def=daily_rl_partitions,
    can_subset=False,
    pool="accelerator",
    check_specs=[
        _check("rollout_scores", "ranks_are_permutations", "Each headline's ranks are a permutation of 1..N."),
        _check("rollout_scores", "rewards_in_range", "Every structure score and rank reward is in [0, 1], every reward inside its recorded clip range."),
        _check("policy_checkpoint", "loads_and_generates", "The saved checkpoint loads from disk and writes text."),
        _check("rollouts", "generated_by_own_checkpoint", "Every rollout of D carries checkpoint D's policy_version."),
        dg.AssetCheckSpec(
            "update_accepted_by_gate", asset="policy_checkpoint", blocking=False,
            description="The evaluation gate accepted D's update (a WARN when it rejected it: the parent's weights stay D's "
                        "checkpoint and the day goes on; policy_training.gate_reason says why).",
        ),
    ],
)
def daily_update(
    context: dg.AssetExecutionContext,
    config: DailyUpdateConfig,
    warehouse: dg.ResourceParam[Warehouse],
    model_backend: dg.ResourceParam[ModelLoader],
    judge: dg.ResourceParam[Judge],
    market_data: dg.ResourceParam[MarketData],
    step_runner: StepRunnerResource,
):
    """Score yesterday's rollouts with the judge, train the policy with GSPO (on them and on earlier
    notes whose price matured), generate today's rollouts: as a step process (`step_runner`), whose
    metadata and checks come back through Dagster Pipes."""
    try:
        settings = config.settings()
    except ValueError as err:  # a bad run config (reward weights, gate thresholds): refused before any process starts
        raise dg.Failure(str(err)) from err
    extras = {
        "warehouse": to_payload(warehouse), "models": to_payload(model_backend), "judge": to_payload(judge),
        "market_data": to_payload(market_data) if market_data is not None else None, "settings": to_payload(settings),
    }
    # The whole day is one step: one process start (torch and the model load once) per partition.
    yield from step_runner.run_step(context, "daily_update", extras).get_results()
