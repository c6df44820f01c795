"""Preference pairs as the outside trainers read them: one row builder per format, JSON Lines bytes.

Both loops export through these (the flywheel's `dpo_dataset`, the daily loop's `rollout_pairs`), so
a pair looks the same wherever it came from. Each format's row is (prompt messages, chosen text,
rejected text) -> dict; the assistant turn is a one-message list, as TRL's conversational format has it.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def trl_row(prompt: list[dict[str, str]], chosen: str, rejected: str) -> dict[str, Any]:
    """TRL conversational preference format (DPOTrainer)."""
    return {"prompt": prompt, "chosen": _assistant(chosen), "rejected": _assistant(rejected)}


def nemo_rl_row(prompt: list[dict[str, str]], chosen: str, rejected: str) -> dict[str, Any]:
    """NeMo-RL PreferenceDataset: lower rank is preferred."""
    return {
        "context": prompt,
        "completions": [{"rank": 0, "completion": _assistant(chosen)}, {"rank": 1, "completion": _assistant(rejected)}],
    }


def openai_row(prompt: list[dict[str, str]], chosen: str, rejected: str) -> dict[str, Any]:
    """Together / OpenAI preference fine-tuning format."""
    return {
        "input": {"messages": prompt},
        "preferred_output": _assistant(chosen),
        "non_preferred_output": _assistant(rejected),
    }


EXPORT_FORMATS = {"trl": trl_row, "nemo_rl": nemo_rl_row, "openai": openai_row}


def jsonl_bytes(rows: Iterable[Mapping[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
