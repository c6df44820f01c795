"""The static decode step's small pieces (`models/torch/fused_decode.py`): unfused, each is its
module's arithmetic bit for bit; fused (`torch.compile`: Inductor's C++ here, Triton on CUDA),
the sampler still writes the eager sampler's tokens, with pi_old within the fp32 bound, on Qwen3
blocks (q/k norms), Llama blocks and under LoRA."""

from __future__ import annotations

import pytest
import torch

from outcome_flywheel.models.torch.fused_decode import DecodeKernels, add_rms_norm, rms_norm, silu_gate
from tests.models.test_static_decode import PROMPTS, RULES, _assert_same, _backends, llama_dir, qwen3_dir  # noqa: F401

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_unfused_pieces_are_the_modules_arithmetic_bit_for_bit():
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

    torch.manual_seed(0)
    norm = Qwen3RMSNorm(64, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    for dtype in (torch.float32, torch.bfloat16):
        x, delta = torch.randn(5, 64, dtype=dtype), torch.randn(5, 64, dtype=dtype)
        module = norm.to(dtype)
        assert torch.equal(rms_norm(x, module.weight, module.variance_epsilon), module(x))
        hidden, normed = add_rms_norm(x, delta, module.weight, module.variance_epsilon)
        assert torch.equal(hidden, x + delta) and torch.equal(normed, module(x + delta))
    mlp = Qwen3MLP(Qwen3Config(hidden_size=64, intermediate_size=96))
    x = torch.randn(5, 64)
    assert torch.equal(mlp.down_proj(silu_gate(mlp.gate_proj(x), mlp.up_proj(x))), mlp(x))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_step_writes_the_eager_samplers_tokens(qwen3_dir, llama_dir, device):
    for model_dir, lora, rule in (
        (qwen3_dir, True, "top-k+top-p"),
        (llama_dir, False, "greedy"),
        (qwen3_dir, False, "nucleus-only"),
    ):
        config = RULES[rule]
        eager, fused = _backends(model_dir, device, lora=lora, fuse_decode=True)
        _assert_same(
            eager.sample(PROMPTS, 3, config, seeds=[4, 5, 6]),
            fused.sample(PROMPTS, 3, config, seeds=[4, 5, 6]),
            eager,
            config,
        )
        kernels = fused.graph_sampler.kernels
        assert kernels.fused_pieces == list(DecodeKernels.NAMES), kernels.failures  # it really ran compiled


@pytest.mark.parametrize("device", DEVICES)
def test_flex_attention_in_the_step_writes_the_eager_samplers_tokens(qwen3_dir, device):
    """FlexAttention as the step's attention (an option not yet measured on a GPU), pieces unfused."""
    config = RULES["top-k+top-p"]
    eager, flex = _backends(qwen3_dir, device, fuse_decode=False, decode_attention="flex")
    _assert_same(
        eager.sample(PROMPTS, 3, config, seeds=[4, 5, 6]),
        flex.sample(PROMPTS, 3, config, seeds=[4, 5, 6]),
        eager,
        config,
    )
    assert flex.graph_sampler.kernels.fused_pieces == ["flex_attention"], flex.graph_sampler.kernels.failures
    with pytest.raises(ValueError, match="decode_attention must be one of"):
        _backends(qwen3_dir, device, decode_attention="flash")


def test_a_piece_the_compiler_fails_runs_unfused_and_right_and_the_others_stay_fused(caplog):
    def compile_all_but_the_norm(plain, **options):
        def compiled(*args):
            if plain is rms_norm:
                raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
            return plain(*args)

        return compiled

    kernels = DecodeKernels(fused=True, compile=compile_all_but_the_norm)
    x, delta, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    for _ in range(2):  # the failed piece is not compiled again
        assert torch.equal(kernels.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6))
    assert kernels.failures == {
        "rms_norm": "RuntimeError: Failed to find C compiler. Please specify via CC environment variable."
    }
    assert caplog.text.count("rms_norm not fused") == 1
    hidden, normed = kernels.add_rms_norm(x, delta, w, 1e-6)
    assert torch.equal(normed, add_rms_norm(x, delta, w, 1e-6)[1])
    assert kernels.fused_pieces == [name for name in DecodeKernels.NAMES if name != "rms_norm"]
