"""`ModelServer`: the trained models kept loaded for the OpenAI-compatible endpoint, swapped while it runs.

Two model ids:
- `policy`: the daily loop's latest accepted policy checkpoint (`checkpoints/policy/latest`);
- `preference`: the base model with the latest preference adapter (`adapters/preference/latest`).

Each request resolves the model's `latest` pointer (a symlink read and a small JSON file, no weights).
When it names other weights than the loaded ones, the new model is loaded under a lock and becomes
the one later requests get; a request already generating holds its own reference to the old model
and finishes on it (the old one is freed when its last request lets go). No restart.

Only verified, accepted policy weights are served. `latest` moves only after a day's blocking checks
pass (`checkpoint.json` `verified: true`), but a re-run of that day republishes the folder unverified
under the same pointer: such a checkpoint is skipped for the newest verified one before it. A day
the gate rejected republishes its parent's files with the parent's `policy_version`, so its weights
are the parent's and nothing is reloaded; a rejected checkpoint that claims other weights is skipped.

Plain Python: the layout of the checkpoints is read here, not imported from the areas that write it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from outcome_flywheel.models.interface import Messages, SamplingConfig

if TYPE_CHECKING:
    from outcome_flywheel.models.interface import ModelBackend
    from outcome_flywheel.models.loader import ModelLoader

CHECKPOINTS = ("checkpoints", "policy")  # as outcome_flywheel.daily_rl.report.status.CHECKPOINTS
ADAPTERS = ("adapters", "preference")  # as outcome_flywheel.preferences.status.ADAPTERS_DIR
CHECKPOINT_FILE = "checkpoint.json"
MODEL_IDS = ("policy", "preference")


class ModelUnavailable(RuntimeError):
    """The model id is known but has nothing servable yet (no verified checkpoint, no adapter)."""


@dataclass(frozen=True)
class Candidate:
    """What a model id's `latest` names now: the weights to serve, before any are loaded."""

    model_id: str
    version: str  # shown to clients (system_fingerprint): policy_version, or preference:<run>@<digest>
    weights: str  # what identifies the weights: a change means a reload
    folder: Path  # checkpoint or adapter folder
    kind: str  # base | lora | full | adapter
    info: dict = field(default_factory=dict, compare=False)


@dataclass
class LoadedModel:
    """One loaded model. `lock`: one generation at a time on it (a backend's sampler keeps state)."""

    candidate: Candidate
    backend: "ModelBackend"
    loaded_at: float
    load_s: float
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def version(self) -> str:
        return self.candidate.version


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of turn) or "length" (the token budget)
    version: str
    seconds: float


def read_checkpoint(folder: Path) -> dict | None:
    try:
        return json.loads((Path(folder) / CHECKPOINT_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None  # absent, or caught mid-publish: not servable


def servable(info: dict | None) -> bool:
    """Verified by the day's checks, and either accepted (or not trained) by the gate, or a rejected
    day's republished parent (its weights are the parent's: same policy_version)."""
    if not info or info.get("verified") is not True or "policy_version" not in info:
        return False
    return info.get("gate") != "rejected" or info.get("policy_version") == info.get("parent_version")


def _weights_of(policy_version: str) -> str:
    """The weights part of a policy_version: `D@<digest>` names the same weights on every day that
    did not change them ("base" for the base model)."""
    return policy_version.split("@", 1)[1] if "@" in policy_version else policy_version


def checkpoint_folders(root: Path) -> list[str]:
    """Published checkpoint folders, newest name first: dated days (`2025-11-04`) and the tiers' own
    (`2025-11-04.distill-<run>`, after its parent day); staging and replaced folders start with a dot."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        (
            p.name
            for p in root.iterdir()
            if p.is_dir() and not p.is_symlink() and not p.name.startswith(".") and (p / CHECKPOINT_FILE).exists()
        ),
        reverse=True,
    )


def latest_policy(root: Path) -> Candidate | None:
    """The checkpoint `latest` names if servable, else the newest servable one named before it."""
    root = Path(root)
    link = root / "latest"
    if not link.exists():
        return None
    newest = link.resolve().name
    for name in [newest] + [n for n in checkpoint_folders(root) if n < newest]:
        info = read_checkpoint(root / name)
        if servable(info):
            version = info["policy_version"]
            return Candidate(
                "policy",
                version,
                f"{info.get('kind')}:{_weights_of(version)}",
                root / name,
                info.get("kind", "lora"),
                info,
            )
    return None


def adapter_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(Path(folder).glob("*.safetensors")):
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


class ModelServer:
    """The served models, resolved per request and loaded on change. Thread-safe: requests call
    `generate` from a thread pool."""

    def __init__(self, loader: "ModelLoader", data_root: Path, max_tokens: int = 512):
        self.loader = loader
        self.checkpoints = Path(data_root).joinpath(*CHECKPOINTS)
        self.adapters = Path(data_root).joinpath(*ADAPTERS)
        self.max_tokens = max_tokens
        self._loaded: dict[str, LoadedModel] = {}
        self._locks = {m: threading.Lock() for m in MODEL_IDS}  # one load at a time per model id
        self._state_lock = threading.Lock()
        self._in_flight: dict[str, int] = {}  # version -> requests generating on it (an old one's too, after a swap)
        self._digests: dict[tuple, str] = {}  # adapter stamp -> digest (hash the files once per change)
        self.loads: list[dict] = []  # every load: model, version, seconds, the version it replaced

    # -- resolving -------------------------------------------------------------------------------
    def _latest_adapter(self) -> Candidate | None:
        link = self.adapters / "latest"
        if not link.exists():
            return None
        folder = link.resolve()
        try:
            stamp = (str(folder),) + tuple(
                (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.glob("*.safetensors"))
            )
        except FileNotFoundError:
            return None
        if len(stamp) == 1:
            return None
        if stamp not in self._digests:
            self._digests[stamp] = adapter_digest(folder)
        digest = self._digests[stamp]
        return Candidate("preference", f"preference:{folder.name}@{digest}", digest, folder, "adapter")

    def resolve(self, model_id: str) -> Candidate:
        """What `model_id` would serve now (KeyError: an unknown id; ModelUnavailable: nothing yet)."""
        if model_id not in MODEL_IDS:
            raise KeyError(model_id)
        if model_id == "policy":
            found = latest_policy(self.checkpoints)
            if found is None:
                raise ModelUnavailable(
                    f"no verified, accepted policy checkpoint under {self.checkpoints} yet "
                    "(the daily_update asset writes them)"
                )
            return found
        found = self._latest_adapter()
        if found is None:
            raise ModelUnavailable(
                f"no preference adapter under {self.adapters} yet (the preference_adapter asset trains it)"
            )
        return found

    def available(self) -> list[Candidate]:
        out = []
        for model_id in MODEL_IDS:
            try:
                out.append(self.resolve(model_id))
            except ModelUnavailable:
                pass
        return out

    # -- loading ---------------------------------------------------------------------------------
    def _load(self, candidate: Candidate) -> "ModelBackend":
        if candidate.kind == "base":
            return self.loader.load()
        if candidate.kind in ("lora", "adapter"):
            return self.loader.load(adapter_path=candidate.folder)
        if candidate.kind == "full":
            return self.loader.load(model_path=candidate.folder, master_weights=True)
        raise ValueError(f"unknown checkpoint kind {candidate.kind!r} in {candidate.folder}")

    def model(self, model_id: str) -> LoadedModel:
        """The loaded model for `model_id`, loading the newly published weights first when `latest` moved."""
        candidate = self.resolve(model_id)
        current = self._loaded.get(model_id)
        if current is not None and current.candidate.weights == candidate.weights:
            return current
        with self._locks[model_id]:  # the first request after a move loads; the others wait for it
            current = self._loaded.get(model_id)
            if current is not None and current.candidate.weights == candidate.weights:
                return current
            started = time.perf_counter()
            backend = self._load(candidate)
            if backend.name == "torch":
                backend.model.requires_grad_(False)  # served, never trained here: no autograd state kept
            loaded = LoadedModel(candidate, backend, time.time(), time.perf_counter() - started)
            self._loaded[model_id] = loaded  # later requests get it; in-flight ones keep the old
            self.loads.append(
                {
                    "model": model_id,
                    "version": candidate.version,
                    "seconds": round(loaded.load_s, 3),
                    "replaced": current.version if current else None,
                }
            )
            return loaded

    # -- generating ------------------------------------------------------------------------------
    def context_length(self, loaded: LoadedModel) -> int | None:
        return getattr(loaded.backend, "context_length", None)

    def generate(
        self,
        model_id: str,
        messages: Messages,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> Completion:
        """One completion of `messages` on the model `model_id` serves now. ValueError: a request the
        model cannot take (over the token cap or its context), with the reason."""
        loaded = self.model(model_id)  # this reference keeps the weights alive until the reply
        prompt_ids = loaded.backend.prompt_ids(messages)
        budget = self._budget(loaded, len(prompt_ids), max_tokens)
        config = SamplingConfig(
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=budget,
            prompts_per_batch=1,
            ignore_eos=ignore_eos,
        )
        started = time.perf_counter()
        with self._state_lock:
            self._in_flight[loaded.version] = self._in_flight.get(loaded.version, 0) + 1
        try:
            with loaded.lock:
                sample = loaded.backend.sample([messages], 1, config, seeds=[self._seed(seed)])[0][0]
        finally:
            with self._state_lock:
                self._in_flight[loaded.version] -= 1
                if not self._in_flight[loaded.version]:
                    del self._in_flight[loaded.version]
        return Completion(
            sample.text,
            len(prompt_ids),
            len(sample.token_ids),
            "stop" if sample.finished else "length",
            loaded.version,
            time.perf_counter() - started,
        )

    def _budget(self, loaded: LoadedModel, n_prompt: int, max_tokens: int | None) -> int:
        if max_tokens is not None and max_tokens > self.max_tokens:
            raise ValueError(
                f"max_tokens={max_tokens} is over this server's cap of {self.max_tokens} tokens (FLYWHEEL_SERVE_MAX_TOKENS)"
            )
        context = self.context_length(loaded)
        room = context - n_prompt if context else None
        if room is not None and room < 1:
            raise ValueError(f"the messages take {n_prompt} tokens: the model's context is {context}")
        if max_tokens is None:
            return min(self.max_tokens, room) if room is not None else self.max_tokens
        if room is not None and max_tokens > room:
            raise ValueError(
                f"the messages take {n_prompt} tokens and max_tokens={max_tokens}: over the model's context of {context} tokens"
            )
        return max_tokens

    @staticmethod
    def _seed(seed: int | None) -> int:
        if seed is None:
            return int.from_bytes(hashlib.sha256(str(time.time_ns()).encode()).digest()[:4], "big")
        return seed % (2**31)

    def loaded(self, model_id: str) -> LoadedModel | None:
        """The model in memory for `model_id` (None before its first request)."""
        return self._loaded.get(model_id)

    def in_flight(self) -> dict[str, int]:
        """Requests generating now, by the version they run on (the old one's too, during a swap)."""
        with self._state_lock:
            return dict(self._in_flight)


def tier_summary(data_dir: str | Path) -> str:
    """One line: what `/v1/chat/completions` would serve from `data_dir` now."""
    server = ModelServer(loader=None, data_root=Path(data_dir))  # resolving only: nothing is loaded
    parts = []
    for model_id in MODEL_IDS:
        try:
            parts.append(f"{model_id} = {server.resolve(model_id).version}")
        except ModelUnavailable:
            parts.append(f"{model_id}: none yet")
    days = checkpoint_folders(server.checkpoints)
    infos = [read_checkpoint(server.checkpoints / d) or {} for d in days]
    rejected = sum(1 for i in infos if i.get("gate") == "rejected")
    unverified = sum(1 for i in infos if i.get("verified") is not True)
    return (
        f"serving (/v1/chat/completions, hot swap on `latest`): {'; '.join(parts)} "
        f"({len(days)} policy checkpoints: {rejected} rejected (their parent served instead), {unverified} unverified (never served))"
    )


__all__: Sequence[str] = (
    "ModelServer",
    "ModelUnavailable",
    "Candidate",
    "LoadedModel",
    "Completion",
    "latest_policy",
    "servable",
    "tier_summary",
)
