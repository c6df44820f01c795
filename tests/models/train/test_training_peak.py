"""A training step's peak within `FLYWHEEL_TRAIN_MEMORY_GIB` (models/train/memory.py), counted on the
CPU: every tensor a whole GSPO, DPO or SFT run makes is followed until it is freed
(`tests/live_memory.py`), and the most alive at once, over the loaded model, must not pass the
setting. The model is Qwen3 at its real vocabulary (151,936: the head's log-softmax chunk is as
large as on qwen3-0.6b) with a small body, in bf16 as on a GPU; the setting is what the step holds
whatever its batch plus about half the minibatch's activations, so the budget binds (micro-batches)
and a cost left out of the count shows as a peak over it: the head's chunk (three float32 copies
counted as two fails five of the six cases), DPO's row per line (the old count fails the line case)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outcome_flywheel.models.torch.backend import TorchBackend
from outcome_flywheel.models.train.gspo_config import GSPOConfig
from tests.live_memory import LiveTensorBytes
from tests.models.train.peak_probe import CASES, PROBE, build_probe, cuda_peak, prepared, prompt


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    return build_probe(tmp_path_factory.mktemp("peak") / "model", "peak-probe", PROBE)


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
    model_dir = build_probe(tmp_path / "m", "deep-probe", deep)
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
