"""Project tools that need Dagster or maintain the bundled data: the demo, backfills, sample-data generators
(the method's own command line is the `flywheel` console script, `outcome_flywheel/cli.py`)."""

# Run config that keeps Dagster's per-event console log to warnings, for the demo: every event
# is still recorded in the instance and shown in the UI.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
