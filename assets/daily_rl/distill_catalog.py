"""Column descriptions of tier 3's table (`distill_samples`), merged into `assets/catalog.py`'s COLUMNS."""

DISTILLATION_COLUMNS: dict[str, dict[str, tuple[str, str]]] = {
    "distill_samples": {
        "sample_id": (
            "string",
            "Stable id: hash of the source, day, headline, phase and teacher (a re-run writes the same rows).",
        ),
        "date": (
            "string",
            "Partition day D: the teacher answered D's selected headlines (or D-1's confident groups judged on D).",
        ),
        "source": ("string", "teacher (a teacher's trace) or correction (a person's verified correction)."),
        "phase": (
            "string",
            "Curriculum phase: answer (prompt -> answer), reasoning (prompt -> think block), consistency (prompt + think block -> answer).",
        ),
        "headline_id": ("string", "The headline the sample answers."),
        "prompt": ("string", "The chat messages (JSON) the sample answers: the note-writing prompt."),
        "prefix": (
            "string",
            "Text the assistant turn starts with, read but not learned (the think block in consistency samples).",
        ),
        "completion": ("string", "What the student learns to write: the only tokens with a loss."),
        "teacher": (
            "string",
            "FLYWHEEL_TEACHER_MODEL's value when the sample came from a teacher; people for corrections.",
        ),
        "why": (
            "string",
            "Why the headline was picked: random 15%, a confident judged group (best - median reward), or a verified correction.",
        ),
    }
}
