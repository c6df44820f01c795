"""How a training forward computes on a half-precision model (`models/torch/precision.py`): the lean
RMSNorm gives transformers' values bit for bit and autograd's gradients to float32 rounding; a
float32 LoRA adapter on a bf16 model runs under autocast with PEFT's input cast off, its weights
and gradients float32; and both are what `train/memory.py` counts (test_micro_batches.py and
test_training_peak.py measure that)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.provision.qwen3_shapes import build_model
from outcome_flywheel.models.sampling import logprob_tolerance
from outcome_flywheel.models.torch.backend import TorchBackend
from outcome_flywheel.models.torch.precision import NORMS, lean_norms, rms_norm

EPS32 = 2.0**-24  # float32's unit roundoff


def _norm(cls, width: int, dtype) -> torch.nn.Module:
    module = cls(width, eps=1e-6).to(dtype)
    with torch.no_grad():
        module.weight.copy_(torch.linspace(0.5, 1.5, width))
    return module


@pytest.mark.parametrize("cls", [Qwen3RMSNorm, LlamaRMSNorm])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 5, 64), (2, 4, 3, 16)])  # a layer's hidden states; Qwen3's per-head q/k
def test_the_lean_norm_gives_the_modules_values_bit_for_bit(cls, dtype, shape):
    module = _norm(cls, shape[-1], dtype)
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    assert torch.equal(rms_norm(x, module.weight, module.variance_epsilon), module(x))


def test_the_lean_norms_gradients_are_autograds_to_float32_rounding():
    """Against the float64 gradient of the same formula, both autograd's (transformers' module) and
    the lean backward are within the rounding of float32 arithmetic over a row: each gradient value
    is a few products plus a mean of h, so its error is at most (h + 8) eps32 times the sum of the
    magnitudes it is made of (`bound`), a weight's gradient a sum of N such rows."""
    rows, width = 24, 64
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, width, generator=gen) * 2
    upstream = torch.randn(rows, width, generator=gen)
    grads = {}
    for name in ("module", "lean"):
        module = _norm(Qwen3RMSNorm, width, torch.float32)
        leaf = x.clone().requires_grad_(True)
        out = module(leaf) if name == "module" else rms_norm(leaf, module.weight, module.variance_epsilon)
        out.backward(upstream)
        grads[name] = (leaf.grad.double(), module.weight.grad.double())
    # the exact gradient, in float64
    w = torch.linspace(0.5, 1.5, width, dtype=torch.float64)
    x64, g64 = x.double(), upstream.double()
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    normed = x64 * rstd
    gn = g64 * w
    exact_x = rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
    exact_w = (g64 * normed).sum(0)
    bound_x = (width + 8) * EPS32 * rstd * (gn.abs() + normed.abs() * (gn * normed).abs().mean(-1, keepdim=True))
    bound_w = (rows + 8) * EPS32 * (g64 * normed).abs().sum(0)
    for name, (grad_x, grad_w) in grads.items():
        assert torch.all((grad_x - exact_x).abs() <= bound_x), name
        assert torch.all((grad_w - exact_w).abs() <= bound_w), name
    # and the bound is not loose enough to pass a wrong gradient: dropping the mean's term breaks it
    wrong = rstd * gn
    assert not torch.all((wrong - exact_x).abs() <= bound_x)


@pytest.fixture(scope="module")
def bf16_model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("precision") / "model", "qwen3-tiny", dtype="bfloat16")


def test_the_lean_norms_leave_a_models_logits_as_they_were_and_go_away_after(bf16_model_dir):
    backend = TorchBackend(bf16_model_dir, device="cpu", dtype="bfloat16")
    norms = [m for m in backend.model.modules() if type(m).__name__ in NORMS]
    assert len(norms) == 2 * 2 + 2 * 2 + 1  # two layers: two norms and the q/k norms each; the final norm
    ids = torch.tensor([[5, 17, 40, 99, 3, 250]])
    plain = backend.model(input_ids=ids).logits
    with lean_norms(backend.model):
        assert all("forward" in vars(m) for m in norms)
        lean = backend.model(input_ids=ids).logits
    assert torch.equal(lean, plain)
    assert not any("forward" in vars(m) for m in norms)
    with pytest.raises(RuntimeError), lean_norms(backend.model):
        raise RuntimeError("inside")
    assert not any("forward" in vars(m) for m in norms)  # restored whatever happened inside


def test_a_float32_adapter_on_a_bf16_model_trains_under_autocast_with_float32_weights(bf16_model_dir):
    """The training forward keeps no float32 copy of an adapter's input (`saved_tensors_hooks`), the
    adapter's weights and gradients stay float32, and its log-probs are the sampler's (PEFT's float32
    adapter arithmetic) within the bound of two bf16 evaluations (`sampling.LOGPROB_TOLERANCE`)
    once the adapter is not zero."""
    backend = TorchBackend(bf16_model_dir, device="cpu", dtype="bfloat16")
    backend.add_lora(LoraSettings(r=4, alpha=8))
    assert backend.adapter_autocast and backend.lean_norms
    with torch.no_grad():
        for name, p in backend.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.05)  # a trained-looking adapter, not PEFT's zero B
    prompts, responses = [[5, 17, 40, 99]] * 2, [[3, 250, 7, 8, 9], [11, 12]]
    tokens, heads = 2 * 9, backend.model.config.num_attention_heads  # 2 rows of 4 + 5 tokens

    def float32_saved(forward) -> tuple:
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = forward()
        return out, [t.numel() for t in saved if t.dtype == torch.float32]

    (logp, mask), sizes = float32_saved(lambda: backend.batch_logprobs(prompts, responses))
    tuner_layers = [m for m in backend.model.modules() if hasattr(m, "cast_input_dtype_enabled")]
    assert tuner_layers and all(m.cast_input_dtype_enabled for m in tuner_layers)  # PEFT's cast back on
    assert max(sizes) <= tokens * heads  # per-row scalars only (norms' roots, attention's log-sum-exp)
    # the modules as they are keep float32 copies a token wide: PEFT's adapter inputs, the norms'
    ids = torch.tensor([prompts[0] + responses[0]] * 2)
    _, plain = float32_saved(lambda: backend.model(input_ids=ids).logits)
    assert max(plain) >= tokens * backend.model.config.hidden_size
    (logp * mask).sum().backward()
    lora = [(n, p) for n, p in backend.model.named_parameters() if "lora_" in n]
    assert lora and all(p.dtype == torch.float32 and p.grad is not None for _, p in lora)
    assert all(p.grad.dtype == torch.float32 for _, p in lora)
    with torch.no_grad():  # the sampler's arithmetic: PEFT casts the input, float32 adapter products
        reference = backend.model(input_ids=torch.tensor([prompts[0] + responses[0]])).logits.float()
        reference = torch.log_softmax(reference[0, 3:-1], -1).gather(-1, torch.tensor(responses[0])[:, None])[:, 0]
    # two bf16 forwards that round differently: the project's bound for a response's mean gap
    gap = (logp[0, :5].detach() - reference).abs().mean().item()
    assert gap <= logprob_tolerance(torch.bfloat16), gap


def test_gspo_in_bf16_moves_the_policy_toward_the_rewarded_notes(bf16_model_dir):
    """The whole path a GPU takes (bf16 model, float32 adapter under autocast, lean norms), trained:
    notes with a positive advantage gain log-probability against those with a negative one."""
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    backend = TorchBackend(bf16_model_dir, device="cpu", dtype="bfloat16")
    rng = np.random.default_rng(0)
    prompts = [[{"role": "user", "content": f"headline {k}"}] for k in range(2)]
    responses = [rng.integers(10, 200, 12).tolist() for _ in range(8)]
    advantages = [1.0, -1.0] * 4
    before = [float(x.sum()) for x in backend.response_logprobs([prompts[i // 4] for i in range(8)], responses)]
    examples = [
        GSPOExample(prompts[i // 4], r, [-3.0] * len(r), a) for i, (r, a) in enumerate(zip(responses, advantages))
    ]
    backend.framework.seed(0)
    stats = train_gspo(backend, examples, GSPOConfig(learning_rate=2e-2, epochs=4, batch_size=8, objective="gspo"))
    assert np.isfinite(stats.losses).all()
    after = [float(x.sum()) for x in backend.response_logprobs([prompts[i // 4] for i in range(8)], responses)]
    moved = np.subtract(after, before)
    assert moved[::2].mean() > moved[1::2].mean() + 1.0, moved  # nats over 12 tokens
