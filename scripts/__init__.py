"""Command-line tools: the demo, sample-data generators, status and style score."""

# Run config that keeps Dagster's per-event console log to warnings, for the demo: every event
# is still recorded in the instance and shown in the UI.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
