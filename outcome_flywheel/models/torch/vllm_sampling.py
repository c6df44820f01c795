"""vLLM as the rollout engine on CUDA (`FLYWHEEL_SAMPLER=vllm`, the optional `vllm` extra); the
default stays the project's sampler (`sampling.py`). Used by `TorchBackend` for everything it
samples (rollouts, baseline rollouts, the judge) when the setting asks for it.

What it keeps from the project's sampler:
- prompts go in as token ids (the backend's chat template), never re-tokenised;
- one random stream per sample: each sample is its own request (`n=1`) seeded with
  `row_seed(prompt seed, sample index)`, because vLLM derives a request's `n` children from
  `seed + i`, which would make neighbouring prompts' streams overlap;
- the returned log-probs are pi_old as the loop defines it, log-softmax(logits / T) over the
  whole vocabulary: vLLM's `processed_logprobs` are exactly that when no top-k / top-p filter is
  active; with one, vLLM renormalises over the kept tokens, so the backend teacher-forces the
  sampled tokens at T instead (`needs_teacher_forcing`);
- the think tokens are banned unless thinking is on (`bad_words`), as in the project's sampler;
- the weights are the policy's own: a LoRA checkpoint is its base plus the adapter as a
  `LoRARequest`; a full fine-tune is its merged folder; weights trained in memory and not yet
  saved cannot be served, and the backend samples those itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Sequence

from outcome_flywheel.models.interface import SamplingConfig
from outcome_flywheel.models.sampling import row_seed, uses_nucleus

SAMPLERS = ("torch", "vllm")
# vLLM shares the GPU with the training backend in one process: leave it the rest.
GPU_MEMORY_UTILIZATION = 0.35
MAX_LORA_RANK = 64


def vllm_unavailable_reason() -> str:
    """Why vLLM cannot run here ("" when it can)."""
    import torch

    if not torch.cuda.is_available():
        return "needs CUDA: this machine has no CUDA device"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed: pip install -e '.[vllm]' on the CUDA machine"
    return ""


def require_vllm() -> None:
    reason = vllm_unavailable_reason()
    if reason:
        raise RuntimeError(f"FLYWHEEL_SAMPLER=vllm {reason}")


def needs_teacher_forcing(config: SamplingConfig) -> bool:
    """vLLM's processed log-probs are renormalised after top-k / top-p: pi_old must then come from
    a teacher-forced pass at the sampling temperature."""
    return config.temperature > 0 and (bool(config.top_k) or uses_nucleus(config.top_p))


def request_params(config: SamplingConfig, seed: int, banned_tokens: Sequence[str] = ()) -> dict:
    """`SamplingParams` keyword arguments of one sample (`n=1`), as plain values."""
    params = dict(
        n=1,
        seed=int(seed),
        max_tokens=int(config.max_new_tokens),
        ignore_eos=bool(config.ignore_eos),
        logprobs=0,
        temperature=float(config.temperature) if config.temperature > 0 else 0.0,
        top_k=int(config.top_k) if config.top_k else -1,
        top_p=float(config.top_p) if uses_nucleus(config.top_p) else 1.0,
        skip_special_tokens=True,
    )
    if banned_tokens:
        params["bad_words"] = list(banned_tokens)
    return params


def sample_rows(prompt_count: int, n: int, seeds: Sequence[int]) -> list[tuple[int, int, int]]:
    """(prompt index, sample index, seed) of every request, prompt by prompt."""
    return [(i, j, row_seed(seeds[i], j) % (2**63 - 1)) for i in range(prompt_count) for j in range(n)]


def completion_fields(completion) -> tuple[list[int], list[float]]:
    """Token ids and each sampled token's log-prob from one vLLM `CompletionOutput`."""
    ids = [int(t) for t in completion.token_ids]
    logprobs = []
    for token, entry in zip(ids, completion.logprobs or []):
        logprobs.append(float(entry[token].logprob))
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens (logprobs=0 requested)")
    return ids, logprobs


def adapter_id(path: str | Path) -> int:
    """A stable positive id per adapter folder (vLLM keys loaded adapters by it)."""
    return int(hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:7], 16) + 1


class VLLMEngine:
    """One vLLM engine per model folder and process (building one takes tens of seconds)."""

    _engines: dict[str, "VLLMEngine"] = {}

    def __init__(self, model_path: str | Path, enable_lora: bool):
        require_vllm()
        from vllm import LLM

        self.model_path = str(model_path)
        self.llm = LLM(
            model=self.model_path,
            dtype="bfloat16",
            seed=0,
            gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
            enable_lora=enable_lora,
            max_lora_rank=MAX_LORA_RANK,
            logprobs_mode="processed_logprobs",
        )

    @classmethod
    def for_model(cls, model_path: str | Path, enable_lora: bool) -> "VLLMEngine":
        key = f"{Path(model_path).resolve()}|{enable_lora}"
        if key not in cls._engines:
            cls._engines[key] = cls(model_path, enable_lora)
        return cls._engines[key]

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        n: int,
        config: SamplingConfig,
        seeds: Sequence[int],
        adapter_path: str | Path | None = None,
        banned_tokens: Sequence[str] = (),
    ) -> list[list[tuple[list[int], list[float]]]]:
        """`n` samples per prompt: (token ids, log-probs) grouped by prompt."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows = sample_rows(len(prompt_ids), n, seeds)
        prompts = [TokensPrompt(prompt_token_ids=list(prompt_ids[i])) for i, _, _ in rows]
        params = [SamplingParams(**request_params(config, seed, banned_tokens)) for _, _, seed in rows]
        lora = None
        if adapter_path is not None:
            from vllm.lora.request import LoRARequest

            lora = LoRARequest(Path(adapter_path).name, adapter_id(adapter_path), str(adapter_path))
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
        grouped: list[list[tuple[list[int], list[float]]]] = [[] for _ in prompt_ids]
        for (i, _, _), output in zip(rows, outputs):
            grouped[i].append(completion_fields(output.outputs[0]))
        return grouped
