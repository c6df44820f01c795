"""Features of one note for the online note scorer (docs/tiers.md, "Online note scorer").

A note's feature vector is two parts side by side:
- the frozen base model's last hidden state, mean-pooled over the note's tokens, L2-normalised and
  scaled down (HIDDEN_SCALE): many small numbers that carry what the text is about;
- structured features scaled up (STRUCTURE_SCALE): which of the six sections are present
  (structure.py), whether a call was parsed, whether it is on the headline's company (calls.py,
  relevance.py), its side, the note's length, and the headline's source (hashed into buckets).
The structured part is what the judge, prices and people reward most directly, so it gets the
larger scale: the low-rank layer can use it from the first update while the hidden part is learnt.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.notes.calls import calls_frame
from outcome_flywheel.daily_rl.notes.relevance import relevance_column
from outcome_flywheel.daily_rl.notes.structure import sections_present
from outcome_flywheel.models.prompts import NOTE_SECTIONS

HIDDEN_SCALE = 0.5  # the pooled hidden state has unit norm, then this: ~0.04 per dimension at H = 128
STRUCTURE_SCALE = 2.0  # each structured feature is 0..1, then this
SOURCE_BUCKETS = 8
MAX_NOTE_TOKENS = 256
LENGTH_NORM_CHARS = 4000  # log(1 + chars) / log(1 + this): ~1 for a long note
STRUCTURE_NAMES: tuple[str, ...] = (
    *(f"section_{s.lower().replace(' ', '_')}" for s in NOTE_SECTIONS),
    "call_parsed",
    "headline_names_company",
    "call_on_headline_company",
    "side_long",
    "side_short",
    "side_none",
    "length",
    *(f"source_bucket_{i}" for i in range(SOURCE_BUCKETS)),
)
FEATURES_TABLE = "note_features"  # the features of each day's notes, written by note_scorer(D)
FEATURE_COLUMNS = ["date", "headline_id", "rollout_index", "feature_spec", "features"]
NOTE_KEY = ("date", "headline_id", "rollout_index")


@dataclass(frozen=True)
class FeatureSpec:
    """What a feature vector is made of: its size and where its hidden part comes from. Stored with
    every row and with the scorer's state, so features of another spec are never mixed in."""

    hidden_size: int
    model_id: str  # the base model's fingerprint (local builds) or folder name

    @property
    def size(self) -> int:
        return self.hidden_size + len(STRUCTURE_NAMES)

    @property
    def key(self) -> str:
        return json.dumps(
            {
                "hidden_size": self.hidden_size,
                "model": self.model_id,
                "structure": len(STRUCTURE_NAMES),
                "hidden_scale": HIDDEN_SCALE,
                "structure_scale": STRUCTURE_SCALE,
            },
            sort_keys=True,
        )


def source_bucket(source: object) -> int:
    """A stable bucket of the headline's source name (feeds come and go, so no fixed vocabulary)."""
    text = source.strip().lower() if isinstance(source, str) else ""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") % SOURCE_BUCKETS


def structure_features(notes: pd.DataFrame, universe: Iterable[str] | None = None) -> np.ndarray:
    """`[n, len(STRUCTURE_NAMES)]` structured features (0..1, before scaling) of `notes`, which need
    `response`, `title`, `summary` and `source` (the headline's feed; may be empty)."""
    calls = calls_frame(notes[["response", "title", "summary"]].reset_index(drop=True), universe)
    relevance = relevance_column(calls).to_numpy()
    rows = []
    for k, (text, source) in enumerate(zip(notes["response"], notes["source"])):
        present = set(sections_present(text if isinstance(text, str) else ""))
        sections = [1.0 if s in present else 0.0 for s in NOTE_SECTIONS]
        side = calls["side"].iloc[k]
        rel = relevance[k]
        buckets = [0.0] * SOURCE_BUCKETS
        buckets[source_bucket(source)] = 1.0
        length = math.log1p(len(text) if isinstance(text, str) else 0) / math.log1p(LENGTH_NORM_CHARS)
        rows.append(
            [
                *sections,
                float(calls["parse_status"].iloc[k] == "ok"),
                float(rel == rel),
                float(rel == 1.0),
                float(side == "long"),
                float(side == "short"),
                float(side == "none"),
                min(length, 1.5),
                *buckets,
            ]
        )
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), len(STRUCTURE_NAMES))


class HiddenStates:
    """The frozen base model (transformers, CPU by default) that gives each note's pooled hidden state."""

    def __init__(self, model_dir: str | Path, device: str = "cpu"):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModel.from_pretrained(self.model_dir, dtype=torch.float32).to(device).eval()
        self.device = device
        info = self.model_dir / "build_info.json"
        fingerprint = json.loads(info.read_text()).get("fingerprint") if info.exists() else None
        self.spec = FeatureSpec(
            hidden_size=int(self.model.config.hidden_size), model_id=str(fingerprint or self.model_dir.name)
        )

    def pooled(self, texts: Sequence[str], batch_size: int = 16) -> np.ndarray:
        """`[n, H]` mean of the last hidden state over each text's tokens (at most MAX_NOTE_TOKENS), unit norm."""
        import torch

        out = []
        for start in range(0, len(texts), batch_size):
            ids = [
                self.tokenizer(t or " ", add_special_tokens=False)["input_ids"][:MAX_NOTE_TOKENS] or [0]
                for t in texts[start : start + batch_size]
            ]
            width = max(len(i) for i in ids)
            input_ids = torch.zeros(len(ids), width, dtype=torch.long)
            mask = torch.zeros(len(ids), width, dtype=torch.long)
            for row, seq in enumerate(ids):
                input_ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            with torch.no_grad():
                hidden = self.model(
                    input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device)
                ).last_hidden_state
            m = mask.to(hidden.device).unsqueeze(-1).float()
            mean = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
            out.append(torch.nn.functional.normalize(mean, dim=-1).cpu().numpy())
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.spec.hidden_size), np.float32)


def note_features(notes: pd.DataFrame, hidden: HiddenStates, universe: Iterable[str] | None = None) -> pd.DataFrame:
    """FEATURE_COLUMNS rows for `notes` (rollouts joined with their headline's `source`): the scaled
    hidden part and the scaled structured part as one float list per note."""
    if notes.empty:
        return pd.DataFrame(columns=FEATURE_COLUMNS)
    pooled = hidden.pooled([t if isinstance(t, str) else "" for t in notes["response"]]) * HIDDEN_SCALE
    structured = structure_features(notes, universe) * STRUCTURE_SCALE
    vectors = np.concatenate([pooled, structured], axis=1)
    return pd.DataFrame(
        {
            "date": notes["date"].astype(str).to_numpy(),
            "headline_id": notes["headline_id"].astype(str).to_numpy(),
            "rollout_index": notes["rollout_index"].astype(int).to_numpy(),
            "feature_spec": hidden.spec.key,
            "features": [v.tolist() for v in vectors],
        },
        columns=FEATURE_COLUMNS,
    )


def with_sources(rollouts: pd.DataFrame, headlines: pd.DataFrame) -> pd.DataFrame:
    """`rollouts` with each headline's feed `source` (empty where the headline row is gone)."""
    sources = (
        dict(zip(headlines["headline_id"], headlines["source"])) if len(headlines) and "source" in headlines else {}
    )
    return rollouts.assign(source=[sources.get(h, "") for h in rollouts["headline_id"]])


def feature_lookup(frame: pd.DataFrame, spec_key: str | None = None) -> dict[tuple[str, str, int], np.ndarray]:
    """(date, headline_id, rollout_index) -> feature vector, only rows of `spec_key` when given."""
    if frame.empty:
        return {}
    if spec_key is not None:
        frame = frame[frame["feature_spec"] == spec_key]
    return {
        (str(d), str(h), int(i)): np.asarray(v, dtype=np.float32)
        for d, h, i, v in zip(frame["date"], frame["headline_id"], frame["rollout_index"], frame["features"])
    }
