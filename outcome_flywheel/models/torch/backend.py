"""PyTorch backend: transformers for the model, PEFT for LoRA adapters.

Sampling is our own batched loop over the model's KV cache rather than `generate()`, for two
reasons: each prompt gets its own random generator (seeded by the caller, so a headline's
samples do not depend on which other headlines share the batch), and the log-probability of
every sampled token is recorded under the policy at the sampling temperature (log-softmax of
logits / T, before top-k / top-p, as TRL's GRPO and verl define it): the exact quantity teacher
forcing at temperature T reproduces (`batch_logprobs(..., temperature=T)`) and GSPO's pi_old.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from outcome_flywheel.models.sampling import candidate_count, keep_thresholds, row_seed, uses_nucleus
from outcome_flywheel.models.interface import ChatTokenizer, LoraSettings, Messages, ModelBackend, Sample, SamplingConfig, TrainStats


def resolve_device(device: str = "auto") -> torch.device:
    if device != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then nucleus (top-p) on temperature-scaled logits: the rule of `sampling.py`, whose
    one threshold per row is computed on the host from the top-k candidates."""
    k = candidate_count(top_k, logits.shape[-1])
    if k == logits.shape[-1] and not uses_nucleus(top_p):
        return logits
    top = torch.topk(logits, k, dim=-1).values
    # to the host first: MPS has no float64 (keep_thresholds works in float64 on the host)
    threshold = torch.from_numpy(keep_thresholds(top.float().cpu().numpy(), top_p)).to(logits.dtype).to(logits.device)
    return logits.masked_fill(logits < threshold[:, None], float("-inf"))


def left_padded(prompt_ids: Sequence[Sequence[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask, position_ids)` of prompts padded on the left, so every row's
    next token sits in the last column; positions count real tokens only."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(list(p))
        attention[i, width - len(p) :] = 1
    ids, attention = ids.to(device), attention.to(device)
    return ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


class TorchBackend(ChatTokenizer, ModelBackend):
    name = "torch"

    def __init__(
        self, model_path: str | Path, adapter_path: str | Path | None = None, device: str = "auto",
        trainable: bool = True, dtype: str = "auto", master_weights: bool = False,
    ):
        """`dtype` is the compute precision: "auto" = bf16 on CUDA, fp32 elsewhere (CPU has no fast
        bf16 path, and the parity tests need fp32), or a name. `master_weights` keeps the weights
        in fp32 and computes in `dtype` under autocast (full fine-tuning: see `use_master_weights`)."""
        from transformers import AutoModelForCausalLM

        self.model_path = Path(model_path)
        self.adapter_path = Path(adapter_path) if adapter_path else None
        self.device = resolve_device(device)
        if dtype == "auto":
            self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        else:
            self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self.master_weights = bool(master_weights) and self.dtype != torch.float32
        self._load_tokenizer()
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32 if self.master_weights else self.dtype)
        if self.adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, self.adapter_path, is_trainable=trainable)
        self.model = model.to(self.device)
        self.model.eval()

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

    # -- inference ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _sampling_context(self):
        with torch.inference_mode(), self.autocast():
            yield

    def _sample_batch(self, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig, seeds: Sequence[int]) -> list[list[Sample]]:
        pad = self.tokenizer.pad_token_id
        rows = [(i, j) for i in range(len(prompt_ids)) for j in range(n)]
        input_ids, attention, positions = left_padded(prompt_ids, pad, self.device)
        # Each row's uniforms for every step, drawn up front from its own generator; sampling is
        # then one vectorised inverse-CDF lookup per step (no per-row multinomial calls).
        uniforms = torch.stack([
            torch.rand(cfg.max_new_tokens, generator=torch.Generator().manual_seed(row_seed(seeds[i], j)), dtype=torch.float64)
            for i, j in rows
        ]).to(self.device) if cfg.temperature > 0 else None

        # The prompt is run once, then its KV cache is copied to its n samples.
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        past = outputs.past_key_values
        past.batch_repeat_interleave(n)
        logits = outputs.logits[:, -1, :].float().repeat_interleave(n, dim=0)
        attention = attention.repeat_interleave(n, dim=0)
        next_pos = positions[:, -1:].repeat_interleave(n, dim=0) + 1

        # Per step, for every row: its token, its log-prob, and whether the row was still going.
        # Finished rows leave the batch (and the cache); `active` maps batch rows to rows.
        total = len(rows)
        step_tokens, step_logps, step_alive = [], [], []
        active = torch.arange(total, device=self.device)
        stop = torch.tensor(sorted(self.stop_ids), device=self.device)
        for step in range(cfg.max_new_tokens):
            scaled = logits / cfg.temperature if cfg.temperature > 0 else logits  # greedy: temperature 1
            behaviour_logp = F.log_softmax(scaled, dim=-1)
            if cfg.temperature <= 0:
                chosen = logits.argmax(-1)
            else:
                probs = _filter_logits(scaled, cfg.top_k, cfg.top_p).softmax(-1)
                cdf = probs.double().cumsum(-1)
                # First token whose cumulative mass reaches u * total: filtered (zero-mass) tokens never win.
                target = uniforms[active, step : step + 1] * cdf[:, -1:]
                chosen = torch.searchsorted(cdf, target).clamp(max=cdf.shape[-1] - 1)[:, 0]
            tokens_now = torch.full((total,), pad, dtype=torch.long, device=self.device)
            logps_now = torch.zeros(total, dtype=behaviour_logp.dtype, device=self.device)
            alive_now = torch.zeros(total, dtype=torch.bool, device=self.device)
            tokens_now[active] = chosen
            logps_now[active] = behaviour_logp.gather(-1, chosen[:, None])[:, 0]
            alive_now[active] = True
            step_tokens.append(tokens_now)
            step_logps.append(logps_now)
            step_alive.append(alive_now)
            keep = ~torch.isin(chosen, stop)
            if not bool(keep.any()) or step == cfg.max_new_tokens - 1:
                break
            if not bool(keep.all()):
                kept = torch.nonzero(keep).flatten()
                past.batch_select_indices(kept)
                active, chosen, attention, next_pos = active[kept], chosen[kept], attention[kept], next_pos[kept]
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)
            outputs = self.model(
                input_ids=chosen[:, None], attention_mask=attention, position_ids=next_pos,
                past_key_values=past, use_cache=True, logits_to_keep=1,
            )
            past = outputs.past_key_values
            logits = outputs.logits[:, -1, :].float()
            next_pos = next_pos + 1

        # One device->host copy at the end instead of per-token reads inside the loop.
        all_tokens = torch.stack(step_tokens, dim=1).tolist()
        all_logps = torch.stack(step_logps, dim=1).double().tolist()
        alive = torch.stack(step_alive, dim=1).tolist()
        tokens = [[t for t, a in zip(all_tokens[r], alive[r]) if a] for r in range(total)]
        logps = [[lp for lp, a in zip(all_logps[r], alive[r]) if a] for r in range(total)]
        grouped: list[list[Sample]] = [[] for _ in prompt_ids]
        for r, (i, _) in enumerate(rows):
            finished = bool(tokens[r]) and tokens[r][-1] in self.stop_ids
            grouped[i].append(Sample(text=self.decode(tokens[r]), token_ids=tokens[r], logprobs=logps[r], finished=finished))
        return grouped

    def batch_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Differentiable teacher-forced log-probs at `temperature` (log-softmax of logits / T):
        `(logp, mask)`, both `[B, max_response_len]`.

        Sequences are right-padded (causal attention makes the padding invisible to real
        tokens), and logits are computed only for the tail that holds responses.
        """
        pad = self.tokenizer.pad_token_id
        input_ids, attention = self._right_padded(prompt_ids, response_ids)
        width = input_ids.shape[1]
        resp_len = max(len(r) for r in response_ids)
        min_prompt = min(len(p) for p in prompt_ids)
        keep = width - min_prompt + 1  # logits for positions min_prompt-1 .. width-1
        with self.autocast():
            out = self.model(input_ids=input_ids, attention_mask=attention, logits_to_keep=keep)
        logits = out.logits.float() / temperature  # [B, keep, V]; column c is position width-keep+c
        offset = width - keep
        rows = len(response_ids)
        gather_pos = torch.zeros((rows, resp_len), dtype=torch.long)
        targets = torch.full((rows, resp_len), pad, dtype=torch.long)
        mask = torch.zeros((rows, resp_len), dtype=torch.bool)
        for b, (p, r) in enumerate(zip(prompt_ids, response_ids)):
            k = len(r)
            gather_pos[b, :k] = torch.arange(len(p) - 1, len(p) - 1 + k) - offset
            targets[b, :k] = torch.tensor(list(r))
            mask[b, :k] = True
        gather_pos, targets, mask = gather_pos.to(self.device), targets.to(self.device), mask.to(self.device)
        picked = logits.gather(1, gather_pos[:, :, None].expand(-1, -1, logits.shape[-1]))  # [B, R, V]
        logp = picked.gather(-1, targets[:, :, None])[:, :, 0] - torch.logsumexp(picked, dim=-1)
        return logp.masked_fill(~mask, 0.0), mask

    def _right_padded(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
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

    def response_hidden(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Final hidden states at the positions that predict each response token, `[sum |r|, H]`,
        rows in order (response 0's tokens, then response 1's...)."""
        input_ids, attention = self._right_padded(prompt_ids, response_ids)
        with self.autocast():
            hidden = self._causal_lm().model(input_ids=input_ids, attention_mask=attention).last_hidden_state
        return torch.cat([hidden[b, len(p) - 1 : len(p) - 1 + len(r)] for b, (p, r) in enumerate(zip(prompt_ids, response_ids))])

    @torch.no_grad()
    def token_kl(
        self, prompts: Sequence[Messages], responses: Sequence[Sequence[int]], temperature: float = 1.0,
        reference: "TorchBackend | None" = None, batch_size: int = 16, chunk_elements: int = 2**24,
    ) -> list[np.ndarray]:
        """Exact KL(self || reference) = sum_v p(v) (log p(v) - log q(v)) over the vocabulary at
        every response position, both distributions at `temperature`; one array per response.

        `reference` None = this policy with its adapter off (the base). Logits are made from the
        final hidden states `chunk_elements // V` positions at a time, so a 150k vocabulary never
        needs a `[B, T, V]` tensor.
        """
        out: list[np.ndarray] = []
        ref = reference or self
        for start in range(0, len(prompts), batch_size):
            p_ids = [self.prompt_ids(p) for p in prompts[start : start + batch_size]]
            r_ids = [list(r) for r in responses[start : start + batch_size]]
            if not any(r_ids):
                out += [np.zeros(0, dtype=np.float32) for _ in r_ids]
                continue
            hidden = self.response_hidden(p_ids, r_ids)
            with self.adapter_disabled() if reference is None else contextlib.nullcontext():
                ref_hidden = ref.response_hidden(p_ids, r_ids)
            step = max(1, chunk_elements // self.lm_head(hidden[:1]).shape[-1])
            parts = []
            for c in range(0, hidden.shape[0], step):
                with self.autocast():
                    lp = F.log_softmax(self.lm_head(hidden[c : c + step]).float() / temperature, dim=-1)
                with ref.autocast():
                    lq = F.log_softmax(ref.lm_head(ref_hidden[c : c + step].to(ref.device)).float() / temperature, dim=-1)
                parts.append((lp.exp() * (lp - lq.to(lp.device))).sum(-1).cpu())
            flat = torch.cat(parts).double().numpy()
            bounds = np.cumsum([0] + [len(r) for r in r_ids])
            out += [flat[bounds[i] : bounds[i + 1]] for i in range(len(r_ids))]
        return out

    @torch.no_grad()
    def response_logprobs(
        self, prompts: Sequence[Messages], responses: Sequence[Sequence[int]], use_adapter: bool = True,
        batch_size: int = 16, temperature: float = 1.0,
    ) -> list[np.ndarray]:
        result: list[np.ndarray] = []
        ctx = contextlib.nullcontext() if use_adapter else self.adapter_disabled()
        with ctx:
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

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """The base model's view: the reference policy for DPO and KL."""
        if self.has_adapter:
            with self.model.disable_adapter():
                yield
        else:
            yield

    def add_lora(self, settings: LoraSettings) -> None:
        if self.has_adapter:
            return
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(
            r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
            target_modules=list(settings.target_modules), task_type="CAUSAL_LM",
        )
        self.model = get_peft_model(self.model, cfg)

    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        if not self.has_adapter:
            self.tokenizer.save_pretrained(path)

    def num_parameters(self, trainable_only: bool = False) -> int:
        return int(sum(p.numel() for p in self.model.parameters() if p.requires_grad or not trainable_only))

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- training entry points ------------------------------------------------------------
    def train_gspo(self, examples, config) -> TrainStats:
        from outcome_flywheel.models.torch.gspo import train_gspo

        return train_gspo(self, examples, config)

    def train_weighted_dpo(self, pairs, config) -> TrainStats:
        from outcome_flywheel.models.torch.dpo import train_weighted_dpo

        return train_weighted_dpo(self, pairs, config)
