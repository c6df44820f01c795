"""Chat prompts shared by the tiny-local build and the daily loop (so the base model has seen
the prompt format it will be asked in)."""

from __future__ import annotations

NOTE_SECTIONS: tuple[str, ...] = (
    "Trade Recommendation",
    "Rationale",
    "Risk Factors",
    "Timeframe",
    "Position Size",
    "Stop Loss",
)

SYSTEM_PROMPT = "You are a markets analyst who writes short, actionable trading notes."


def trading_note_messages(title: str, summary: str = "") -> list[dict[str, str]]:
    """The prompt for one trading note about one headline; it asks for the six sections."""
    body = f"Headline: {title.strip()}"
    if summary and summary.strip():
        body += f"\nSummary: {summary.strip()}"
    body += "\nWrite a trading note with these sections: " + ", ".join(NOTE_SECTIONS) + "."
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": body}]
