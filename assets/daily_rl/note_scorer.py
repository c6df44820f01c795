"""`note_scorer`: tier 1a, the online note scorer (docs/tiers.md, "Online note scorer")."""

from typing import Optional

import dagster as dg

from assets.catalog import COLUMNS, OWNERS, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.note_scorer.features import FEATURE_COLUMNS, FEATURES_TABLE
from outcome_flywheel.daily_rl.note_scorer.model import ScorerSettings
from outcome_flywheel.daily_rl.note_scorer.step import STEP as NOTE_SCORER_STEP
from outcome_flywheel.feedback.log import FeedbackLog
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.steps.codec import to_payload
from outcome_flywheel.storage import Warehouse
from resources.settings import mirrored, set_fields
from resources.steps import StepRunnerResource

# The table this asset writes, described beside it (assets.catalog.COLUMNS holds every table's columns).
COLUMNS[FEATURES_TABLE] = {
    "date": ("string", "The note's day (rollouts.date)."),
    "headline_id": ("string", "The headline (headlines.headline_id)."),
    "rollout_index": ("int", "Which of the headline's notes."),
    "feature_spec": (
        "string",
        "JSON: hidden size, base model fingerprint, scales; the scorer only uses rows of its own spec.",
    ),
    "features": (
        "list<float>",
        "The base model's pooled hidden state (unit norm x 0.5) then the structured features (x 2): "
        "sections, call parsed, on the headline's company, side, length, source bucket.",
    ),
}
FIELDS = ("rank", "hidden", "learning_rate", "margin", "grad_clip", "checkpoint_every", "seed")


class NoteScorerConfig(dg.Config):
    """Run config of `note_scorer`; a field left out takes the scorer's default."""

    rank: Optional[int] = mirrored(ScorerSettings, "rank", optional=True)
    hidden: Optional[int] = mirrored(ScorerSettings, "hidden", optional=True)
    learning_rate: Optional[float] = mirrored(ScorerSettings, "learning_rate", optional=True)
    margin: Optional[float] = mirrored(ScorerSettings, "margin", optional=True)
    grad_clip: Optional[float] = mirrored(ScorerSettings, "grad_clip", optional=True)
    checkpoint_every: Optional[int] = mirrored(ScorerSettings, "checkpoint_every", optional=True)
    seed: Optional[int] = mirrored(ScorerSettings, "seed", optional=True)

    def settings(self) -> ScorerSettings:
        return ScorerSettings(**set_fields(self, FIELDS))


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    # The day's judge ranks, the calls' price outcomes, the base model (the hidden-state features)
    # and its own state the day before (a re-run of D starts from D-1's state, never from `latest`).
    deps=[
        "rollouts",
        "rollout_scores",
        "rollout_outcomes",
        "base_model",
        dg.AssetDep("note_scorer", partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)),
    ],
    pool="duckdb",
    kinds={"pytorch", "safetensors", "parquet"},  # the state (safetensors) and the `note_features` table
    owners=OWNERS,
    metadata=table_metadata(FEATURES_TABLE, FEATURE_COLUMNS),
)
def note_scorer(
    context: dg.AssetExecutionContext,
    config: NoteScorerConfig,
    warehouse: dg.ResourceParam[Warehouse],
    model_backend: dg.ResourceParam[ModelLoader],
    feedback_log: dg.ResourceParam[FeedbackLog],
    market_data: dg.ResourceParam[MarketData],
    step_runner: StepRunnerResource,
):
    """The online note scorer after day D: a small PyTorch model (a low-rank layer over the note's
    features: the base model's pooled hidden state, scaled down, and structured features scaled up)
    that predicts how good a note is. Starting from its state after D-1 it takes D's new signals in
    a fixed order, one Adam step each on a pairwise margin-ranking loss within the headline's group:
    the judge's ranks (rollout_scores(D)), the prices that matured on D (rollout_outcomes), people's
    thumbs and stars on notes of D or earlier that the chain has not taken yet (the feedback log; the
    service steps the live state on each as it is posted, and the next day keeps it: each feedback once). Labels clipped to [0, 1] per event. Writes the
    features of D's notes (`note_features`), the state under checkpoints/note_scorer/ (days/D.safetensors, a
    checkpoint every 50 updates, `latest`); the metadata gives the held-out (test-then-train)
    pairwise accuracy against each source with a 95% bootstrap interval, against a constant
    scorer (0.5), and over time. A change of feature size or rank starts it afresh, and says so."""
    try:
        settings = config.settings()
    except ValueError as err:
        raise dg.Failure(str(err)) from err
    extras = {
        "warehouse": to_payload(warehouse),
        "models": to_payload(model_backend),
        "feedback_log": to_payload(feedback_log),
        "settings": to_payload(settings),
        "universe": sorted(market_data.universe()) if market_data is not None else None,
    }
    yield from step_runner.run_step(context, NOTE_SCORER_STEP, extras).get_results()
