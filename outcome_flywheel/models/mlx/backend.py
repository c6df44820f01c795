"""MLX backend: mlx-lm for the model and its LoRA layers; loading, teacher-forced log-probs (the
trainers' log-prob functions), LoRA and saving. The mirror of `torch/backend.py`.

Runs unchanged on Apple silicon (Metal) and on Linux (`mlx[cpu]`, slow: see docs/mlx.md).
It follows `TorchBackend`'s conventions exactly, so either backend can take over a policy:

- teacher forcing: right-padded batch, causal attention, logits only for the response tail.
- LoRA: mlx-lm's `LoRALinear` via `linear_to_lora_layers`, same targets as `LoraSettings`;
  saved and loaded in PEFT layout (`lora_convert`), so checkpoints on disk are framework-neutral.
  The reference policy (DPO, the style score) is the base: every LoRA scale set to 0.

The sampler is `sampling.py`; the losses `losses.py`; the loop and what mlx lends the shared
trainers (`models/train/gspo.py`, `models/train/dpo.py`) `training.py`.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from outcome_flywheel.models.chat_tokenizer import ChatTokenizer
from outcome_flywheel.models.interface import LoraSettings, Messages, ModelBackend, Sample, SamplingConfig
from outcome_flywheel.models.mlx import lora_convert
from outcome_flywheel.models.mlx.logprobs import CHUNK_ELEMENTS, plain_token_kl, token_kl, token_logprobs
from outcome_flywheel.models.mlx.recompute import recomputing
from outcome_flywheel.models.mlx.sampling import sample_batch
from outcome_flywheel.models.mlx.training import FRAMEWORK
from outcome_flywheel.models.segments import flatten_segments

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class MLXBackend(ChatTokenizer, ModelBackend):
    name = "mlx"
    framework = FRAMEWORK
    recomputes_layers = True

    def __init__(self, model_path: str | Path, adapter_path: str | Path | None = None, dtype: str = "auto"):
        from mlx_lm.utils import load_model

        self.model_path = Path(model_path)
        self.adapter_path = Path(adapter_path) if adapter_path else None
        self.model, self.config = load_model(self.model_path)
        # "auto" keeps the stored precision (fp32 tiny-local -> fp32, which parity needs; bf16
        # Qwen3 on Metal stays bf16); a name forces it.
        if dtype != "auto":
            self.model.set_dtype(DTYPES[dtype])
        self.dtype = self._param_dtype()
        # The same Hugging Face tokenizer and chat template as the torch backend (mlx-lm's
        # TokenizerWrapper wraps this very object), so prompt ids are identical.
        self._load_tokenizer()
        self.lora_settings: LoraSettings | None = None
        if self.adapter_path is not None:
            self._load_adapter(self.adapter_path)
        self.model.eval()
        # AdamW's moments saved with the checkpoint (the adapter's, or the full weights')
        self.read_optimizer_tensors(self.adapter_path or self.model_path)

    def _param_dtype(self):
        return next(v.dtype for _, v in tree_flatten(self.model.parameters()) if mx.issubdtype(v.dtype, mx.floating))

    def use_master_weights(self) -> None:
        """Full fine-tuning keeps every weight in fp32: in bf16 an AdamW step of ~1e-5 is below half
        an ulp of most weights and rounds away (mlx has no autocast, so compute is fp32 too)."""
        if self.dtype != mx.float32:
            self.model.set_dtype(mx.float32)
            self.dtype = mx.float32

    # -- inference ----------------------------------------------------------------------
    def _sampling_context(self):
        return self._eval_mode()

    def _sample_batch(
        self, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig, seeds: Sequence[int]
    ) -> list[list[Sample]]:
        return sample_batch(self, prompt_ids, n, cfg, seeds)

    def lm_head(self, hidden: mx.array) -> mx.array:
        """Logits from final hidden states (the model's own head, or its tied embeddings)."""
        if "lm_head" in self.model:
            return self.model.lm_head(hidden)
        return self.model.model.embed_tokens.as_linear(hidden)

    def response_hidden(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> mx.array:
        """Final hidden states at the positions that predict each response token, `[sum |r|, H]`,
        rows in order (response 0's tokens, then response 1's...)."""
        inputs, gather_pos, _, mask, keep = self._teacher_forcing_layout(prompt_ids, response_ids)
        return self._hidden_at(inputs, gather_pos, mask, keep)

    def _hidden_at(self, inputs: np.ndarray, gather_pos: np.ndarray, mask: np.ndarray, keep: int) -> mx.array:
        hidden = self.model.model(mx.array(inputs))[:, -keep:, :]
        picked = mx.take_along_axis(hidden, mx.array(gather_pos)[:, :, None], axis=1)  # [B, R, H]
        return picked.reshape(-1, picked.shape[-1])[mx.array(np.flatnonzero(mask.reshape(-1)))]

    def position_kl(
        self, prompt_ids, response_ids, covered, temperature: float = 1.0, policy_hidden: mx.array | None = None
    ) -> mx.array:
        """Differentiable exact KL(policy || base) at the `covered` positions, `[N]` (as torch's): the base's
        hidden states are built with the adapter off and take no gradient, the policy's here unless the caller's
        forward hands them in (`policy_hidden`); full logits at those N positions only."""
        keep = mx.array(np.flatnonzero(np.asarray(covered, dtype=bool)).astype(np.int32))
        with self.adapter_disabled():
            base = mx.stop_gradient(self.response_hidden(prompt_ids, response_ids)[keep])
        hidden = self.response_hidden(prompt_ids, response_ids)[keep] if policy_hidden is None else policy_hidden
        return plain_token_kl(self.lm_head(hidden), self.lm_head(base), temperature)

    def token_kls(
        self,
        prompts: Sequence[Messages],
        responses: Sequence[Sequence[int]],
        pairs: Sequence[tuple["MLXBackend | None", "MLXBackend | None"]],
        temperature: float = 1.0,
        batch_size: int = 16,
        chunk_elements: int = CHUNK_ELEMENTS,
    ) -> list[list[np.ndarray]]:
        """Exact KL(p || q) over the vocabulary at every response position, at `temperature`, for each
        (p, q) of `pairs` (None = this policy with its adapter off), each model's forward once a batch
        (as `TorchBackend.token_kls`). Logits are made `chunk_elements // V` positions at a time from the
        final hidden states, so a 150k vocabulary never needs `[B, T, V]`."""
        out: list[list[np.ndarray]] = [[] for _ in pairs]
        models = list(dict.fromkeys(m for pair in pairs for m in pair))  # each once, in order
        with self._eval_mode():
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
                        mx.eval(hidden[model])  # while the adapter is off
                bounds = np.cumsum([0] + [len(r) for r in r_ids])
                for kls, (p, q) in zip(out, pairs):
                    head_p, head_q = (self if p is None else p).lm_head, (self if q is None else q).lm_head
                    flat = np.array(
                        token_kl(hidden[p], head_p, hidden[q], head_q, temperature, self.vocab_size, chunk_elements)
                    )
                    kls += [flat[bounds[i] : bounds[i + 1]] for i in range(len(r_ids))]
        return out

    def _teacher_forcing_layout(self, prompt_ids, response_ids):
        """Right-padded `prompt + response` rows and, per response token, the column of the logits
        tail that predicts it: `(inputs, gather_pos, targets, mask, keep)`."""
        pad = self.tokenizer.pad_token_id
        seqs = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
        width = max(len(s) for s in seqs)
        resp_len = max(len(r) for r in response_ids)
        inputs = np.full((len(seqs), width), pad, dtype=np.int32)
        for b, s in enumerate(seqs):
            inputs[b, : len(s)] = s
        min_prompt = min(len(p) for p in prompt_ids)
        keep = width - min_prompt + 1  # logits for positions min_prompt-1 .. width-1
        offset = width - keep
        gather_pos = np.zeros((len(seqs), resp_len), dtype=np.int32)
        targets = np.full((len(seqs), resp_len), pad, dtype=np.int32)
        mask = np.zeros((len(seqs), resp_len), dtype=bool)
        for b, (p, r) in enumerate(zip(prompt_ids, response_ids)):
            k = len(r)
            gather_pos[b, :k] = np.arange(len(p) - 1, len(p) - 1 + k) - offset
            targets[b, :k] = list(r)
            mask[b, :k] = True
        return inputs, gather_pos, targets, mask, keep

    def batch_logprobs_hidden(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        shared_prefix: bool = False,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """Differentiable teacher-forced log-probs at `temperature` (log-softmax of logits / T), `(logp, mask)`,
        both `[B, max_response_len]`, and the final hidden states they came from (`ModelBackend`).

        Right-padded (causal attention makes the padding invisible to real tokens), as torch; only
        the hidden states predicting response tokens go through the head, a checkpointed chunk at
        a time (`logprobs.py`). `shared_prefix` is accepted for the interface: mlx runs every
        row's prompt, which gives the same values as torch's once-per-prompt pass.
        """
        inputs, gather_pos, targets, mask, keep = self._teacher_forcing_layout(prompt_ids, response_ids)
        hidden = self._hidden_at(inputs, gather_pos, mask, keep)
        flat = token_logprobs(
            hidden, self.lm_head, mx.array(targets[mask]), temperature, self.vocab_size, module=self.model
        )
        # back to [B, R]: masked slots read an appended zero (a differentiable gather)
        slots = np.full(mask.shape, int(mask.sum()), dtype=np.int32)
        slots[mask] = np.arange(int(mask.sum()), dtype=np.int32)
        logp = mx.concatenate([flat, mx.zeros((1,), dtype=flat.dtype)])[mx.array(slots)]
        return logp, mx.array(mask), hidden

    @property
    def vocab_size(self) -> int:
        if "lm_head" in self.model:
            return int(self.model.lm_head.weight.shape[0])
        return int(self.model.model.embed_tokens.weight.shape[0])

    def response_logprobs(
        self,
        prompts: Sequence[Messages],
        responses: Sequence[Sequence[int]],
        use_adapter: bool = True,
        batch_size: int = 16,
        temperature: float = 1.0,
    ) -> list[np.ndarray]:
        result: list[np.ndarray] = []
        ctx = contextlib.nullcontext() if use_adapter else self.adapter_disabled()
        with ctx, self._eval_mode():
            for start in range(0, len(prompts), batch_size):
                p_ids = [self.prompt_ids(p) for p in prompts[start : start + batch_size]]
                r_ids = [list(r) for r in responses[start : start + batch_size]]
                logp, _ = self.batch_logprobs(p_ids, r_ids, temperature)
                logp_np = np.array(mx.stop_gradient(logp))
                for b, r in enumerate(r_ids):
                    result.append(logp_np[b, : len(r)].astype(np.float32))
        return result

    def sequence_logps(
        self, prompt_ids: Sequence[Sequence[int]], segment_ids: Sequence[Sequence[Sequence[int]]]
    ) -> mx.array:
        """[B] log pi(completion | prompt): summed over tokens, and over segments (segments.py),
        every segment row in one forward pass; differentiable."""
        prompts, responses, owner = flatten_segments(prompt_ids, segment_ids)
        logp, _ = self.batch_logprobs(prompts, responses)
        # Rows summed into their item by a 0/1 matrix product (differentiable, no scatter).
        assign = np.zeros((len(prompt_ids), len(owner)), dtype=np.float32)
        assign[owner, np.arange(len(owner))] = 1.0
        return mx.array(assign) @ logp.sum(axis=-1)

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """Inference without LoRA dropout, restoring the training flag afterwards."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)

    # -- weights ------------------------------------------------------------------------
    def lora_modules(self) -> list[tuple[str, nn.Module]]:
        from mlx_lm.tuner.lora import LoRALinear

        return [(name, m) for name, m in self.model.named_modules() if isinstance(m, LoRALinear)]

    @property
    def has_adapter(self) -> bool:
        return bool(self.lora_modules())

    def adapter_settings(self) -> LoraSettings | None:
        return self.lora_settings if self.has_adapter else None

    def recomputing(self, on: bool = True):
        """Within: the decoder layers recompute their activations in the backward pass (`recompute.py`)."""
        return recomputing(self, on)

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """The base model's view: the reference policy for DPO and the style score.

        mlx builds its graph eagerly, so a LoRA scale of 0 while the forward pass is built
        gives exactly the base output (y = W x + 0 * B A x)."""
        modules = [m for _, m in self.lora_modules()]
        scales = [m.scale for m in modules]
        for m in modules:
            m.scale = 0.0
        try:
            yield
        finally:
            for m, s in zip(modules, scales):
                m.scale = s

    def _lora_keys(self, target_modules: Sequence[str]) -> list[str]:
        """mlx-lm keys (paths inside a block) of the linear layers named in `target_modules`."""
        targets = set(target_modules)
        keys = sorted(
            name
            for name, m in self.model.layers[0].named_modules()
            if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets
        )
        if not keys:
            raise ValueError(f"none of {sorted(targets)} is a linear layer of this model")
        return keys

    def _apply_lora(
        self, rank: int, scale: float, dropout: float, keys: Sequence[str], num_layers: int | None = None
    ) -> None:
        from mlx_lm.tuner.utils import linear_to_lora_layers

        self.model.freeze()
        linear_to_lora_layers(
            self.model,
            num_layers or len(self.model.layers),
            {"rank": int(rank), "scale": float(scale), "dropout": float(dropout), "keys": list(keys)},
        )

    def add_lora(self, settings: LoraSettings) -> None:
        if self.has_adapter:
            return
        self._apply_lora(
            settings.r, settings.alpha / settings.r, settings.dropout, self._lora_keys(settings.target_modules)
        )
        self.lora_settings = settings

    def _load_adapter(self, path: Path) -> None:
        """A PEFT adapter folder (converted on the fly) or an mlx-lm one."""
        layout, tensors, config = lora_convert.read_adapter(path)
        if layout == "peft":
            tensors, config = lora_convert.peft_to_mlx(tensors, config)
        params = config["lora_parameters"]
        self._apply_lora(
            params["rank"], params["scale"], params.get("dropout", 0.0), params["keys"], config.get("num_layers")
        )
        expected = {name: v.shape for name, v in tree_flatten(self.model.trainable_parameters())}
        missing = sorted(set(expected) - set(tensors))
        unknown = sorted(set(tensors) - set(expected))
        if missing or unknown:
            raise ValueError(f"adapter {path} does not fit the model: missing {missing[:4]}, unknown {unknown[:4]}")
        dtypes = {name: v.dtype for name, v in tree_flatten(self.model.trainable_parameters())}
        self.model.load_weights([(k, mx.array(v).astype(dtypes[k])) for k, v in tensors.items()], strict=False)
        mx.eval(self.model.parameters())
        scale, rank = float(params["scale"]), int(params["rank"])
        targets = tuple(sorted({k.rsplit(".", 1)[-1] for k in params["keys"]}))
        self.lora_settings = LoraSettings(
            r=rank, alpha=scale * rank, dropout=float(params.get("dropout", 0.0)), target_modules=targets
        )

    def adapter_tensors(self) -> dict[str, np.ndarray]:
        """The LoRA factors in mlx-lm naming, as float32 NumPy arrays."""
        return {
            name: np.array(v.astype(mx.float32))
            for name, v in tree_flatten(self.model.parameters())
            if name.endswith((".lora_a", ".lora_b"))
        }

    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.has_adapter:
            # PEFT layout on disk: the torch backend (and vLLM, PEFT users) load it as is.
            _, module = self.lora_modules()[0]
            rank = int(module.lora_a.shape[1])
            mlx_config = {
                "fine_tune_type": "lora",
                "num_layers": len(self.model.layers),
                "lora_parameters": {
                    "rank": rank,
                    "scale": float(module.scale),
                    "dropout": float(self.lora_settings.dropout if self.lora_settings else 0.0),
                    "keys": sorted({_block_key(name) for name, _ in self.lora_modules()}),
                },
            }
            tensors, peft_config = lora_convert.mlx_to_peft(self.adapter_tensors(), mlx_config, str(self.model_path))
            lora_convert.write_adapter(path, "peft", tensors, peft_config)
            self.write_optimizer_tensors(path)  # beside the weights, when there is a state to keep
            return
        # A full HF folder: the weights under their transformers names, config and tokenizer.
        weights = dict(tree_flatten(self.model.parameters()))
        mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "pt"})
        for name in ("config.json", "generation_config.json"):
            if (self.model_path / name).exists() and not (path / name).exists():
                shutil.copy(self.model_path / name, path / name)
        self.tokenizer.save_pretrained(path)
        self.write_optimizer_tensors(path)

    def num_parameters(self, trainable_only: bool = False) -> int:
        params = self.model.trainable_parameters() if trainable_only else self.model.parameters()
        return int(sum(v.size for _, v in tree_flatten(params)))


def _block_key(module_name: str) -> str:
    """`model.layers.3.self_attn.q_proj` -> `self_attn.q_proj` (mlx-lm's per-block LoRA key)."""
    return module_name.split(".layers.", 1)[1].split(".", 1)[1]
