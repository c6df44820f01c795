"""Column descriptions of the feedback area's tables (merged into `assets/catalog.py`)."""

FEEDBACK_TABLE_COLUMNS: dict[str, dict[str, tuple[str, str]]] = {
    "note_feedback": {
        "feedback_id": ("string", "Id of the feedback line (32 hex)."),
        "date": ("string", "The notes' partition day D (rollouts.date)."),
        "headline_id": ("string", "rollouts.headline_id of the note."),
        "rollout_index": ("int", "rollouts.rollout_index of the note."),
        "thumbs": ("string", "up / down, or empty."),
        "stars": ("float", "1-5, or empty."),
        "human_score": (
            "float",
            "The human signal in [0, 1]: thumbs up 1 / down 0, stars (s-1)/4, their mean; empty without either.",
        ),
        "correction": ("string", "What the reviewer says the note should have said (as written)."),
        "reviewer": ("string", "Who gave the feedback."),
        "created_at": ("string", "When the service appended it (UTC, ISO 8601)."),
        "status": (
            "string",
            "none (no correction), unverified, approved, edited or rejected: the latest curator verdict.",
        ),
        "verified_correction": ("string", "The correction a curator approved, or their edit; empty otherwise."),
        "curator": ("string", "Who gave the latest verdict."),
        "verified_at": ("string", "When (UTC)."),
    },
    "note_feedback_quarantine": {
        "line": ("int", "Line number in the feedback log."),
        "raw": ("string", "The line as written (first 2,000 characters)."),
        "reason": ("string", "Why it was not accepted."),
    },
    "feedback_pairs": {
        "pair_id": ("string", "Stable id (hash of the source and the notes)."),
        "source": (
            "string",
            "correction (a verified correction over the note) or thumbs (an up-rated over a down-rated note).",
        ),
        "date": ("string", "The notes' day."),
        "headline_id": ("string", "The notes' headline."),
        "prompt": ("string", "The notes' chat prompt, JSON."),
        "chosen": ("string", "Preferred completion."),
        "rejected": ("string", "The other completion."),
        "chosen_rollout_index": ("int", "The preferred note's index; -1 for a correction."),
        "rejected_rollout_index": ("int", "The other note's index."),
        "feedback_ids": ("string", "The feedback lines behind the pair, JSON."),
        "exported_at": (
            "string",
            "The export (exports/feedback_pairs/<id>/) that held the pair; empty until exported.",
        ),
    },
}
