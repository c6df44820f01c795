"""Tier 1a: the online note scorer (docs/tiers.md, "Online note scorer").

A small PyTorch model, CPU, that predicts how good a note is from its features
(features.py): s(x) = v . gelu(B (A x) + c) + w . x + b, A a low-rank (rank r) map of the
features. It learns online: every event (a judge's ranks of a headline's notes, the matured prices of
a headline's calls, people's thumbs and stars) is one Adam step on a pairwise margin-ranking loss
within that headline's group, labels clipped to [0, 1] first (reward clipping per event) and the
gradient norm clipped. Before each step the event's pairs are scored by the current model: that
prequential (test-then-train) pairwise accuracy is the held-out measure, per source, against a
constant scorer (every pair a tie: 0.5).

State: weights, Adam's moments, the update count and the per-event accuracy history in one file.
`ScorerStore` keeps the asset's state after each day (`days/D.safetensors`, what a re-run of D+1 starts
from), a checkpoint every 50 updates (`steps/`), the service's online state (`live.safetensors`) and a `latest` pointer
to the newest of them, all written atomically. A state whose feature size, rank or feature spec
differs from what is asked starts afresh, with the reason recorded.
"""

from __future__ import annotations

import fcntl
import json
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from outcome_flywheel.storage import atomic_symlink, atomic_write_bytes

SOURCES = ("judge", "price", "people")
STATE_FORMAT = 1
SUFFIX = ".safetensors"
TIE = 1e-9


@dataclass(frozen=True)
class ScorerSettings:
    """How the online note scorer learns (run config of `note_scorer`)."""

    rank: int = field(
        default=64, metadata={"help": "Rank of the low-rank map of the features; a change starts the scorer afresh."}
    )
    hidden: int = field(default=128, metadata={"help": "Width of the layer after the low-rank map."})
    learning_rate: float = field(default=3e-3, metadata={"help": "Adam's learning rate (one step per event)."})
    margin: float = field(default=0.1, metadata={"help": "Margin of the pairwise ranking loss."})
    grad_clip: float = field(default=1.0, metadata={"help": "Gradient norm clip of each step."})
    checkpoint_every: int = field(
        default=50, metadata={"help": "Updates between checkpoints under steps/ (latest moves to each)."}
    )
    seed: int = field(default=0, metadata={"help": "Seeds the initial weights."})

    def __post_init__(self):
        if not (1 <= self.rank <= 512 and 1 <= self.hidden <= 1024):
            raise ValueError(f"scorer rank must be 1..512 and hidden 1..1024, got {self.rank} / {self.hidden}")
        for name in ("learning_rate", "margin", "grad_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"scorer {name} must be a finite number > 0, got {value}")
        if self.checkpoint_every < 1:
            raise ValueError(f"scorer checkpoint_every must be >= 1, got {self.checkpoint_every}")


@dataclass
class Event:
    """One learning signal on one headline's notes: labels in [0, 1] (clipped), higher = better."""

    source: str  # judge | price | people
    day: str  # the day the signal arrived (the asset partition that consumes it)
    group: str  # "<note date>/<headline_id>"
    keys: list[tuple[str, str, int]]  # (note date, headline_id, rollout_index) per note
    labels: np.ndarray
    clipped: int = 0  # labels that were outside [0, 1]
    event_id: str = ""  # people: the feedback's id (each is taken once: `ScorerState.applied_people`)

    def pairs(self) -> list[tuple[int, int, float]]:
        """(better, worse, label gap) over the group's notes whose labels differ."""
        y = self.labels
        return [(i, j, float(y[i] - y[j])) for i in range(len(y)) for j in range(len(y)) if y[i] - y[j] > TIE]


def clipped_event(source: str, day: str, group: str, keys: list, labels: Sequence[float], event_id: str = "") -> Event:
    raw = np.asarray(labels, dtype=np.float64)
    clipped = int(((raw < 0) | (raw > 1) | ~np.isfinite(raw)).sum())
    return Event(source, day, group, keys, np.clip(np.nan_to_num(raw, nan=0.5), 0.0, 1.0), clipped, event_id)


def _model(feature_dim: int, settings: ScorerSettings):
    import torch
    from torch import nn

    class NoteScorerModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Linear(feature_dim, settings.rank, bias=False)  # the low-rank map
            self.up = nn.Linear(settings.rank, settings.hidden)
            self.out = nn.Linear(settings.hidden, 1)
            self.linear = nn.Linear(feature_dim, 1)

        def forward(self, x):
            return (self.out(nn.functional.gelu(self.up(self.down(x)))) + self.linear(x)).squeeze(-1)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        return NoteScorerModel()


class ScorerState:
    """The scorer's weights, optimizer and record; `step(event)` measures, then learns."""

    def __init__(self, feature_dim: int, spec_key: str, settings: ScorerSettings, meta: dict | None = None):
        import torch

        self.settings = settings
        self.feature_dim = int(feature_dim)
        self.spec_key = spec_key
        self.model = _model(self.feature_dim, settings)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=settings.learning_rate)
        self.meta = meta or {
            "updates": 0,
            "events": 0,
            "clipped_labels": 0,
            "history": [],
            "fresh_start": None,
            "last_day": None,
        }

    @property
    def updates(self) -> int:
        return int(self.meta["updates"])

    @property
    def applied_people(self) -> set[str]:
        """Ids of the feedback this state has taken (a state saved before they were kept: none)."""
        return set(self.meta.get("applied_people", []))

    def parameters(self) -> int:
        return int(sum(p.numel() for p in self.model.parameters()))

    def scores(self, features: np.ndarray) -> np.ndarray:
        import torch

        if len(features) == 0:
            return np.zeros(0)
        self._check(features)
        with torch.no_grad():
            return self.model(torch.as_tensor(np.asarray(features, dtype=np.float32))).double().numpy()

    def _check(self, features: np.ndarray) -> None:
        if np.asarray(features).shape[-1] != self.feature_dim:
            raise ValueError(
                f"features have {np.asarray(features).shape[-1]} values, the scorer takes {self.feature_dim}"
            )

    def step(self, event: Event, features: np.ndarray) -> dict | None:
        """Score the event's pairs with the current weights (held out: not trained on yet), then one
        Adam step on them. None (nothing learnt) when the labels make no pair."""
        import torch

        pairs = event.pairs()
        if not pairs:
            return None
        self._check(features)
        x = torch.as_tensor(np.asarray(features, dtype=np.float32))
        better = torch.tensor([p[0] for p in pairs])
        worse = torch.tensor([p[1] for p in pairs])
        gap = torch.tensor([p[2] for p in pairs], dtype=torch.float32)
        self.model.train()
        s = self.model(x)
        diff = s[better] - s[worse]
        with torch.no_grad():
            correct = float(((diff > TIE).float() + 0.5 * (diff.abs() <= TIE).float()).mean())
        # Pairs weighted by how far apart their labels are: a 1st-vs-8th pair says more than 4th-vs-5th.
        loss = (gap * torch.relu(self.settings.margin - diff)).sum() / gap.sum()
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip))
        self.optimizer.step()
        self.model.eval()
        self.meta["updates"] += 1
        self.meta["events"] += 1
        self.meta["clipped_labels"] += int(event.clipped)
        record = {
            "update": self.updates,
            "day": event.day,
            "source": event.source,
            "group": event.group,
            "pairs": len(pairs),
            "accuracy": round(correct, 6),
            "loss": round(float(loss.detach()), 6),
            "grad_norm": round(grad_norm, 6),
        }
        self.meta["history"].append(record)
        return record

    def to_bytes(self) -> bytes:
        """The state as one safetensors file: weights and Adam's moments as tensors, the rest as its
        JSON metadata (no pickle: loading it runs no code)."""
        from safetensors.torch import save

        optimizer = self.optimizer.state_dict()
        tensors = {f"model.{k}": v.detach().contiguous() for k, v in self.model.state_dict().items()}
        for index, moments in optimizer["state"].items():
            for name, value in moments.items():
                tensors[f"optim.{index}.{name}"] = value.detach().reshape(value.shape).contiguous()
        header = {
            "format": STATE_FORMAT,
            "feature_dim": self.feature_dim,
            "spec_key": self.spec_key,
            "settings": asdict(self.settings),
            "param_groups": optimizer["param_groups"],
            "meta": self.meta,
        }
        return save(tensors, metadata={"note_scorer": json.dumps(header)})

    @classmethod
    def from_bytes(cls, data: bytes) -> "ScorerState":
        from safetensors.torch import load

        size = int.from_bytes(data[:8], "little")
        raw = json.loads(json.loads(data[8 : 8 + size])["__metadata__"]["note_scorer"])
        if raw.get("format") != STATE_FORMAT:
            raise ValueError(f"note scorer state format {raw.get('format')} is not {STATE_FORMAT}")
        tensors = load(data)
        state = cls(raw["feature_dim"], raw["spec_key"], ScorerSettings(**raw["settings"]), raw["meta"])
        state.model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")})
        moments: dict[int, dict] = {}
        for key, value in tensors.items():
            if key.startswith("optim."):
                _, index, name = key.split(".", 2)
                moments.setdefault(int(index), {})[name] = value
        state.optimizer.load_state_dict({"state": moments, "param_groups": raw["param_groups"]})
        state.model.eval()
        return state


def resume(
    previous: ScorerState | None, feature_dim: int, spec_key: str, settings: ScorerSettings
) -> tuple[ScorerState, str | None]:
    """`previous` carried on with `settings`' learning rate and margin, or a fresh state and why: no
    earlier state, or a different feature size, rank, width or feature spec (old weights do not fit)."""
    if previous is None:
        reason = "no earlier state"
    elif previous.feature_dim != feature_dim:
        reason = f"feature size changed {previous.feature_dim} -> {feature_dim}"
    elif (previous.settings.rank, previous.settings.hidden) != (settings.rank, settings.hidden):
        reason = f"rank/width changed {previous.settings.rank}/{previous.settings.hidden} -> {settings.rank}/{settings.hidden}"
    elif previous.spec_key != spec_key:
        reason = "feature spec changed (another base model or feature scaling)"
    else:
        previous.settings = settings
        for group in previous.optimizer.param_groups:
            group["lr"] = settings.learning_rate
        return previous, None
    state = ScorerState(feature_dim, spec_key, settings)
    old = (
        {"feature_dim": previous.feature_dim, "rank": previous.settings.rank, "updates": previous.updates}
        if previous
        else None
    )
    state.meta["fresh_start"] = {"reason": reason, "previous": old}
    return state, reason


class ScorerStore:
    """The scorer's files under `<data dir>/checkpoints/note_scorer/`, written atomically."""

    def __init__(self, data_dir: str | Path):
        self.root = Path(data_dir) / "checkpoints" / "note_scorer"

    def day_file(self, day: str) -> Path:
        return self.root / "days" / f"{day}{SUFFIX}"

    @property
    def latest(self) -> Path:
        return self.root / "latest"

    def days(self) -> list[str]:
        folder = self.root / "days"
        return sorted(p.name.removesuffix(SUFFIX) for p in folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []

    def load(self, path: Path) -> ScorerState:
        return ScorerState.from_bytes(path.read_bytes())

    def state_before(self, day: str, previous_day: str) -> ScorerState | None:
        """The asset's state as of `previous_day` (D-1); None before the first day. Earlier days
        without D-1 are an error: D's events would go on top of a state that missed some."""
        if self.day_file(previous_day).exists():
            return self.load(self.day_file(previous_day))
        earlier = [d for d in self.days() if d < day]
        if earlier:
            raise FileNotFoundError(
                f"note_scorer of {previous_day} is not materialised (the last earlier day is {earlier[-1]}): "
                "materialise the days in order (an asset backfill does)"
            )
        return None

    def _write(self, path: Path, state: ScorerState, move_latest: bool = True) -> Path:
        atomic_write_bytes(path, state.to_bytes())
        if move_latest:
            atomic_symlink(path, self.latest)
        return path

    def save_day(self, day: str, state: ScorerState, move_latest: bool = True) -> Path:
        return self._write(self.day_file(day), state, move_latest)

    def save_checkpoint(self, state: ScorerState, live: bool = False, move_latest: bool = True) -> Path:
        """`steps/step-NNNNNNNN.safetensors` (the service's: `live-steps/`)."""
        return self._write(
            self.root / ("live-steps" if live else "steps") / f"step-{state.updates:08d}{SUFFIX}", state, move_latest
        )

    def save_live(self, state: ScorerState) -> Path:
        return self._write(self.root / f"live{SUFFIX}", state)

    def load_latest(self) -> ScorerState | None:
        return self.load(self.latest.resolve()) if self.latest.exists() else None

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One writer at a time (the service's request threads and processes, the asset)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def learn(
    state: ScorerState,
    events: Sequence[Event],
    features: dict,
    store: ScorerStore | None = None,
    live: bool = False,
    move_latest: bool = True,
) -> dict:
    """Apply `events` in order (one step each; an event with a note without features is skipped and
    counted); a checkpoint every `checkpoint_every` updates when a store is given."""
    counts = {"events": len(events), "updates": 0, "no_pairs": 0, "no_features": 0, "clipped_labels": 0}
    for event in events:
        vectors = [features.get(k) for k in event.keys]
        if any(v is None for v in vectors):  # not taken: a later day, with the features, takes it
            counts["no_features"] += 1
            continue
        record = state.step(event, np.stack(vectors))
        if event.event_id:  # taken, a step or no pair to learn from: never again
            state.meta.setdefault("applied_people", []).append(event.event_id)
        if record is None:
            counts["no_pairs"] += 1
            continue
        counts["updates"] += 1
        counts["clipped_labels"] += event.clipped
        if store is not None and state.updates % state.settings.checkpoint_every == 0:
            store.save_checkpoint(state, live=live, move_latest=move_latest)
    return counts


def accuracy_summary(history: Sequence[dict], source: str, days: set[str] | None = None, seed: int = 0) -> dict:
    """Held-out (prequential) pairwise accuracy of `source`'s events: the mean over events, a 95%
    bootstrap interval over events (scipy.stats.bootstrap, BCa), a t-test against the constant
    scorer's 0.5, and the counts."""
    from scipy import stats

    values = np.array(
        [h["accuracy"] for h in history if h["source"] == source and (days is None or h["day"] in days)], dtype=float
    )
    pairs = int(sum(h["pairs"] for h in history if h["source"] == source and (days is None or h["day"] in days)))
    out = {
        "source": source,
        "events": int(len(values)),
        "pairs": pairs,
        "constant": 0.5,
        "accuracy": None,
        "ci_low": None,
        "ci_high": None,
        "p_value": None,
    }
    if len(values) == 0:
        return out
    out["accuracy"] = round(float(values.mean()), 4)
    if len(values) >= 3 and values.std() > 0:
        ci = stats.bootstrap(
            (values,),
            np.mean,
            n_resamples=2000,
            confidence_level=0.95,
            method="BCa",
            random_state=np.random.default_rng(seed),
        ).confidence_interval
        out["ci_low"], out["ci_high"] = round(float(ci.low), 4), round(float(ci.high), 4)
        out["p_value"] = float(stats.ttest_1samp(values, 0.5).pvalue)
    return out


def label(summary: dict) -> str:
    """What the interval says against the constant scorer."""
    if summary["accuracy"] is None:
        return "no events yet"
    if summary["ci_low"] is None:
        return "too few events for an interval"
    if summary["ci_low"] > 0.5:
        return "better than constant"
    if summary["ci_high"] < 0.5:
        return "worse than constant"
    return "no difference from constant"


def by_day(history: Sequence[dict]) -> list[dict]:
    """Per day and source: events and mean held-out accuracy (the accuracy over time)."""
    table: dict[tuple[str, str], list[float]] = {}
    for h in history:
        table.setdefault((h["day"], h["source"]), []).append(h["accuracy"])
    return [
        {"day": d, "source": s, "events": len(v), "accuracy": round(float(np.mean(v)), 4)}
        for (d, s), v in sorted(table.items())
    ]


def tier_summary(data_dir: str | Path) -> str:
    """One line on the scorer's state for the demo's summary."""
    store = ScorerStore(data_dir)
    if not store.latest.exists():
        return "note scorer: no state yet (materialise note_scorer)"
    state = store.load_latest()
    parts = []
    for source in SOURCES:
        s = accuracy_summary(state.meta["history"], source)
        if s["accuracy"] is None:
            continue
        interval = f" [{s['ci_low']:.2f}, {s['ci_high']:.2f}]" if s["ci_low"] is not None else ""
        parts.append(f"vs {source} {s['accuracy']:.2f}{interval} on {s['events']} events ({label(s)})")
    held = "; ".join(parts) or "no held-out events yet"
    return f"note scorer: {state.updates} updates, {state.parameters()} parameters, held-out pairwise accuracy {held} (constant 0.50)"


def describe_state(state: ScorerState) -> str:
    return json.dumps(
        {
            "updates": state.updates,
            "feature_dim": state.feature_dim,
            "rank": state.settings.rank,
            "hidden": state.settings.hidden,
            "parameters": state.parameters(),
        }
    )
