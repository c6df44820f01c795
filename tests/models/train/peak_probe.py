"""The training-peak probes shared by test_training_peak.py and test_training_peak_recomputed.py: Qwen3 at its real
vocabulary with a small body, the six trainer cases, and the setting each runs under."""

from __future__ import annotations

import numpy as np
import torch

from outcome_flywheel.models.provision import qwen3_shapes
from outcome_flywheel.models.torch.backend import TorchBackend
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
from outcome_flywheel.models.train.memory import (
    MEMORY_VARIABLE,
    RECOMPUTE_VARIABLE,
    bytes_per_token,
    head_bytes,
    training_state_bytes,
)
from outcome_flywheel.models.train.sft import train_sft
from outcome_flywheel.models.train.sft_config import SFTConfig, SFTExample

PROBE = dict(
    qwen3_shapes.QWEN3_0_6B,
    num_hidden_layers=2,
    hidden_size=256,
    intermediate_size=768,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
)
WORDS = "the market rose on strong earnings while bonds fell and oil was flat".split()


def prompt(k: int) -> list[dict]:
    return [{"role": "user", "content": f"headline {k}: " + " ".join(WORDS * 4)}]


def text(rng, words: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), words))


def gspo(backend, rng, full: bool, shared: bool = True):
    examples = [
        GSPOExample(prompt(k), ids, [-3.0] * len(ids), float(rng.normal()))
        for k in range(2)
        for ids in (rng.integers(10, 1000, int(rng.integers(90, 140))).tolist() for _ in range(4))
    ]
    config = GSPOConfig(
        lora=None if full else GSPOConfig().lora, batch_size=8, epochs=1, temperature=0.8, share_prompt_prefix=shared
    )
    if full:
        backend.use_master_weights()
    else:
        backend.add_lora(config.lora)
    tokens = sum(len(backend.prompt_ids(e.prompt)) + len(e.response_ids) for e in examples)
    return tokens, lambda: train_gspo(backend, examples, config)


def dpo(backend, rng, unit: str = "sequence"):
    lines = lambda: "\n".join(text(rng, int(n)) for n in rng.integers(8, 20, 4))  # noqa: E731
    pairs = [PreferencePair(prompt(i % 2), lines(), lines(), 1.0) for i in range(4)]
    config = WeightedDPOConfig(epochs=1, batch_size=4, completion_unit=unit)
    backend.add_lora(config.lora)
    # "sequence": a row for the chosen and one for the rejected, each on its prompt; "line": a row per
    # line, all on the pair's prompt, which torch runs once (about the prompt and the lines' tokens)
    prompt_runs = 2 if unit == "sequence" else 1
    tokens = sum(
        prompt_runs * len(backend.prompt_ids(p.prompt))
        + len(backend.encode_response(p.chosen))
        + len(backend.encode_response(p.rejected))
        for p in pairs
    )
    return tokens, lambda: train_weighted_dpo(backend, pairs, config)


def sft(backend, rng):
    examples = [SFTExample(prompt(i % 2), text(rng, 110)) for i in range(6)]
    config = SFTConfig(epochs=1, batch_size=6)
    backend.add_lora(config.lora)
    tokens = sum(len(backend.prompt_ids(e.prompt)) + len(backend.encode_response(e.completion)) for e in examples)
    return tokens, lambda: train_sft(backend, examples, config)


CASES = {
    "gspo-lora": lambda b, rng: gspo(b, rng, full=False),
    "gspo-full": lambda b, rng: gspo(b, rng, full=True),
    "gspo-lora-unshared": lambda b, rng: gspo(b, rng, full=False, shared=False),  # each row runs its prompt
    "dpo": dpo,
    "dpo-lines": lambda b, rng: dpo(b, rng, unit="line"),  # the default: each line a response to the prompt
    "sft": sft,
}


def prepared(probe_dir, monkeypatch, case: str, device: str, recompute: str = "never", share: float = 0.5):
    """The case's backend and run, under a setting of what the step holds whatever its batch plus
    about `share` of the minibatch's activations (`recompute`: as the plan keeps them)."""
    backend = TorchBackend(probe_dir, device=device, dtype="bfloat16", master_weights=case == "gspo-full")
    tokens, train = CASES[case](backend, np.random.default_rng(0))
    per_token = bytes_per_token(backend, recompute=recompute == "always")
    setting = training_state_bytes(backend) + head_bytes(backend) + int(per_token * tokens * share)
    monkeypatch.setenv(MEMORY_VARIABLE, repr(setting / 2**30))
    monkeypatch.setenv(RECOMPUTE_VARIABLE, recompute)
    backend.framework.seed(0)
    return backend, train, setting


def cuda_peak(train):
    """`train()`'s stats and the most CUDA's allocator held during it beyond what it held before."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    stats = train()
    torch.cuda.synchronize()
    return stats, torch.cuda.max_memory_allocated() - before


def build_probe(folder, name: str, shape: dict):
    """`shape` (a Qwen3 config) registered as `name` only while it is built, in bf16 as on a GPU, into `folder`."""
    import pytest

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qwen3_shapes, "SHAPES", {**qwen3_shapes.SHAPES, name: shape})
        return qwen3_shapes.build_model(folder, name, dtype="bfloat16")
