"""The real path on CUDA (skipped elsewhere): bf16 selective log-probs, the sampler's pi_old
against teacher forcing, a GSPO step, and vLLM's returned log-probs against teacher forcing
(within `sampling.logprob_tolerance`'s bf16 row, which holds for these models of a few layers; the
loop's checkpoint check, for any depth, measures both against a float32 reload: policy/verify.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outcome_flywheel.models.interface import SamplingConfig
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.provision.qwen3_shapes import build_model
from outcome_flywheel.models.sampling import logprob_tolerance
from outcome_flywheel.models.torch import logprobs as tlp
from outcome_flywheel.models.train.gspo import train_gspo
from tests.tolerances import logprob_bound

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = [
    trading_note_messages("Chevron beats estimates", "Output hit a record."),
    trading_note_messages("Chip stocks fall on export curbs", ""),
]


@pytest.fixture(scope="module")
def qwen3_cuda_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("cuda") / "model", "qwen3-tiny", dtype="bfloat16", device="cuda", seed=2)


@pytest.fixture(scope="module")
def wide_cuda_dir(tmp_path_factory):
    return build_model(
        tmp_path_factory.mktemp("wide") / "model", "wide-vocab-toy", dtype="bfloat16", device="cuda", seed=2
    )


def _gaps(recorded, forced):
    return [float(np.mean(np.abs(np.asarray(r, dtype=np.float64) - f))) for r, f in zip(recorded, forced) if len(f)]


def test_bf16_selective_logprobs_equal_plain(wide_cuda_dir):
    from outcome_flywheel.models.torch.backend import TorchBackend

    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(4, 300, 151_936, device="cuda", generator=gen) * 4).to(torch.bfloat16)
    index = torch.randint(151_936, (4, 300), device="cuda", generator=gen)
    got = tlp.selective_log_softmax(logits, index, 0.8)
    # bf16 logits read in fp32 (exactly), the log-softmax in fp32 on the GPU against float64: one
    # implementation's rounding bound (tests/tolerances.py), |z_y/T| + |lse| and the 151,936-term
    # sum's gamma(V); was a flat 1e-5, which held only for this GPU's summation order
    scaled = logits.double() / 0.8
    magnitude = scaled.gather(-1, index.unsqueeze(-1)).squeeze(-1).abs() + torch.logsumexp(scaled, -1).abs()
    bound = torch.as_tensor(logprob_bound(magnitude.cpu().numpy(), 2, 151_936, implementations=1), device="cuda")
    assert (torch.abs(got.double() - tlp.plain_token_logprobs(logits.double(), index, 0.8)) <= bound).all()

    backend = TorchBackend(wide_cuda_dir, device="cuda")
    assert backend.dtype == torch.bfloat16
    rng = np.random.default_rng(0)
    prompts = [[int(x) for x in rng.integers(5, 151_936, 12)] for _ in range(4)]
    responses = [[int(x) for x in rng.integers(5, 151_936, n)] for n in (300, 17, 64, 128)]
    with torch.no_grad():
        logp, mask = backend.batch_logprobs(prompts, responses, temperature=0.8)
        full = [
            tlp.plain_token_logprobs(
                backend.model(input_ids=torch.tensor([p + r], device="cuda")).logits[
                    0, len(p) - 1 : len(p) - 1 + len(r)
                ],
                torch.tensor(r, device="cuda"),
                0.8,
            )
            for p, r in zip(prompts, responses)
        ]
    per_row = [logp[b][mask[b]] for b in range(len(responses))]
    assert max(float((a - b).abs().mean()) for a, b in zip(per_row, full)) <= logprob_tolerance(torch.bfloat16)


def test_sampler_logprobs_match_teacher_forcing_in_bf16(qwen3_cuda_dir):
    from outcome_flywheel.models.torch.backend import TorchBackend

    backend = TorchBackend(qwen3_cuda_dir, device="cuda")
    config = SamplingConfig(temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=48)
    samples = [s for g in backend.sample(PROMPTS, 4, config, seeds=[1, 2]) for s in g]
    forced = backend.response_logprobs(
        [PROMPTS[i // 4] for i in range(8)], [s.token_ids for s in samples], temperature=0.8
    )
    assert max(_gaps([s.logprobs for s in samples], forced)) <= logprob_tolerance(torch.bfloat16)
    stats = backend.graph_sampler.stats  # the default sampler on CUDA is the graph-captured one
    assert stats.calls == 1 and stats.captures >= 1 and not stats.fallbacks


def test_graphs_are_captured_once_per_model_load_and_replayed_after_training(qwen3_cuda_dir):
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    backend = TorchBackend(qwen3_cuda_dir, device="cuda")
    config = SamplingConfig(temperature=0.8, max_new_tokens=48)
    first = backend.sample(PROMPTS, 4, config, seeds=[1, 2])
    captured = backend.graph_sampler.stats.captures
    again = backend.sample(PROMPTS, 4, config, seeds=[1, 2])
    assert [s.token_ids for g in first for s in g] == [s.token_ids for g in again for s in g]
    assert backend.graph_sampler.stats.captures == captured  # same shape: replayed, not captured again
    examples = [
        GSPOExample(PROMPTS[i], s.token_ids, s.logprobs, float(k - 1.5))
        for i, g in enumerate(first)
        for k, s in enumerate(g)
    ]
    engine = backend.graph_sampler
    train_gspo(backend, examples, GSPOConfig(temperature=0.8, learning_rate=1e-2, batch_size=4))  # LoRA: new parameters
    assert backend._graph_sampler is None  # training freed the static cache and its graphs
    trained = [s for g in backend.sample(PROMPTS, 4, config, seeds=[1, 2]) for s in g]
    forced = backend.response_logprobs(
        [PROMPTS[i // 4] for i in range(8)], [s.token_ids for s in trained], temperature=0.8
    )
    assert max(_gaps([s.logprobs for s in trained], forced)) <= logprob_tolerance(
        torch.bfloat16
    )  # the trained weights, not stale ones
    assert (
        backend.graph_sampler is not engine
        and backend.graph_sampler.stats.captures >= 1
        and not backend.graph_sampler.stats.fallbacks
    )


def test_gspo_lora_step_on_cuda_is_finite(qwen3_cuda_dir):
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    backend = TorchBackend(qwen3_cuda_dir, device="cuda")
    groups = backend.sample(PROMPTS, 4, SamplingConfig(temperature=0.8, max_new_tokens=32), seeds=[3, 4])
    examples = [
        GSPOExample(PROMPTS[i], s.token_ids, s.logprobs, float(k - 1.5))
        for i, g in enumerate(groups)
        for k, s in enumerate(g)
    ]
    stats = train_gspo(backend, examples, GSPOConfig(temperature=0.8, learning_rate=1e-3, batch_size=4, epochs=1))
    assert stats.steps == 2 and np.isfinite(stats.losses).all()


@pytest.mark.parametrize(
    "filters", [dict(top_k=0, top_p=1.0), dict(top_k=50, top_p=0.95)], ids=["vllm-logprobs", "teacher-forced"]
)
def test_vllm_logprobs_match_teacher_forcing(qwen3_cuda_dir, filters):
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.torch.vllm_sampling import vllm_unavailable_reason

    if vllm_unavailable_reason():
        pytest.skip(vllm_unavailable_reason())
    backend = TorchBackend(qwen3_cuda_dir, device="cuda", sampler="vllm")
    config = SamplingConfig(temperature=0.8, max_new_tokens=48, **filters)
    groups = backend.sample(PROMPTS, 4, config, seeds=[5, 6])
    again = backend.sample(PROMPTS, 4, config, seeds=[5, 6])
    assert [s.token_ids for g in groups for s in g] == [s.token_ids for g in again for s in g]  # one seed per sample
    samples = [s for g in groups for s in g]
    assert not any(set(s.token_ids) & backend.think_ids for s in samples)
    forced = backend.response_logprobs(
        [PROMPTS[i // 4] for i in range(8)], [s.token_ids for s in samples], temperature=0.8
    )
    assert max(_gaps([s.logprobs for s in samples], forced)) <= logprob_tolerance(torch.bfloat16)
