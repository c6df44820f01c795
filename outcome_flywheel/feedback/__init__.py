"""People's feedback on the daily loop's notes: records (pydantic), the durable JSONL log, curation,
preference pairs and metrics (the service and the `note_feedback` / `feedback_pairs` assets use these)."""
