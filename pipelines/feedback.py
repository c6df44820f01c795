"""People's feedback on the daily notes: the log as a table per day, and the pairs it makes."""

import dagster as dg

from assets.feedback.note_feedback import feedback_pairs, note_feedback
from assets.partitions import daily_rl_partitions
from resources.feedback import FeedbackLogResource

FEEDBACK_ASSETS = [note_feedback, feedback_pairs]

note_feedback_job = dg.define_asset_job(
    "note_feedback_job",
    selection=dg.AssetSelection.assets(note_feedback),
    partitions_def=daily_rl_partitions,
    description="Validate the feedback log into note_feedback for the days whose notes got feedback (the service launches it).",
)

feedback_pairs_job = dg.define_asset_job(
    "feedback_pairs_job",
    selection=dg.AssetSelection.assets(feedback_pairs),
    description="Turn verified corrections and up/down ratings into preference pairs and export the new ones.",
)

defs = dg.Definitions(
    assets=dg.with_source_code_references(FEEDBACK_ASSETS),
    jobs=[note_feedback_job, feedback_pairs_job],
    resources={"feedback_log": FeedbackLogResource.from_env()},
)
