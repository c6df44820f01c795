"""PyTorch backend: transformers for the model, PEFT for LoRA adapters; loading, teacher-forced
log-probs (the trainers' log-prob functions), LoRA and saving. `mlx/backend.py` is its mirror.

The sampler is `sampling.py`; the losses `losses.py`; the loop and what torch lends the shared
trainers (`models/train/gspo.py`, `models/train/dpo.py`) `training.py`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from outcome_flywheel.models.chat_tokenizer import ChatTokenizer
from outcome_flywheel.models.interface import LoraSettings, Messages, ModelBackend, Sample, SamplingConfig
from outcome_flywheel.models.sampling import ended_by_stop
from outcome_flywheel.models.segments import flatten_segments
from outcome_flywheel.models.torch.fused_decode import DecodeKernels
from outcome_flywheel.models.torch.graph_sampler import GraphSampler
from outcome_flywheel.models.torch.logprobs import CHUNK_ELEMENTS, token_kl, token_logprobs
from outcome_flywheel.models.torch.precision import adapter_autocast, forward_precision, uses_lean_norms
from outcome_flywheel.models.torch.sampling import sample_batch
from outcome_flywheel.models.torch.static_cache import attention_kernels
from outcome_flywheel.models.torch.training import FRAMEWORK, is_writer
from outcome_flywheel.models.torch.vllm_sampling import SAMPLERS, VLLMEngine, needs_teacher_forcing, require_vllm


def resolve_device(device: str = "auto") -> torch.device:
    if device != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class TorchBackend(ChatTokenizer, ModelBackend):
    name = "torch"
    framework = FRAMEWORK
    runs_shared_prefix = True
    recomputes_layers = True

    def __init__(
        self,
        model_path: str | Path,
        adapter_path: str | Path | None = None,
        device: str = "auto",
        trainable: bool = True,
        dtype: str = "auto",
        master_weights: bool = False,
        sampler: str = "torch",
        static_decode: bool | None = None,
        fuse_decode: bool | None = None,
        decode_attention: str = "sdpa",
    ):
        """`dtype` is the compute precision: "auto" = bf16 on CUDA, fp32 elsewhere (CPU has no fast
        bf16 path, and the parity tests need fp32), or a name. `master_weights` keeps the weights
        in fp32 and computes in `dtype` under autocast (full fine-tuning: see `use_master_weights`).
        `static_decode`: the project's sampler decodes over a static KV cache with CUDA graphs
        (`graph_sampler.py`); None = on CUDA only (elsewhere the same step runs without graphs
        when asked, for tests). `fuse_decode`: that step's norms, rotations and gates compiled into
        one kernel each (`fused_decode.py`); None = where it captures graphs. `decode_attention`:
        that step's attention kernel, "sdpa" or "flex" (FlexAttention, not yet measured on a GPU)."""
        from transformers import AutoModelForCausalLM

        self.model_path = Path(model_path)
        self.adapter_path = Path(adapter_path) if adapter_path else None
        self.device = resolve_device(device)
        if dtype == "auto":
            self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        else:
            self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self.master_weights = bool(master_weights) and self.dtype != torch.float32
        if sampler not in SAMPLERS:
            raise ValueError(f"FLYWHEEL_SAMPLER must be one of {SAMPLERS}, got {sampler!r}")
        if sampler == "vllm":
            require_vllm()
        self.sampler = sampler
        self.static_decode = self.device.type == "cuda" if static_decode is None else bool(static_decode)
        self.fuse_decode = fuse_decode
        if decode_attention not in DecodeKernels.ATTENTION:
            raise ValueError(f"decode_attention must be one of {DecodeKernels.ATTENTION}, got {decode_attention!r}")
        self.decode_attention = decode_attention
        self._graph_sampler: GraphSampler | None = None
        self.weights_on_disk = (self.model_path, self.adapter_path)
        self._load_tokenizer()
        model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=torch.float32 if self.master_weights else self.dtype
        )
        if self.adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, self.adapter_path, is_trainable=trainable)
        self.model = model.to(self.device)
        self.model.eval()
        # AdamW's moments saved with the checkpoint (the adapter's, or the full weights')
        self.read_optimizer_tensors(self.adapter_path or self.model_path)

    def use_master_weights(self) -> None:
        """Full fine-tuning in bf16/fp16 loses its updates: an Adam step of 1e-5 is below half a
        bf16 ulp of most weights, so it rounds away. Keep the weights (and so the optimiser's
        updates and the saved checkpoint) in fp32 and compute in `self.dtype` under autocast."""
        if self.dtype == torch.float32 or self.master_weights:
            return
        self.model.float()
        self.master_weights = True

    def autocast(self):
        """Forward passes in the compute dtype over fp32 master weights; a no-op otherwise."""
        if not self.master_weights:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    @property
    def adapter_autocast(self) -> bool:
        return adapter_autocast(self)

    @property
    def lean_norms(self) -> bool:
        return uses_lean_norms(self)

    def forward_precision(self):
        """A teacher-forced forward's precision and what it keeps (`precision.py`)."""
        return forward_precision(self)

    def recomputing(self, on: bool = True):
        """Within: the decoder layers recompute their activations in the backward pass (`recompute.py`)."""
        from outcome_flywheel.models.torch.recompute import recomputing  # imports transformers

        return recomputing(self, on)

    # -- inference ----------------------------------------------------------------------
    @property
    def graph_sampler(self) -> "GraphSampler | None":
        """The static-cache sampler of this loaded model (made on first use), or None when off."""
        if not self.static_decode:
            return None
        if self._graph_sampler is None:
            self._graph_sampler = GraphSampler(self, fuse=self.fuse_decode, attention=self.decode_attention)
        return self._graph_sampler

    def release_inference_state(self) -> None:
        """Free the static KV cache and its graphs (20 GiB at a day's load on qwen3-0.6b): training
        needs the memory, and a LoRA update brings new parameters that need new graphs anyway. The
        cached blocks go back to the driver too, so another process (a judge, a server) can use them."""
        if self._graph_sampler is not None:
            self._graph_sampler.close()
        self._graph_sampler = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __del__(self):
        try:
            self.release_inference_state()
        except Exception:  # interpreter shutdown: nothing left to give back
            pass

    @contextlib.contextmanager
    def _sampling_context(self):
        with torch.inference_mode(), self.autocast():
            yield

    def _sample_batch(
        self, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig, seeds: Sequence[int]
    ) -> list[list[Sample]]:
        if self.sampler == "vllm" and self.weights_on_disk is not None:
            return self._vllm_sample_batch(prompt_ids, n, cfg, seeds)
        return sample_batch(self, prompt_ids, n, cfg, seeds)

    def _vllm_sample_batch(
        self, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig, seeds: Sequence[int]
    ) -> list[list[Sample]]:
        """vLLM samples the files this policy's weights are; pi_old per `vllm_sampling.needs_teacher_forcing`."""
        model_path, adapter = self.weights_on_disk
        engine = VLLMEngine.for_model(model_path, enable_lora=adapter is not None)
        banned = self.tokenizer.convert_ids_to_tokens(self.banned_ids(cfg))
        grouped = engine.generate(prompt_ids, n, cfg, seeds, adapter, banned)
        if needs_teacher_forcing(cfg):
            flat = [(i, ids) for i, group in enumerate(grouped) for ids, _ in group]
            forced: list[list[float]] = []
            for start in range(0, len(flat), 16):
                chunk = flat[start : start + 16]
                logp, mask = self.batch_logprobs(
                    [prompt_ids[i] for i, _ in chunk],
                    [ids or [self.tokenizer.pad_token_id] for _, ids in chunk],
                    cfg.temperature,
                )
                forced += [logp[b][mask[b]].double().tolist()[: len(ids)] for b, (_, ids) in enumerate(chunk)]
            it = iter(forced)
            grouped = [[(ids, next(it)) for ids, _ in group] for group in grouped]
        return [
            [
                Sample(
                    text=self.decode(ids),
                    token_ids=ids,
                    logprobs=logps,
                    finished=ended_by_stop(ids, self.stop_ids, cfg.ignore_eos),
                )
                for ids, logps in group
            ]
            for group in grouped
        ]

    def batch_logprobs_hidden(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        shared_prefix: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Differentiable teacher-forced log-probs at `temperature` (log-softmax of logits / T), `(logp, mask)`,
        both `[B, max_response_len]`, and the final hidden states they came from (`ModelBackend`).

        Sequences are right-padded (causal attention makes the padding invisible to real tokens).
        Only the final hidden states that predict response tokens go through the head, a chunk at
        a time, and each token's log-prob is its logit minus a logsumexp (`logprobs.py`): no
        `[B, L, V]` tensor at any vocabulary. `shared_prefix`: the same values, each distinct
        prompt run once (`prefix_cache.py`).
        """
        if shared_prefix:  # each distinct prompt once with a cache, the responses on top of it
            from outcome_flywheel.models.torch.prefix_cache import shared_prefix_hidden  # imports transformers

            with self.forward_precision(), attention_kernels(self.device):
                hidden, responses, mask = shared_prefix_hidden(self, prompt_ids, response_ids)
            hidden, targets = hidden[mask], responses[mask]
        else:
            hidden, targets, mask = self._response_forward(prompt_ids, response_ids)
        flat = token_logprobs(hidden, self._head, targets, temperature, self.vocab_size)
        return self._scatter_rows(flat, mask), mask, hidden

    def _response_layout(
        self, prompt_ids, response_ids
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """For right-padded `prompt + response` rows: the (row, column) of the position predicting
        each response token, response 0's tokens first; those tokens; and the `[B, R]` mask."""
        rows, cols, targets = [], [], []
        mask = torch.zeros((len(response_ids), max(len(r) for r in response_ids)), dtype=torch.bool)
        for b, (p, r) in enumerate(zip(prompt_ids, response_ids)):
            rows += [b] * len(r)
            cols += range(len(p) - 1, len(p) - 1 + len(r))
            targets += list(r)
            mask[b, : len(r)] = True
        as_long = lambda values: torch.tensor(values, dtype=torch.long, device=self.device)  # noqa: E731
        return as_long(rows), as_long(cols), as_long(targets), mask.to(self.device)

    @staticmethod
    def _scatter_rows(flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-token values in mask order back to `[B, R]`, zero where masked (differentiable)."""
        return torch.zeros(mask.shape, dtype=flat.dtype, device=flat.device).masked_scatter(mask, flat)

    @property
    def vocab_size(self) -> int:
        return int(self._causal_lm().get_output_embeddings().weight.shape[0])

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits from final hidden states in the compute dtype (autocast over master weights)."""
        with self.autocast():
            return self.lm_head(hidden)

    def sequence_logps(
        self, prompt_ids: Sequence[Sequence[int]], segment_ids: Sequence[Sequence[Sequence[int]]]
    ) -> torch.Tensor:
        """[B] log pi(completion | prompt): summed over tokens, and over segments (segments.py),
        every segment row in one forward pass; differentiable."""
        prompts, responses, owner = flatten_segments(prompt_ids, segment_ids)
        logp, mask = self.batch_logprobs(prompts, responses, shared_prefix=True)  # a prompt once for its rows
        per_row = (logp * mask).sum(-1)
        index = torch.tensor(owner, device=per_row.device)
        return per_row.new_zeros(len(prompt_ids)).index_add(0, index, per_row)

    def _right_padded(
        self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(input_ids, attention_mask)` of `prompt + response` rows, right-padded, on the device."""
        seqs = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
        input_ids = torch.full((len(seqs), max(len(s) for s in seqs)), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for b, seq in enumerate(seqs):
            input_ids[b, : len(seq)] = torch.tensor(seq)
            attention[b, : len(seq)] = 1
        return input_ids.to(self.device), attention.to(self.device)

    def _causal_lm(self):
        """The transformers model under the PEFT wrapper, if any (LoRA layers stay inside it)."""
        return self.model.get_base_model() if self.has_adapter else self.model

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._causal_lm().get_output_embeddings()(hidden)

    def response_hidden(
        self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Final hidden states at the positions that predict each response token, `[sum |r|, H]`,
        rows in order (response 0's tokens, then response 1's...)."""
        return self._response_forward(prompt_ids, response_ids)[0]

    def _response_forward(
        self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The teacher-forced forward over right-padded `prompt + response` rows, for `batch_logprobs`
        and `response_hidden` alike: the final hidden states that predict each response token
        (`[sum |r|, H]`, response 0's tokens first), those tokens, and the `[B, R]` mask."""
        input_ids, attention = self._right_padded(prompt_ids, response_ids)
        with self.forward_precision(), attention_kernels(self.device):
            hidden = (
                self._causal_lm()
                .model(input_ids=input_ids, attention_mask=attention, use_cache=False)
                .last_hidden_state
            )
        rows, cols, targets, mask = self._response_layout(prompt_ids, response_ids)
        return hidden[rows, cols], targets, mask

    def position_kl(
        self, prompt_ids, response_ids, covered, temperature: float = 1.0, policy_hidden: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Differentiable exact KL(policy || base) at the `covered` positions, `[N]` (`ModelBackend`): the
        base's forward (adapter off) without gradients, the policy's with them unless the caller's own
        forward hands its hidden states at those positions in (`policy_hidden`); `logprobs.token_kl` on both."""
        keep = torch.as_tensor(covered, dtype=torch.bool, device=self.device)
        with torch.no_grad(), self.adapter_disabled():
            base = self.response_hidden(prompt_ids, response_ids)[keep]
        hidden = self.response_hidden(prompt_ids, response_ids)[keep] if policy_hidden is None else policy_hidden
        return token_kl(hidden, self._head, base, self._head, temperature, self.vocab_size)

    @torch.no_grad()
    def token_kls(
        self,
        prompts: Sequence[Messages],
        responses: Sequence[Sequence[int]],
        pairs: Sequence[tuple["TorchBackend | None", "TorchBackend | None"]],
        temperature: float = 1.0,
        batch_size: int = 16,
        chunk_elements: int = CHUNK_ELEMENTS,
    ) -> list[list[np.ndarray]]:
        """Exact KL(p || q) = sum_v p(v) (log p(v) - log q(v)) over the vocabulary at every response
        position, both at `temperature`, for each (p, q) of `pairs` (None = this policy with its adapter
        off, the base): per pair, one array per response (`ModelBackend`). Each model's forward runs once
        a batch whatever the pairs it is in. Logits are made from the final hidden states
        `chunk_elements // V` positions at a time (`logprobs.token_kl`), so a 150k vocabulary never
        needs a `[B, T, V]` tensor.
        """
        out: list[list[np.ndarray]] = [[] for _ in pairs]
        models = list(dict.fromkeys(m for pair in pairs for m in pair))  # each once, in order
        for start in range(0, len(prompts), batch_size):
            p_ids = [self.prompt_ids(p) for p in prompts[start : start + batch_size]]
            r_ids = [list(r) for r in responses[start : start + batch_size]]
            if not any(r_ids):
                out = [kls + [np.zeros(0, dtype=np.float32) for _ in r_ids] for kls in out]
                continue
            hidden = {}
            for model in models:
                with self.adapter_disabled() if model is None else contextlib.nullcontext():
                    hidden[model] = (self if model is None else model).response_hidden(p_ids, r_ids)
            bounds = np.cumsum([0] + [len(r) for r in r_ids])
            for kls, (p, q) in zip(out, pairs):
                head_p, head_q = (self if p is None else p)._head, (self if q is None else q)._head
                per_token = token_kl(hidden[p], head_p, hidden[q], head_q, temperature, self.vocab_size, chunk_elements)
                flat = per_token.cpu().double().numpy()
                kls += [flat[bounds[i] : bounds[i + 1]] for i in range(len(r_ids))]
        return out

    @torch.no_grad()
    def response_logprobs(
        self,
        prompts: Sequence[Messages],
        responses: Sequence[Sequence[int]],
        use_adapter: bool = True,
        batch_size: int = 16,
        temperature: float = 1.0,
    ) -> list[np.ndarray]:
        result: list[np.ndarray] = []
        with contextlib.nullcontext() if use_adapter else self.adapter_disabled():
            for start in range(0, len(prompts), batch_size):
                p_ids = [self.prompt_ids(p) for p in prompts[start : start + batch_size]]
                r_ids = [list(r) for r in responses[start : start + batch_size]]
                logp, mask = self.batch_logprobs(p_ids, r_ids, temperature)
                for b in range(len(p_ids)):
                    result.append(logp[b][mask[b]].float().cpu().numpy())
        return result

    # -- weights ------------------------------------------------------------------------
    @property
    def has_adapter(self) -> bool:
        from peft import PeftModel

        return isinstance(self.model, PeftModel)

    def adapter_settings(self) -> LoraSettings | None:
        if not self.has_adapter:
            return None
        cfg = self.model.peft_config["default"]
        targets = [cfg.target_modules] if isinstance(cfg.target_modules, str) else sorted(cfg.target_modules)
        return LoraSettings(r=cfg.r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, target_modules=targets)

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """The base model's view: the reference policy for DPO and KL."""
        with self.model.disable_adapter() if self.has_adapter else contextlib.nullcontext():
            yield

    def add_lora(self, settings: LoraSettings) -> None:
        if self.has_adapter:
            return
        from peft import LoraConfig, get_peft_model

        self.weights_on_disk = None  # a fresh adapter lives in memory until saved
        cfg = LoraConfig(
            r=settings.r,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=list(settings.target_modules),
            task_type="CAUSAL_LM",
        )
        self.model = get_peft_model(self.model, cfg)

    def save(self, path: Path) -> None:
        """Writes nothing on a data-parallel rank other than 0 (`training.py`: rank 0 alone writes)."""
        if not is_writer():
            return
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        if not self.has_adapter:
            self.tokenizer.save_pretrained(path)
        self.write_optimizer_tensors(path)  # beside the weights, when there is a state to keep

    def num_parameters(self, trainable_only: bool = False) -> int:
        return int(sum(p.numel() for p in self.model.parameters() if p.requires_grad or not trainable_only))

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]
