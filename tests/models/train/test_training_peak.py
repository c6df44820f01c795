"""A training step's peak within `FLYWHEEL_TRAIN_MEMORY_GIB` (models/train/memory.py), counted on the
CPU: every tensor a whole GSPO, DPO or SFT run makes is followed until it is freed
(`tests/live_memory.py`), and the most alive at once, over the loaded model, must not pass the
setting. The model is Qwen3 at its real vocabulary (151,936: the head's log-softmax chunk is as
large as on qwen3-0.6b) with a small body, in bf16 as on a GPU; the setting is what the step holds
whatever its batch plus about half the minibatch's activations, so the budget binds (micro-batches)
and a cost left out of the count shows as a peak over it: the head's chunk (four float32 copies
counted as three fails three cases), DPO's row per line (the old count fails the line case)."""

from __future__ import annotations

import numpy as np
import pytest
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
from tests.live_memory import LiveTensorBytes

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


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qwen3_shapes, "SHAPES", {**qwen3_shapes.SHAPES, "peak-probe": PROBE})
        return qwen3_shapes.build_model(tmp_path_factory.mktemp("peak") / "model", "peak-probe", dtype="bfloat16")


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


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    """`recomputed`'s probe: `PROBE` with 8 layers, built once for its cases."""
    with pytest.MonkeyPatch.context() as patch:
        deep = dict(PROBE, num_hidden_layers=8)
        patch.setattr(qwen3_shapes, "SHAPES", {**qwen3_shapes.SHAPES, "recompute-probe": deep})
        return qwen3_shapes.build_model(tmp_path_factory.mktemp("deep") / "m", "recompute-probe", dtype="bfloat16")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_training_steps_peak_stays_within_the_setting(probe_dir, monkeypatch, case):
    backend, train, setting = prepared(probe_dir, monkeypatch, case, "cpu")
    tracker = LiveTensorBytes(list(backend.model.parameters()) + list(backend.model.buffers()))
    with tracker:
        stats = train()
    assert stats.steps == 1 and stats.extra["micro_batches"] >= 2, stats.extra  # the budget binds
    print(f"{case}: peak {tracker.peak / 2**20:.1f} MiB at {tracker.peak_op}, setting {setting / 2**20:.1f} MiB")
    assert tracker.peak <= setting, (tracker.peak / 2**20, setting / 2**20, tracker.peak_op)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_training_steps_cuda_peak_stays_within_the_setting(probe_dir, monkeypatch, case):
    """The same on CUDA, by the caching allocator's own peak over what was allocated before the run:
    its kernels (cuBLAS, fused AdamW, memory-efficient attention) and its rounding of blocks are what
    a GPU's budget meets. Bound: the setting plus cuBLAS's workspace, which the first matrix product
    on the stream allocates whatever the batch (32 MiB at most: PyTorch's size on Hopper, less elsewhere)."""
    backend, train, setting = prepared(probe_dir, monkeypatch, case, "cuda")
    stats, peak = cuda_peak(train)
    assert stats.steps == 1 and stats.extra["micro_batches"] >= 2, stats.extra
    print(f"{case} (CUDA): peak {peak / 2**20:.1f} MiB over the model, setting {setting / 2**20:.1f} MiB")
    assert peak <= setting + 32 * 2**20, (peak / 2**20, setting / 2**20)


def cuda_peak(train):
    """`train()`'s stats and the most CUDA's allocator held during it beyond what it held before."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    stats = train()
    torch.cuda.synchronize()
    return stats, torch.cuda.max_memory_allocated() - before


def recomputed(model_dir, monkeypatch, case: str, device: str):
    """`prepared` with the layers recomputed (`torch/recompute.py`, `FLYWHEEL_TRAIN_RECOMPUTE=always`),
    on the deeper probe (`deep_dir`) whose head runs in small chunks, so that the layers' share of the
    peak shows (at the real chunk the head's 510 MiB would hide it): each layer's input kept, one
    layer's activations at a time. Three quarters of the activations as the plan counts them: every
    case then takes 2 parts (at a half, DPO's padded pairs go one a part whichever the plan). Also a
    run of the same step keeping every activation under the same setting: (backend, train, setting, kept)."""
    from dataclasses import replace
    from functools import partial

    from outcome_flywheel.models.torch import backend as torch_backend
    from outcome_flywheel.models.torch.logprobs import token_logprobs
    from outcome_flywheel.models.torch.training import FRAMEWORK

    # float32 logits of 13 tokens a chunk at this vocabulary; 27 for the full fine-tune, whose head's
    # backward makes a gradient of the whole embedding per chunk (most of its case's time on a CPU)
    chunk = 2**22 if "full" in case else 2**21
    monkeypatch.setattr(torch_backend, "token_logprobs", partial(token_logprobs, chunk_elements=chunk))
    monkeypatch.setattr(TorchBackend, "framework", replace(FRAMEWORK, logit_chunk_elements=chunk))

    def kept():
        monkeypatch.setenv(RECOMPUTE_VARIABLE, "never")
        return CASES[case](
            TorchBackend(model_dir, device=device, dtype="bfloat16", master_weights="full" in case),
            np.random.default_rng(0),
        )[1]()

    backend, train, setting = prepared(model_dir, monkeypatch, case, device, recompute="always", share=0.75)
    return backend, train, setting, kept


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_recomputed_steps_peak_stays_within_the_setting(deep_dir, monkeypatch, case):
    """The layers recomputed (`recomputed`): the peak within the setting, the budget still binding,
    and keeping every activation under the same setting takes more parts."""
    backend, train, setting, kept = recomputed(deep_dir, monkeypatch, case, "cpu")
    tracker = LiveTensorBytes(list(backend.model.parameters()) + list(backend.model.buffers()))
    with tracker:
        stats = train()
    assert stats.extra["recompute"] is True and stats.extra["micro_batches"] >= 2, stats.extra
    print(
        f"{case} recomputed: peak {tracker.peak / 2**20:.1f} MiB at {tracker.peak_op}, setting {setting / 2**20:.1f} MiB"
    )
    assert tracker.peak <= setting, (tracker.peak / 2**20, setting / 2**20, tracker.peak_op)
    assert kept().extra["micro_batches"] > stats.extra["micro_batches"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_recomputed_steps_cuda_peak_stays_within_the_setting(deep_dir, monkeypatch, case):
    """The same on CUDA, by the allocator's peak (bound as in the CUDA case above): the recomputation
    in the backward pass takes the forward's kernels (`attention_kernels`) and precision."""
    backend, train, setting, _ = recomputed(deep_dir, monkeypatch, case, "cuda")
    stats, peak = cuda_peak(train)
    assert stats.extra["recompute"] is True and stats.extra["micro_batches"] >= 2, stats.extra
    print(f"{case} recomputed (CUDA): peak {peak / 2**20:.1f} MiB over the model, setting {setting / 2**20:.1f} MiB")
    assert peak <= setting + 32 * 2**20, (peak / 2**20, setting / 2**20)


def test_the_allocator_replay_finds_what_is_alive_at_the_peak():
    """benchmarks.training_profile --memory: the replay of CUDA's allocator history takes the most
    bytes allocated at once and groups the blocks alive then by the frame that made them."""
    from benchmarks.training_profile import NO_FRAME, live_at_peak

    site = [{"filename": "/x/site-packages/torch/nn/functional.py", "line": 9, "name": "silu"}]
    site += [{"filename": "/x/site-packages/transformers/models/qwen3/modeling_qwen3.py", "line": 70, "name": "fwd"}]
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": site},
        {"action": "alloc", "addr": 2, "size": 50, "frames": []},
        {"action": "free_requested", "addr": 2, "size": 50},
        {"action": "free_completed", "addr": 2, "size": 50},
        {"action": "alloc", "addr": 3, "size": 70, "frames": site},
        {"action": "alloc", "addr": 4, "size": 40, "frames": []},  # the peak: 100 + 70 + 40
        {"action": "free_requested", "addr": 1, "size": 100},
        {"action": "free_requested", "addr": 99, "size": 500},  # allocated before the history began
        {"action": "alloc", "addr": 5, "size": 200, "frames": site},  # 210 - 500 + 200: below the peak
    ]
    peak, groups = live_at_peak(trace)
    assert peak == 210
    assert groups == {"qwen3/modeling_qwen3.py:70 fwd": [170, 2], NO_FRAME: [40, 1]}


def test_the_responses_forward_leaves_no_grown_prompt_cache_at_its_peak(tmp_path, monkeypatch):
    """torch/prefix_cache.py: the responses of a shared prompt read its keys and values through a
    cache that stores nothing, so past what the forward keeps for the backward only one layer's
    transients are alive at once. Grown as transformers' own cache grows, every layer would add its
    rows' keys and values at the full length (on an H200, 0.63 GiB of a GSPO step's 7.4)."""
    from outcome_flywheel.models.torch.prefix_cache import shared_prefix_hidden
    from outcome_flywheel.models.torch.static_cache import attention_kernels

    deep = dict(PROBE, num_hidden_layers=12, hidden_size=128, intermediate_size=256, head_dim=32)
    monkeypatch.setattr(qwen3_shapes, "SHAPES", {**qwen3_shapes.SHAPES, "deep-probe": deep})
    model_dir = qwen3_shapes.build_model(tmp_path / "m", "deep-probe", dtype="bfloat16")
    backend = TorchBackend(model_dir, device="cpu", dtype="bfloat16")
    backend.add_lora(GSPOConfig().lora)
    rng = np.random.default_rng(0)
    prompts = [backend.prompt_ids(prompt(k)) for k in range(2) for _ in range(4)]
    responses = [rng.integers(10, 1000, 120).tolist() for _ in prompts]
    tracker = LiveTensorBytes(list(backend.model.parameters()) + list(backend.model.buffers()))
    with tracker, backend.forward_precision(), attention_kernels(backend.device):
        hidden, _, _ = shared_prefix_hidden(backend, prompts, responses)
        kept = sum(size for ref, size in tracker.live.values() if not ref.expired())
    positions = len(prompts[0]) + 120
    grown_layer = 2 * deep["num_key_value_heads"] * deep["head_dim"] * 2 * len(prompts) * positions
    transient = tracker.peak - kept
    print(f"kept {kept / 2**20:.1f} MiB, peak {tracker.peak / 2**20:.1f}, a grown layer {grown_layer / 2**20:.2f}")
    assert transient < deep["num_hidden_layers"] / 2 * grown_layer, (transient, grown_layer)
