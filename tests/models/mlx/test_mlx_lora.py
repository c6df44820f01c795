"""LoRA adapters across frameworks: mlx-lm LoRA saved in PEFT layout, PEFT adapters loaded by
mlx, and the converter (functions and CLI) both ways. Every adapter here has non-zero B
matrices, so a wrong transpose, key or scale shows up in the log-probs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from outcome_flywheel.models.mlx import lora_convert
from tests.mlx_fixtures import (
    PROMPTS,
    RESPONSES,
    SMALL_LORA,
    max_abs_diff,
    mlx_adapter_dir,
    perturb_torch_lora,
    require_mlx,
)
from tests.tolerances import assert_logprobs_close, gamma, kl_tolerances, logprob_tolerances, worst_ratio


# -- the pure functions (no framework needed) ----------------------------------------------
def _peft_tensors(rng, r=4, d_in=6, d_out=5):
    return {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": rng.normal(size=(r, d_in)).astype(np.float32),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": rng.normal(size=(d_out, r)).astype(
            np.float32
        ),
        "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight": rng.normal(size=(r, d_in)).astype(np.float32),
        "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight": rng.normal(size=(d_out, r)).astype(np.float32),
    }


def test_peft_to_mlx_transposes_renames_and_scales():
    rng = np.random.default_rng(0)
    peft = _peft_tensors(rng)
    config = {
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "target_modules": ["q_proj", "down_proj"],
    }
    mlx_tensors, mlx_config = lora_convert.peft_to_mlx(peft, config)
    a = mlx_tensors["model.layers.0.self_attn.q_proj.lora_a"]
    b = mlx_tensors["model.layers.0.self_attn.q_proj.lora_b"]
    assert a.shape == (6, 4) and b.shape == (4, 5)
    assert mlx_config["lora_parameters"] == {
        "rank": 4,
        "scale": 4.0,
        "dropout": 0.05,
        "keys": ["mlp.down_proj", "self_attn.q_proj"],
    }
    assert mlx_config["num_layers"] == 2
    # The update each framework adds to x W^T is the same matrix.
    x = rng.normal(size=(3, 6)).astype(np.float32)
    A = peft["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    B = peft["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    # Two fp32 products of inner lengths 6 and 4 and a scaling: each within gamma(6 + 4 + 1) of the
    # absolute-value product (Higham & Mary, tests/tolerances.py), not relative to an entry that may
    # cancel to near zero (was rtol=1e-5). A transposed factor or a wrong scale is off by O(1).
    bound = 2 * gamma(6 + 4 + 1) * 4.0 * (np.abs(x) @ np.abs(A.T)) @ np.abs(B.T)
    assert (np.abs(4.0 * (x @ a) @ b - (16 / 4) * x @ A.T @ B.T) <= bound).all()
    # And back again, exactly.
    back, peft_config = lora_convert.mlx_to_peft(mlx_tensors, mlx_config)
    assert back.keys() == peft.keys()
    for k in peft:
        np.testing.assert_array_equal(back[k], peft[k])
    assert (peft_config["r"], peft_config["lora_alpha"], peft_config["target_modules"]) == (
        4,
        16,
        ["down_proj", "q_proj"],
    )


def test_rslora_scale_and_unsupported_adapters_are_refused():
    rng = np.random.default_rng(1)
    _, cfg = lora_convert.peft_to_mlx(_peft_tensors(rng), {"r": 4, "lora_alpha": 8, "use_rslora": True})
    assert cfg["lora_parameters"]["scale"] == pytest.approx(8 / 2.0)
    for bad in ({"use_dora": True}, {"rank_pattern": {"q_proj": 8}}, {"peft_type": "IA3"}, {"bias": "all"}):
        with pytest.raises(lora_convert.AdapterFormatError):
            lora_convert.peft_to_mlx(_peft_tensors(rng), {"r": 4, "lora_alpha": 8, **bad})
    with pytest.raises(lora_convert.AdapterFormatError):
        lora_convert.peft_to_mlx({"base_model.model.lm_head.weight": np.zeros((2, 2))}, {"r": 4, "lora_alpha": 8})
    with pytest.raises(lora_convert.AdapterFormatError):
        lora_convert.mlx_to_peft({}, {"fine_tune_type": "dora", "lora_parameters": {"rank": 4, "scale": 1.0}})


def test_mlx_lm_adapter_on_last_blocks_keeps_its_layers():
    rng = np.random.default_rng(2)
    tensors = {
        "model.layers.2.self_attn.v_proj.lora_a": rng.normal(size=(6, 2)).astype(np.float32),
        "model.layers.2.self_attn.v_proj.lora_b": rng.normal(size=(2, 5)).astype(np.float32),
        "model.layers.3.self_attn.v_proj.lora_a": rng.normal(size=(6, 2)).astype(np.float32),
        "model.layers.3.self_attn.v_proj.lora_b": rng.normal(size=(2, 5)).astype(np.float32),
    }
    config = {
        "fine_tune_type": "lora",
        "num_layers": 2,
        "lora_parameters": {"rank": 2, "scale": 10.0, "dropout": 0.0, "keys": ["self_attn.v_proj"]},
    }
    peft, peft_config = lora_convert.mlx_to_peft(tensors, config, "Qwen/Qwen3-0.6B")
    assert peft_config["lora_alpha"] == 20 and peft_config["layers_to_transform"] == [2, 3]
    assert peft_config["base_model_name_or_path"] == "Qwen/Qwen3-0.6B"
    assert peft["base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight"].shape == (5, 2)


# -- across frameworks, on tiny-local ------------------------------------------------------
@pytest.fixture(scope="module")
def responses(tiny_model_dir):
    from outcome_flywheel.models.torch.backend import TorchBackend

    base = TorchBackend(tiny_model_dir, device="cpu")
    return [base.encode_response(r) for r in RESPONSES]


@pytest.fixture(scope="module")
def mlx_saved_adapter(tiny_model_dir, tmp_path_factory):
    require_mlx()
    return mlx_adapter_dir(tiny_model_dir, tmp_path_factory.mktemp("mlx-lora") / "adapter")


@pytest.fixture(scope="module")
def torch_saved_adapter(tiny_model_dir, tmp_path_factory):
    """A PEFT adapter made by torch (PEFT's own init) with random non-zero factors."""
    from outcome_flywheel.models.torch.backend import TorchBackend

    backend = TorchBackend(tiny_model_dir, device="cpu")
    backend.add_lora(SMALL_LORA)
    perturb_torch_lora(backend)
    out = tmp_path_factory.mktemp("torch-lora") / "adapter"
    backend.save(out)
    return out


def test_mlx_adapter_saved_in_peft_layout_scores_the_same_in_torch(tiny_model_dir, mlx_saved_adapter, responses):
    require_mlx()
    from outcome_flywheel.models.mlx.backend import MLXBackend
    from outcome_flywheel.models.torch.backend import TorchBackend

    assert sorted(p.name for p in mlx_saved_adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((mlx_saved_adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", SMALL_LORA.r, SMALL_LORA.alpha)
    assert set(config["target_modules"]) == set(SMALL_LORA.target_modules)

    mlx_policy = MLXBackend(tiny_model_dir, adapter_path=mlx_saved_adapter)
    torch_policy = TorchBackend(tiny_model_dir, adapter_path=mlx_saved_adapter, device="cpu")
    assert mlx_policy.has_adapter and torch_policy.has_adapter
    # both read the adapter's own settings back (what a carried adapter trains with)
    saved = replace(SMALL_LORA, target_modules=sorted(SMALL_LORA.target_modules))
    assert mlx_policy.adapter_settings() == torch_policy.adapter_settings() == saved
    assert mlx_policy.num_parameters(trainable_only=True) == torch_policy.num_parameters(trainable_only=True)
    adapted_mlx = mlx_policy.response_logprobs(PROMPTS, responses)
    adapted_torch = torch_policy.response_logprobs(PROMPTS, responses)
    base_mlx = mlx_policy.response_logprobs(PROMPTS, responses, use_adapter=False)
    base_torch = torch_policy.response_logprobs(PROMPTS, responses, use_adapter=False)
    # Two fp32 forwards: per token within the rounding bound of tests/tolerances.py (was a flat 1e-4).
    adapted_tol = logprob_tolerances(torch_policy, PROMPTS, responses)
    assert worst_ratio(adapted_mlx, base_mlx, adapted_tol) > 1.0  # the adapter really changes the policy
    assert_logprobs_close(adapted_mlx, adapted_torch, adapted_tol)
    assert_logprobs_close(base_mlx, base_torch, logprob_tolerances(torch_policy, PROMPTS, responses, use_adapter=False))
    # The base view equals a policy with no adapter at all.
    plain = MLXBackend(tiny_model_dir)
    assert max_abs_diff(base_mlx, plain.response_logprobs(PROMPTS, responses)) == 0.0


def test_torch_peft_adapter_scores_the_same_in_mlx(tiny_model_dir, torch_saved_adapter, responses):
    require_mlx()
    from outcome_flywheel.models.mlx.backend import MLXBackend
    from outcome_flywheel.models.torch.backend import TorchBackend

    torch_policy = TorchBackend(tiny_model_dir, adapter_path=torch_saved_adapter, device="cpu")
    mlx_policy = MLXBackend(tiny_model_dir, adapter_path=torch_saved_adapter)
    adapted_torch = torch_policy.response_logprobs(PROMPTS, responses)
    assert max_abs_diff(adapted_torch, torch_policy.response_logprobs(PROMPTS, responses, use_adapter=False)) > 1e-2
    # mlx against torch: per token within the rounding bound of two fp32 forwards (was a flat 1e-4).
    assert_logprobs_close(
        mlx_policy.response_logprobs(PROMPTS, responses),
        adapted_torch,
        logprob_tolerances(torch_policy, PROMPTS, responses),
    )


def test_cli_conversion_both_ways_keeps_the_logprobs(tiny_model_dir, torch_saved_adapter, responses, tmp_path):
    require_mlx()
    from mlx_lm.utils import load

    from outcome_flywheel.models.mlx.backend import MLXBackend
    from outcome_flywheel.models.torch.backend import TorchBackend

    reference_policy = TorchBackend(tiny_model_dir, adapter_path=torch_saved_adapter, device="cpu")
    reference = reference_policy.response_logprobs(PROMPTS, responses)
    # Converted adapters (the scale moves between config and weights) in another or the same
    # framework: per token within the rounding bound of two fp32 forwards (was a flat 1e-4).
    tolerances = logprob_tolerances(reference_policy, PROMPTS, responses)

    # PEFT -> mlx-lm: a folder mlx-lm itself loads, and our backend scores the same.
    assert lora_convert.main(["peft-to-mlx", str(torch_saved_adapter), str(tmp_path / "mlx")]) == 0
    assert (tmp_path / "mlx" / "adapters.safetensors").exists()
    model, _ = load(str(tiny_model_dir), adapter_path=str(tmp_path / "mlx"))
    assert sum(1 for name, _ in model.named_modules() if name.endswith("q_proj")) == 4
    assert_logprobs_close(
        MLXBackend(tiny_model_dir, adapter_path=tmp_path / "mlx").response_logprobs(PROMPTS, responses),
        reference,
        tolerances,
    )

    # ... and mlx-lm -> PEFT again: torch (PEFT) loads it and scores the same.
    assert lora_convert.main(["mlx-to-peft", str(tmp_path / "mlx"), str(tmp_path / "peft")]) == 0
    again = TorchBackend(tiny_model_dir, adapter_path=tmp_path / "peft", device="cpu").response_logprobs(
        PROMPTS, responses
    )
    assert_logprobs_close(again, reference, tolerances)

    with pytest.raises(lora_convert.AdapterFormatError):
        lora_convert.convert_dir(tmp_path / "mlx", tmp_path / "wrong", "peft-to-mlx")  # an mlx-lm folder is not PEFT


def test_add_lora_targets_and_trainable_parameters_match_torch(tiny_model_dir):
    require_mlx()
    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.mlx.backend import MLXBackend
    from outcome_flywheel.models.torch.backend import TorchBackend

    settings = LoraSettings(r=2, alpha=4, target_modules=("q_proj", "v_proj"))
    mlx_policy, torch_policy = MLXBackend(tiny_model_dir), TorchBackend(tiny_model_dir, device="cpu")
    mlx_policy.add_lora(settings)
    torch_policy.add_lora(settings)
    names = sorted(name for name, _ in mlx_policy.lora_modules())
    assert names == [f"model.layers.{i}.self_attn.{p}" for i in range(4) for p in ("q_proj", "v_proj")]
    assert mlx_policy.num_parameters(trainable_only=True) == torch_policy.num_parameters(trainable_only=True)
    assert mlx_policy.lora_modules()[0][1].scale == pytest.approx(2.0)
    mlx_policy.add_lora(LoraSettings(r=8))  # no-op once an adapter is there
    assert mlx_policy.lora_modules()[0][1].lora_a.shape[1] == 2


def test_save_without_adapter_writes_a_full_hf_folder_both_backends_load(tiny_model_dir, tmp_path, responses):
    require_mlx()
    from outcome_flywheel.models.mlx.backend import MLXBackend
    from outcome_flywheel.models.torch.backend import TorchBackend

    policy = MLXBackend(tiny_model_dir)
    policy.save(tmp_path / "full")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "full").iterdir()}
    base = TorchBackend(tiny_model_dir, device="cpu")
    reference = base.response_logprobs(PROMPTS, responses)
    # per token within the rounding bound of two fp32 forwards (tests/tolerances.py; was a flat 1e-4)
    tolerances = logprob_tolerances(base, PROMPTS, responses)
    assert_logprobs_close(
        TorchBackend(tmp_path / "full", device="cpu").response_logprobs(PROMPTS, responses), reference, tolerances
    )
    assert_logprobs_close(MLXBackend(tmp_path / "full").response_logprobs(PROMPTS, responses), reference, tolerances)


def test_token_kl_matches_torch_with_an_adapter_and_a_separate_reference(tiny_model_dir, mlx_saved_adapter, responses):
    """The exact per-token KL(policy || base) at temperature 0.8, mlx against torch (itself tested
    against a brute force in tests/daily_rl/reward/test_daily_signal.py), with the adapter off as the base and with
    a separate base model as the reference."""
    require_mlx()
    from outcome_flywheel.models.mlx.backend import MLXBackend
    from outcome_flywheel.models.torch.backend import TorchBackend

    mlx_policy = MLXBackend(tiny_model_dir, adapter_path=mlx_saved_adapter)
    torch_policy = TorchBackend(tiny_model_dir, adapter_path=mlx_saved_adapter, device="cpu")
    kl_torch = torch_policy.token_kl(PROMPTS, responses, temperature=0.8)
    kl_mlx = mlx_policy.token_kl(PROMPTS, responses, temperature=0.8, chunk_elements=4000)  # several chunks
    assert np.mean(np.concatenate(kl_torch)) > 1e-3
    # KL from two fp32 implementations' logits: per position within the bound of `kl_tolerances`
    # (the log-probs' rounding, weighted by p, plus p's own error times E_p|lp - lq|; was a flat 1e-4).
    tolerances = kl_tolerances(torch_policy, PROMPTS, responses, temperature=0.8)
    assert worst_ratio(kl_mlx, kl_torch, tolerances) <= 1.0
    assert worst_ratio([1.01 * k for k in kl_mlx], kl_torch, tolerances) > 1.0  # a 1% error shows
    separate = mlx_policy.token_kl(PROMPTS, responses, temperature=0.8, reference=MLXBackend(tiny_model_dir))
    assert worst_ratio(separate, kl_torch, tolerances) <= 1.0
    # Without an adapter the base view is the policy itself: the same forward twice gives the same
    # bits and a KL of exactly 0; 1e-6 only bounds it from above.
    assert max(float(np.abs(k).max()) for k in MLXBackend(tiny_model_dir).token_kl(PROMPTS, responses)) < 1e-6
