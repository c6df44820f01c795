"""The framework-neutral model backend interface.

A backend holds one policy: a base model, optionally with a LoRA adapter on top. Prompts are
chat messages; the backend renders them with the tokenizer's chat template. Everything that
crosses the interface is plain Python / NumPy, so assets never import torch or mlx.

The trainers are written once for both frameworks (`gspo.py`, `dpo.py`, `sft.py`; their Config dataclasses
in `gspo_config.py`, `dpo_config.py`, `sft_config.py`); a backend lends them its log-prob functions
(`batch_logprobs`, `sequence_logps`) and its `framework` (`Framework`: losses, loop, seeding).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Sequence

import numpy as np

Messages = list[dict[str, str]]  # [{"role": "user", "content": "..."}]
THINK_TOKENS = ("<think>", "</think>")  # Qwen3's reasoning block


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 50
    max_new_tokens: int = 128
    prompts_per_batch: int = 32  # prompts sampled in one forward batch: batch rows = prompts_per_batch * n
    # The chat template's `enable_thinking` (Qwen3). Off: the prompt closes an empty think block and the think
    # tokens are never sampled, so a note never holds one. On: the judge may reason first; its answer follows.
    enable_thinking: bool = False
    # Always write `max_new_tokens` (benchmarks at a fixed load, as vLLM's `ignore_eos`).
    ignore_eos: bool = False


@dataclass
class Sample:
    """One sampled completion: its text, token ids and the log-probability of each token under
    the policy at the sampling temperature T (log-softmax of logits / T, before top-k / top-p;
    temperature 1 for greedy), as TRL's GRPO and verl define the behaviour log-probs: what GSPO
    needs as pi_old and what teacher forcing at T (`response_logprobs(..., temperature=T)`)
    reproduces."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finished: bool  # ended with an end-of-turn token rather than the length cap


@dataclass(frozen=True)
class LoraSettings:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    # Attention and MLP projections of Qwen-style blocks.
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self):
        targets = self.target_modules
        if isinstance(targets, str) or not all(isinstance(t, str) and t for t in targets) or not targets:
            raise ValueError(f"LoRA target_modules must be a non-empty list of module names, got {targets!r}")
        object.__setattr__(self, "target_modules", tuple(targets))  # a run config's list, hashable like the default


@dataclass
class TrainStats:
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_loss(self) -> float:
        return float(np.mean(self.losses)) if self.losses else float("nan")

    @property
    def micro_batches(self) -> int:
        """Forward-backward parts over every step and rank (`shards.plan_figures`); no plan: one a step."""
        return int(self.extra.get("micro_batches", self.steps))

    @property
    def layers_recomputed(self) -> bool:
        """Whether the memory plan recomputed the decoder layers in the backward pass (`memory.py`)."""
        return bool(self.extra.get("recompute", False))

    def record(self, loss: float, grad_norm: float, metrics: Mapping[str, float]) -> None:
        """One optimiser step: its loss, its gradient norm before clipping, its metrics (as lists in `extra`)."""
        self.steps += 1
        self.losses.append(float(loss))
        self.grad_norms.append(float(grad_norm))
        for name, value in metrics.items():
            self.extra.setdefault(name, []).append(float(value))


@dataclass(frozen=True)
class Accumulated:
    """One optimiser step over a minibatch in parts (gradient accumulation, `memory.py`): the step's loss and
    gradient are sum_k scales[k] * loss(part k), each part scaled to its share of the minibatch (the trainers')."""

    parts: tuple
    scales: tuple


def step_parts(batch: Any) -> tuple[tuple, tuple]:
    """(parts, scales) of one optimiser step: an `Accumulated` batch's, or the batch whole."""
    return (batch.parts, batch.scales) if isinstance(batch, Accumulated) else ((batch,), (1.0,))


def merged_metrics(scaled: Sequence[tuple[float, Mapping[str, float]]]) -> dict[str, float]:
    """The step's metrics from its parts': the scale-weighted mean (scales add up to 1), least `*_min`, most `*_max`."""
    if len(scaled) == 1:
        return {k: float(v) for k, v in scaled[0][1].items()}
    merged: dict[str, float] = {}
    for scale, metrics in scaled:
        for name, value in metrics.items():
            value = float(value)
            if name.endswith("_min"):
                merged[name] = min(merged.get(name, value), value)
            elif name.endswith("_max"):
                merged[name] = max(merged.get(name, value), value)
            else:
                merged[name] = merged.get(name, 0.0) + scale * value
    return merged


@dataclass(frozen=True)
class Framework:
    """What a framework lends the shared trainers (`gspo.py`, `dpo.py`), one per framework
    (`torch/training.py`, `mlx/training.py`) and reached as `backend.framework`. The trainers'
    batching plan, seeding and pi_old choice are theirs; the framework supplies only these."""

    name: str
    seed: Callable[[int], Any]  # seeds the generator that LoRA init (and dropout) draw from
    inference: Callable[[Any], ContextManager]  # backend -> no autograd, eval mode, restored after
    to_numpy: Callable[[Any], np.ndarray]
    as_array: Callable[[Any, np.ndarray], Any]  # (backend, array) -> the framework's array on its device
    gspo_loss: Callable[..., tuple[Any, dict]]
    weighted_dpo_loss: Callable[..., tuple[Any, dict]]
    adamw: Callable[..., Any]  # (model, learning_rate) -> optimiser of the trainable parameters
    train: Callable[
        ..., "TrainStats"
    ]  # (model, optimizer, *, loss, iterate_batches, max_grad_norm); a batch may be `Accumulated`
    sft_loss: Callable[..., tuple[Any, dict]] | None = None  # (logp, mask) -> completion-only NLL (sft.py)
    # (logp, side_mask, coefficients, normaliser) -> the counterfactual side term (train/counterfactual.py)
    side_probability_loss: Callable[..., tuple[Any, dict]] | None = None
    side_pair_loss: Callable[..., tuple[Any, dict]] | None = None  # the counterfactual term's `pair` form
    side_lean_loss: Callable[..., tuple[Any, dict]] | None = None  # the side pairs' lean anchor and target
    exact_kl_loss: Callable[..., tuple[Any, dict]] | None = None  # (kl [N], beta, Z) -> train/exact_kl.py's term
    # AdamW's moments kept across days beside the checkpoint (`ModelBackend.optimizer_tensors`):
    # (optimizer, model) -> {"<weight name as saved>.exp_avg" / ".exp_avg_sq": float32, "step": int64 []},
    # the names those of the checkpoint's files (PEFT adapter keys, or transformers names for full
    # weights), so either framework resumes the other's state.
    optimizer_state: Callable[[Any, Any], dict[str, np.ndarray]] | None = None
    # (optimizer, model, tensors) -> None: into a fresh `adamw(model, lr)` before its first step;
    # ValueError naming the mismatch when the parameters differ (the caller keeps fresh moments).
    load_optimizer_state: Callable[[Any, Any, Mapping[str, np.ndarray]], None] | None = None
    # backend -> bytes the accelerator has free now, None where there is no such figure (the CPU)
    free_memory: Callable[[Any], int | None] | None = None
    # backend -> bytes of the weights that train now (a LoRA adapter, or every weight): what their
    # gradients and AdamW moments take (`train/memory.py`)
    trainable_bytes: Callable[[Any], int] | None = None
    # float32 logits one chunk of the head's log-softmax holds (`logprobs.CHUNK_ELEMENTS`): a fixed
    # part of a training step's memory (`train/memory.py`); None: not counted
    logit_chunk_elements: int | None = None
    # float32 copies of one chunk's logits alive at once in the head's backward pass, as the framework
    # computes the chosen token's log-prob (its `logprobs.py`; `train/memory.head_bytes`)
    head_chunk_copies: int = 4
    # Data parallelism (torch under torchrun, `torch/training.py`): () -> (rank, world size) of the
    # initialised process group ((0, 1) without one), and obj -> every rank's obj in rank order. None: the
    # framework trains in one process only (mlx) and the trainers refuse WORLD_SIZE > 1 (`train/shards.py`).
    world: Callable[[], tuple[int, int]] | None = None
    gather: Callable[[Any], list] | None = None
    # (model, loss, batch) -> the L2 norm of the gradient of `loss` over `batch` (an `Accumulated` step or
    # one part) w.r.t. the trainable weights, which are left without gradients: how much a reward part
    # pulls (gspo.py's gradient shares). None: not measured.
    gradient_norm: Callable[[Any, Callable, Any], float] | None = None


class ModelBackend(ABC):
    """One loaded policy. Implementations: `TorchBackend`, `MLXBackend`."""

    name: str = "abstract"
    # batch_logprobs(shared_prefix=True) runs each distinct prompt once (torch); else every row whole (mlx)
    runs_shared_prefix: bool = False
    # `recomputing` recomputes the layers' activations in the backward pass (train/memory.py's plan)
    recomputes_layers: bool = False
    framework: Framework
    model_path: Path
    adapter_path: Path | None
    # (model folder, adapter folder or None) holding exactly the weights in memory; None once they
    # change in memory (a fresh adapter, training) until saved: an external engine (vLLM) can
    # serve the policy only from files.
    weights_on_disk: tuple[Path, Path | None] | None = None
    # In a subfolder: the weights' digest (`policy_version`) and engines that load every top-level
    # *.safetensors of a model folder (vLLM) see the weights only.
    OPTIMIZER_STATE_FILE = "optimizer/optimizer_state.safetensors"
    _optimizer_tensors: dict[str, np.ndarray] | None = None
    _optimizer_file: Any = None  # the loaded checkpoint's OPTIMIZER_STATE_FILE, opened, not yet read

    def weights_saved_as(self, folder: Path) -> None:
        """The weights in memory are now the checkpoint folder `folder` (an adapter, or full weights)."""
        self.weights_on_disk = (self.model_path, Path(folder)) if self.has_adapter else (Path(folder), None)

    @property
    def optimizer_tensors(self) -> dict[str, np.ndarray] | None:
        """AdamW's state (`Framework.optimizer_state`) of this policy: the loaded checkpoint's
        OPTIMIZER_STATE_FILE (None: it has none) until set; `save` writes it beside the weights.
        The file is opened (memory-mapped) at load and read on first use, so a full model's
        moments (2 x its fp32 weights) cost nothing to a process that only samples, and a
        checkpoint replaced on disk meanwhile does not change what this load sees."""
        if self._optimizer_file is not None:
            handle, self._optimizer_file = self._optimizer_file, None
            self._optimizer_tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        return self._optimizer_tensors

    @optimizer_tensors.setter
    def optimizer_tensors(self, tensors: Mapping[str, np.ndarray] | None) -> None:
        self._optimizer_file = None
        self._optimizer_tensors = None if tensors is None else dict(tensors)

    def read_optimizer_tensors(self, folder: Path | None) -> None:
        """At load: `optimizer_tensors` from the checkpoint folder's OPTIMIZER_STATE_FILE, None without one."""
        self.optimizer_tensors = None
        file = Path(folder) / self.OPTIMIZER_STATE_FILE if folder is not None else None
        if file is not None and file.exists():
            from safetensors import safe_open

            self._optimizer_file = safe_open(str(file), framework="numpy")

    def write_optimizer_tensors(self, folder: Path) -> None:
        """OPTIMIZER_STATE_FILE beside the weights `save` writes into `folder` (the caller makes the
        folder appear at once: staging, then rename); a stale one is removed when there is none."""
        file = Path(folder) / self.OPTIMIZER_STATE_FILE
        if self.optimizer_tensors is None:
            file.unlink(missing_ok=True)
            if file.parent.is_dir() and not any(file.parent.iterdir()):
                file.parent.rmdir()
            return
        from safetensors.numpy import save_file

        file.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: np.asarray(v, order="C") for k, v in self.optimizer_tensors.items()},
            str(file),
            metadata={"format": "np"},
        )

    # -- text and tokens ----------------------------------------------------------------
    @abstractmethod
    def prompt_ids(self, messages: Messages, enable_thinking: bool = False) -> list[int]:
        """Token ids of the chat-rendered prompt, generation prompt included (the template's
        `enable_thinking`: Qwen3 closes an empty think block when it is off)."""

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str: ...

    @abstractmethod
    def encode_response(self, text: str) -> list[int]:
        """Token ids of a response as the model would emit it (end-of-turn appended)."""

    # -- inference ----------------------------------------------------------------------
    def sample(
        self, prompts: Sequence[Messages], n: int, config: SamplingConfig, seeds: Sequence[int]
    ) -> list[list[Sample]]:
        """`n` completions per prompt, batched; `seeds[i]` makes prompt i's samples reproducible."""
        if len(seeds) != len(prompts):
            raise ValueError("one seed per prompt")
        out: list[list[Sample]] = []
        step = max(1, config.prompts_per_batch)
        with self._sampling_context():
            for start in range(0, len(prompts), step):
                chunk = [self.prompt_ids(p, config.enable_thinking) for p in prompts[start : start + step]]
                out.extend(self._sample_batch(chunk, n, config, seeds[start : start + step]))
        return out

    @abstractmethod
    def _sample_batch(
        self, prompt_ids: list[list[int]], n: int, config: SamplingConfig, seeds: Sequence[int]
    ) -> list[list[Sample]]:
        """One forward batch: `n` samples for each of these tokenised prompts."""

    def _sampling_context(self):
        """Entered around sampling (no autograd, eval mode...)."""
        return contextlib.nullcontext()

    @abstractmethod
    def response_logprobs(
        self,
        prompts: Sequence[Messages],
        responses: Sequence[Sequence[int]],
        use_adapter: bool = True,
        batch_size: int = 16,
        temperature: float = 1.0,
    ) -> list[np.ndarray]:
        """Teacher-forced per-token log-probs of each response given its prompt, at `temperature`."""

    def token_kl(
        self,
        prompts: Sequence[Messages],
        responses: Sequence[Sequence[int]],
        temperature: float = 1.0,
        reference: "ModelBackend | None" = None,
        batch_size: int = 16,
        chunk_elements: int = 2**25,
    ) -> list[np.ndarray]:
        """Exact KL(self || reference) over the vocabulary at each response position, both at
        `temperature`, one array per response; `reference` None = self with its adapter off."""
        return self.token_kls(prompts, responses, [(self, reference)], temperature, batch_size, chunk_elements)[0]

    @abstractmethod
    def token_kls(
        self,
        prompts: Sequence[Messages],
        responses: Sequence[Sequence[int]],
        pairs: Sequence[tuple["ModelBackend | None", "ModelBackend | None"]],
        temperature: float = 1.0,
        batch_size: int = 16,
        chunk_elements: int = 2**25,
    ) -> list[list[np.ndarray]]:
        """`token_kl` for each (p, q) of `pairs` (None = self with its adapter off) on the same responses, each
        model's forward once however many pairs it is in (the gate's three KLs take three forwards, not six)."""

    @abstractmethod
    def position_kl(
        self, prompt_ids: Sequence, response_ids: Sequence, covered: Any, temperature: float, policy_hidden: Any = None
    ) -> Any:
        """Differentiable exact KL(self || self with its adapter off) over the vocabulary at the `covered` response
        positions (bool, one per token of the responses in order), `[N]`; the base takes no gradient. `policy_hidden`:
        the policy's hidden states there, `[N, H]`, from the caller's forward; None = a forward of the policy here."""

    def greedy(self, prompts: Sequence[Messages], max_new_tokens: int) -> list[str]:
        """Greedy completions (used by the judge's retry)."""
        cfg = SamplingConfig(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens)
        return [s[0].text for s in self.sample(prompts, 1, cfg, seeds=[0] * len(prompts))]

    # -- weights ------------------------------------------------------------------------
    @abstractmethod
    def add_lora(self, settings: LoraSettings) -> None:
        """Wrap the base in a fresh trainable LoRA adapter (no-op if one is loaded)."""

    @property
    @abstractmethod
    def has_adapter(self) -> bool: ...

    def adapter_settings(self) -> LoraSettings | None:
        """The loaded adapter's rank, alpha, dropout and targets (None: no adapter, or not known)."""
        return None

    @abstractmethod
    def save(self, path: Path) -> None:
        """Safetensors: the adapter (PEFT layout) if there is one, else the full weights."""

    @abstractmethod
    def num_parameters(self, trainable_only: bool = False) -> int: ...

    # -- training (the trainers are framework-neutral; see `Framework`) -----------------------
    def batch_logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        shared_prefix: bool = False,
    ) -> tuple[Any, Any]:
        """Differentiable teacher-forced log-probs at `temperature`: `(logp, mask)`, `[B, max_len]`."""
        return self.batch_logprobs_hidden(prompt_ids, response_ids, temperature, shared_prefix)[:2]

    @abstractmethod
    def batch_logprobs_hidden(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        shared_prefix: bool = False,
    ) -> tuple[Any, Any, Any]:
        """`batch_logprobs` and the final hidden states that predicted each response token, `[sum |r|, H]` in the
        mask's order, from the same forward: the exact KL anchor's policy side (`position_kl`)."""

    @abstractmethod
    def sequence_logps(
        self, prompt_ids: Sequence[Sequence[int]], segment_ids: Sequence[Sequence[Sequence[int]]]
    ) -> Any:
        """Differentiable `[B]` log pi(completion | prompt), summed over tokens and segments (segments.py)."""

    @abstractmethod
    def use_master_weights(self) -> None:
        """Full fine-tuning: keep every weight in fp32 so small updates are not rounded away."""

    def prepare_for_training(self, keep_moments: bool) -> None:
        """Before a trainer's steps (`train/`: GSPO, DPO, SFT): the weights on disk stop describing this
        model, sampling's memory is freed, and saved optimiser moments are dropped unless the trainer
        resumes them (GSPO's moments do not describe DPO's or SFT's steps)."""
        self.weights_on_disk = None
        if not keep_moments:
            self.optimizer_tensors = None
        self.release_inference_state()

    def recomputing(self, on: bool = True) -> ContextManager[None]:
        """Within: a training forward keeps each layer's input only and recomputes its activations
        in the backward pass (`recomputes_layers`); a no-op when not `on`."""
        if on:
            raise ValueError(f"the {self.name} backend does not recompute its layers' activations")
        return contextlib.nullcontext()

    def release_inference_state(self) -> None:
        """Free what sampling keeps between calls that training needs the memory of (torch on
        CUDA: the static KV cache and its graphs); nothing by default."""
