"""Chat prompts shared by the tiny-local build and the daily loop (so the base model has seen
the prompt format it will be asked in)."""

from __future__ import annotations

from outcome_flywheel.settings import NOTE_FORMATS, env

NOTE_SECTIONS: tuple[str, ...] = (
    "Trade Recommendation",
    "Rationale",
    "Risk Factors",
    "Timeframe",
    "Position Size",
    "Stop Loss",
)

SYSTEM_PROMPT = "You are a markets analyst who writes short, actionable trading notes."
# `prompt_version` of notes sampled under SYSTEM_PROMPT (the prompt evolver's base variant; the
# baseline, the gate's probe and the A/B always use it).
BASE_PROMPT_VERSION = "base"


# FLYWHEEL_NOTE_FORMAT. `sections` asks for the six sections (what tiny-local is built on). `call_first` also asks
# the note to open on its call: SmolLM2-135M-Instruct writes prose about the company under `sections` and calls it
# in 1 note of 32, in 8 of 32 when asked this way (docs/models.md), and a price reward needs calls to train.
CALL_FIRST_LINE = "Begin with the line 'Trade Recommendation: Buy <ticker>' or 'Trade Recommendation: Sell <ticker>'."


def trading_note_messages(title: str, summary: str = "", note_format: str | None = None) -> list[dict[str, str]]:
    """The prompt for one trading note about one headline; it asks for the six sections."""
    return note_messages(title, summary, SYSTEM_PROMPT, note_format)


def note_messages(
    title: str, summary: str = "", system: str = SYSTEM_PROMPT, note_format: str | None = None
) -> list[dict[str, str]]:
    """`trading_note_messages` under another system prompt (a variant of the prompt evolver); `note_format`
    None = FLYWHEEL_NOTE_FORMAT."""
    note_format = note_format or env("FLYWHEEL_NOTE_FORMAT")
    if note_format not in NOTE_FORMATS:
        raise ValueError(f"note format {note_format!r} is not one of {', '.join(NOTE_FORMATS)}")
    body = f"Headline: {title.strip()}"
    if summary and summary.strip():
        body += f"\nSummary: {summary.strip()}"
    body += "\nWrite a trading note with these sections: " + ", ".join(NOTE_SECTIONS) + "."
    if note_format == "call_first":
        body += " " + CALL_FIRST_LINE
    return [{"role": "system", "content": system}, {"role": "user", "content": body}]


def with_base_system(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The same note prompt under the base system prompt (the baseline's twin of an evolved prompt)."""
    return [{**m, "content": SYSTEM_PROMPT} if m["role"] == "system" else m for m in messages]


JUDGE_LETTERS = "ABCDEFGH"
JUDGE_SYSTEM_PROMPT = "You judge trading notes against what happened next. You answer with one letter."


def judge_messages(
    prediction_headline: str,
    outcome_headlines: list[str],
    candidates: list[str],
    letters: str = JUDGE_LETTERS,
    max_candidate_chars: int | None = 360,
    strict: bool = False,
    context_heading: str = "What happened next:",
) -> list[dict[str, str]]:
    """Ask which candidate note proved most useful given the next day's headlines.

    `candidates[i]` is shown under `letters[i]`, whitespace collapsed; `max_candidate_chars` cuts
    long notes (tiny-local's training prompts); the daily judge passes None and cuts them to a token
    budget beforehand (`daily_rl/judge/prompt_budget.py`). `strict=True` is the greedy retry's wording.
    """
    if len(candidates) > len(letters):
        raise ValueError(f"at most {len(letters)} candidates")
    lines = [f"Notes written about: {prediction_headline.strip()}", "", context_heading]
    lines += [f"- {h.strip()}" for h in outcome_headlines] or ["- (no headlines)"]
    lines += ["", "Candidates:"]
    for letter, text in zip(letters, candidates):
        body = " ".join(text.split())
        if max_candidate_chars is not None and len(body) > max_candidate_chars:
            body = body[:max_candidate_chars].rstrip() + " ..."
        lines.append(f"[{letter}] {body}")
    valid = f"{letters[0]}-{letters[len(candidates) - 1]}"
    lines.append("")
    if strict:
        lines.append(f"Reply with exactly one letter ({valid}) and nothing else.")
    else:
        lines.append(f"Which candidate was the most useful given what happened? Answer with one letter ({valid}).")
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]
