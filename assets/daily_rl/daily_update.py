"""`daily_update`: the daily outcome RL step as one non-subsettable multi-asset.

The loop is a cycle (policy -> rollouts -> scores -> policy). Dagster accepts a cycle only as an
asset depending on its own earlier partition, so all three keys live in one multi-asset and each
depends on the day's `headlines` and on its own previous partition (docs/daily_rl.md, "Why one
multi-asset": other shapes break asset backfills or run days out of order). The work itself is
`outcome_flywheel.daily_rl.day.run_daily_update` (score, train, generate, verify), run by the
step process `outcome_flywheel.daily_rl.day_step` where the `step_runner` resource says
(docs/pipes.md); its metadata and checks come back through Dagster Pipes.
"""

import dagster as dg
import pydantic
from pydantic import Field
from pydantic.fields import FieldInfo

from assets.catalog import MODEL_KINDS, OWNERS, TABLE_KINDS, check_specs, column_names, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.day_settings import (
    MODEL_RUN_DEFAULTS,
    RUN_CONFIG_PATHS,
    DailyUpdateSettings,
    model_run_defaults,
)
from outcome_flywheel.daily_rl.day_step import STEP as DAILY_UPDATE_STEP
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.daily_rl.partitions import previous_day
from outcome_flywheel.daily_rl.policy.prompt_tables import VARIANT_COLUMNS
from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_COLUMNS
from outcome_flywheel.daily_rl.policy.verify import DAILY_UPDATE_CHECKS
from outcome_flywheel.daily_rl.reward.matured import longest_wait_days
from outcome_flywheel.daily_rl.reward.rollout_scores import SCORE_COLUMNS
from outcome_flywheel.daily_rl.reward.signals import REWARD_SIGNALS, RewardConfig
from outcome_flywheel.daily_rl.worlds.prices import judge_outcome_titles, world_prices_path
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.settings import env
from outcome_flywheel.steps.codec import to_payload
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from resources.settings import field_default, nested_dataclass, run_config_fields, run_config_overrides
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
    "policy_checkpoint": table_metadata(
        "policy_training", column_names("policy_training")
    ),  # also writes reward_ledger, price_training
    "rollouts": table_metadata("rollouts", ROLLOUT_COLUMNS),
    "prompt_evolver": table_metadata("prompt_evolver", VARIANT_COLUMNS),  # also writes prompt_experiences
}


class _DailyUpdateConfigBase(dg.Config):
    """What `DailyUpdateConfig` does with its fields (declared below, from `RUN_CONFIG_PATHS`)."""

    def settings(self, base_model: str) -> DailyUpdateSettings:
        """The day's settings: each field given overrides its `DailyUpdateSettings` field; the rest keep
        `base_model`'s own defaults (`MODEL_RUN_DEFAULTS`), else the dataclasses'."""
        overrides = model_run_defaults(base_model) | run_config_overrides(self, RUN_CONFIG_PATHS)
        if self.full_fine_tune:  # no LoRA adapter: its rank and alpha do not apply
            overrides = {k: v for k, v in overrides.items() if not k.startswith("gspo.lora.")} | {"gspo.lora": None}
        return nested_dataclass(DailyUpdateSettings, overrides)


# LoraSettings (outcome_flywheel/models/) carries no help, and reward_weights names each signal.
RUN_CONFIG_DESCRIPTIONS = {
    "lora_r": f"LoRA rank. Default: {field_default(LoraSettings, 'r')} (LoraSettings).",
    "lora_alpha": f"LoRA alpha (scale = alpha / r). Default: {field_default(LoraSettings, 'alpha')} (LoraSettings).",
    "lora_target_modules": (
        "Linear layers of each block a fresh LoRA adapter wraps (PEFT's target_modules; an adapter carried from the "
        "parent keeps its own, and a warning says so when they differ). "
        f"Default: {list(field_default(LoraSettings, 'target_modules'))} (LoraSettings)."
    ),
    "reward_weights": (
        f"Weight of each named reward signal ({', '.join(f'{k}: {v}' for k, v in REWARD_SIGNALS.items())}). "
        f"Default: {dict(RewardConfig().weights)} (RewardConfig); recorded in rollout_scores."
    ),
}


def with_model_defaults(fields: dict) -> dict:
    """`fields` with each description naming the models that have a default of their own for it (the launchpad
    shows a field's description, and a left-out field takes the base model's own default)."""
    described = {}
    for name, (hint, info) in fields.items():
        own = [f"{model}: {defaults[name]!r}" for model, defaults in MODEL_RUN_DEFAULTS.items() if name in defaults]
        if own:  # a FieldInfo made anew (pydantic builds the model from the attributes a Field was given)
            text = f"{info.description} Own default of {'; '.join(own)} (MODEL_RUN_DEFAULTS)."
            info = FieldInfo.merge_field_infos(info, description=text)
        described[name] = (hint, info)
    return described


# Run config of `daily_update`: its fields derived from `RUN_CONFIG_PATHS` and the dataclass fields they override.
DailyUpdateConfig = pydantic.create_model(
    "DailyUpdateConfig",
    __base__=_DailyUpdateConfigBase,
    __module__=__name__,
    __doc__=(
        "Run config of `daily_update`; a field left out falls back to the base model's own defaults "
        "(`MODEL_RUN_DEFAULTS`: smollm2-135m-instruct has some), else to `DailyUpdateSettings` / `GSPOConfig`."
    ),
    **with_model_defaults(
        run_config_fields(
            DailyUpdateSettings,
            RUN_CONFIG_PATHS,
            descriptions=RUN_CONFIG_DESCRIPTIONS,
            own={
                "full_fine_tune": (
                    bool,
                    Field(default=False, description="Train every weight instead of a LoRA adapter."),
                )
            },
        )
    ),
)


@dg.multi_asset(
    name="daily_update",
    specs=[
        dg.AssetSpec(
            # Every key has the same deps (an asset backfill refuses keys of different shapes): the day's
            # headlines, the base model (the first policy and the frozen judge), itself the day before.
            key,
            deps=[
                dg.AssetDep("headlines"),
                dg.AssetDep("base_model"),
                dg.AssetDep(key, partition_mapping=EARLIER_DAYS),
            ],
            partitions_def=daily_rl_partitions,
            group_name="daily_rl",
            description=_DESCRIPTIONS[key],
            kinds=MODEL_KINDS if key == "policy_checkpoint" else TABLE_KINDS,
            owners=OWNERS,
            metadata=_TABLES[key],
        )
        for key in KEYS
    ],
    partitions_def=daily_rl_partitions,
    can_subset=False,
    pool="accelerator",
    check_specs=check_specs(DAILY_UPDATE_CHECKS),  # declared beside the code that computes them
)
def daily_update(
    context: dg.AssetExecutionContext,
    config: DailyUpdateConfig,
    warehouse: dg.ResourceParam[Warehouse],
    model_backend: dg.ResourceParam[ModelLoader],
    judge: dg.ResourceParam[Judge],
    market_data: dg.ResourceParam[MarketData],
    step_runner: StepRunnerResource,
    tracking: dg.ResourceParam[Tracker],
):
    """Score yesterday's rollouts with the judge, train the policy with GSPO (on them and on earlier
    notes whose price matured), generate today's rollouts: as a step process (`step_runner`), whose
    metadata and checks come back through Dagster Pipes; the step records the day in MLflow (`tracking`)."""
    try:
        settings = config.settings(model_backend.base_model)
    except ValueError as err:  # a bad run config (reward weights, gate thresholds): refused before any process starts
        raise dg.Failure(str(err)) from err
    own = model_run_defaults(model_backend.base_model)
    if own:
        context.log.info(f"{model_backend.base_model}'s own defaults, under the run config's fields: {own}")
    extras = {
        "warehouse": to_payload(warehouse),
        "models": to_payload(model_backend),
        "judge": to_payload(judge),
        "market_data": to_payload(market_data) if market_data is not None else None,
        "settings": to_payload(settings),
        "tracking": to_payload(tracking),
        "follow_ups": world_follow_ups(warehouse, market_data, context.partition_key),
    }
    # The whole day is one step: one process start (torch and the model load once) per partition.
    yield from step_runner.run_step(context, DAILY_UPDATE_STEP, extras).get_results()


def world_follow_ups(warehouse: Warehouse, market_data: MarketData | None, day: str) -> list[str] | None:
    """What the judge of D is shown as "what happened next" in a synthetic world: the world's own follow-ups
    of the companies D-1's notes were written on (`worlds.prices.judge_outcome_titles`: the archive's real
    headlines say nothing about a world's planted moves). None for real prices: the day reads the outcome
    day's headlines itself. Made here, so the day's recipe is given its context and never imports `worlds/`."""
    if market_data is None or market_data.source != "file" or world_prices_path(market_data.prices_file) is None:
        return None
    prediction_day = previous_day(day)
    prev = warehouse.read("rollouts", prediction_day) if warehouse.exists("rollouts", prediction_day) else None
    return (
        judge_outcome_titles(market_data.prices_file, prev, prediction_day) if prev is not None and len(prev) else None
    )
