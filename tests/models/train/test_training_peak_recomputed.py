"""A training step's peak with the layers recomputed (`torch/recompute.py`), counted on the CPU as in
test_training_peak.py (the probes: peak_probe.py), on a deeper probe whose head runs in small chunks so that the
layers' share of the peak shows. A file of its own so that a test worker takes it beside the other."""

from __future__ import annotations

import pytest
import torch

from outcome_flywheel.models.torch.backend import TorchBackend
from outcome_flywheel.models.train.memory import RECOMPUTE_VARIABLE
from tests.live_memory import LiveTensorBytes
from tests.models.train.peak_probe import CASES, PROBE, build_probe, cuda_peak, prepared

DEEP_VOCAB = 16_384  # past the fixture tokenizer's ids (~2,050)


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    """`recomputed`'s probe: `PROBE` with 8 layers and a vocabulary of 16,384 (the real one's head is
    test_training_peak.py's; here it would be most of the time), built once for its cases."""
    shape = dict(PROBE, num_hidden_layers=8, vocab_size=DEEP_VOCAB)
    return build_probe(tmp_path_factory.mktemp("deep") / "m", "recompute-probe", shape)


def recomputed(model_dir, monkeypatch, case: str, device: str):
    """`prepared` with the layers recomputed (`torch/recompute.py`, `FLYWHEEL_TRAIN_RECOMPUTE=always`),
    on the deeper probe (`deep_dir`) whose head runs in small chunks, so that the layers' share of the
    peak shows (at the real chunk the head's copies would hide it): each layer's input kept, one
    layer's activations at a time. Three quarters of the activations as the plan counts them: every
    case then takes 2 parts (at a half, DPO's padded pairs go one a part whichever the plan). Also the
    parts the same minibatches would take keeping every activation under the same setting, as the
    trainer's own `memory_plan` call plans them (filled in when the step runs; a second training would
    only count them again): (backend, train, setting, kept_parts)."""
    from dataclasses import replace
    from functools import partial

    from outcome_flywheel.models.torch import backend as torch_backend
    from outcome_flywheel.models.torch.logprobs import token_logprobs
    from outcome_flywheel.models.torch.training import FRAMEWORK
    from outcome_flywheel.models.train import gspo, memory, shards

    # float32 logits of 128 tokens a chunk at this vocabulary: the head's three copies 24 MiB
    chunk = 2**21
    monkeypatch.setattr(torch_backend, "token_logprobs", partial(token_logprobs, chunk_elements=chunk))
    monkeypatch.setattr(TorchBackend, "framework", replace(FRAMEWORK, logit_chunk_elements=chunk))
    kept_parts: list[int] = []

    def planned(backend, minibatches, cost_of, shared):
        with pytest.MonkeyPatch.context() as setting:
            setting.setenv(RECOMPUTE_VARIABLE, "never")
            kept = memory.memory_plan(backend, minibatches, cost_of, shared)
        cost = cost_of(kept.costs)
        kept_parts.append(sum(len(memory.split_by_cost(list(b), cost, kept.limit)) for b in minibatches))
        return memory.memory_plan(backend, minibatches, cost_of, shared)

    for trainer in (gspo, shards):
        monkeypatch.setattr(trainer, "memory_plan", planned)
    backend, train, setting = prepared(model_dir, monkeypatch, case, device, recompute="always", share=0.75)
    return backend, train, setting, kept_parts


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_recomputed_steps_peak_stays_within_the_setting(deep_dir, monkeypatch, case):
    """The layers recomputed (`recomputed`): the peak within the setting, the budget still binding,
    and keeping every activation under the same setting takes more parts."""
    backend, train, setting, kept_parts = recomputed(deep_dir, monkeypatch, case, "cpu")
    tracker = LiveTensorBytes(list(backend.model.parameters()) + list(backend.model.buffers()))
    with tracker:
        stats = train()
    assert stats.extra["recompute"] is True and stats.extra["micro_batches"] >= 2, stats.extra
    print(
        f"{case} recomputed: peak {tracker.peak / 2**20:.1f} MiB at {tracker.peak_op}, setting {setting / 2**20:.1f} MiB"
    )
    assert tracker.peak <= setting, (tracker.peak / 2**20, setting / 2**20, tracker.peak_op)
    assert kept_parts and kept_parts[-1] > stats.extra["micro_batches"], (kept_parts, stats.extra)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_recomputed_steps_cuda_peak_stays_within_the_setting(deep_dir, monkeypatch, case):
    """The same on CUDA, by the allocator's peak (bound as in test_training_peak.py's CUDA case): the recomputation
    in the backward pass takes the forward's kernels (`attention_kernels`) and precision."""
    backend, train, setting, _ = recomputed(deep_dir, monkeypatch, case, "cuda")
    stats, peak = cuda_peak(train)
    assert stats.extra["recompute"] is True and stats.extra["micro_batches"] >= 2, stats.extra
    print(f"{case} recomputed (CUDA): peak {peak / 2**20:.1f} MiB over the model, setting {setting / 2**20:.1f} MiB")
    assert peak <= setting + 32 * 2**20, (peak / 2**20, setting / 2**20)
