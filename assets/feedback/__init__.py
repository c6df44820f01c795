"""People's feedback on the daily notes: `note_feedback` (the log as a table) and `feedback_pairs`."""
