"""FLYWHEEL_SAMPLER=vllm where it cannot run (no CUDA, no vllm): a clear "needs CUDA" error; and the
parts of the vLLM path that need no GPU: the request parameters (one seeded request per sample,
think tokens banned), reading vLLM's outputs, when pi_old must be teacher-forced, and which files
hold the policy's weights. Against vLLM itself: tests/models/test_cuda.py (CUDA + the vllm extra)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from outcome_flywheel.models.interface import LoraSettings, SamplingConfig
from outcome_flywheel.models.loader import ModelLoader, load_backend
from outcome_flywheel.models.sampling import row_seed
from outcome_flywheel.models.torch import vllm_sampling as vs
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.settings import settings_problems


def test_vllm_sampler_without_cuda_or_vllm_says_what_it_needs(tiny_model_dir):
    if not vs.vllm_unavailable_reason():
        pytest.skip("vLLM can run here")
    with pytest.raises(RuntimeError, match="FLYWHEEL_SAMPLER=vllm (needs CUDA|vllm is not installed)"):
        load_backend("torch", tiny_model_dir, device="cpu", sampler="vllm")
    with pytest.raises(ValueError, match="needs FLYWHEEL_BACKEND=torch"):
        load_backend("mlx", tiny_model_dir, sampler="vllm")
    with pytest.raises(ValueError, match="FLYWHEEL_SAMPLER must be one of"):
        load_backend("torch", tiny_model_dir, device="cpu", sampler="sglang")


def test_sampler_setting_is_validated():
    assert settings_problems({"FLYWHEEL_SAMPLER": "vllm"}) == []
    assert any("FLYWHEEL_SAMPLER" in p for p in settings_problems({"FLYWHEEL_SAMPLER": "fast"}))
    assert ModelLoader().sampler == "torch"


def test_one_seeded_request_per_sample_with_the_loops_settings():
    rows = vs.sample_rows(2, 3, seeds=[11, 12])
    assert [(i, j) for i, j, _ in rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [s for _, _, s in rows] == [
        row_seed(11, 0),
        row_seed(11, 1),
        row_seed(11, 2),
        row_seed(12, 0),
        row_seed(12, 1),
        row_seed(12, 2),
    ]
    assert len({s for _, _, s in rows}) == 6  # no two samples share a stream (vLLM's own n>1 would use seed+i)

    params = vs.request_params(
        SamplingConfig(temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=96), 7, ["<think>", "</think>"]
    )
    assert params == dict(
        n=1,
        seed=7,
        max_tokens=96,
        ignore_eos=False,
        logprobs=0,
        temperature=0.8,
        top_k=50,
        top_p=0.95,
        skip_special_tokens=True,
        bad_words=["<think>", "</think>"],
    )
    unfiltered = vs.request_params(
        SamplingConfig(temperature=0.3, top_p=1.0, top_k=0, max_new_tokens=8, ignore_eos=True), 1
    )
    assert (
        unfiltered["top_k"] == -1
        and unfiltered["top_p"] == 1.0
        and unfiltered["ignore_eos"]
        and "bad_words" not in unfiltered
    )
    assert vs.request_params(SamplingConfig(temperature=0.0), 0)["temperature"] == 0.0


def test_pi_old_is_teacher_forced_exactly_when_vllm_renormalises():
    # vLLM's processed log-probs come after top-k / top-p: renormalised over the kept tokens
    assert vs.needs_teacher_forcing(SamplingConfig(temperature=0.8, top_k=50, top_p=0.95))
    assert vs.needs_teacher_forcing(SamplingConfig(temperature=0.8, top_k=0, top_p=0.9))
    assert not vs.needs_teacher_forcing(SamplingConfig(temperature=0.8, top_k=0, top_p=1.0))  # the judge's setting
    assert not vs.needs_teacher_forcing(SamplingConfig(temperature=0.0, top_k=50, top_p=0.95))  # greedy


def _completion(ids, logps):
    return SimpleNamespace(token_ids=ids, logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logps)])


def test_vllm_outputs_become_token_ids_and_logprobs():
    assert vs.completion_fields(_completion([5, 9, 2], [-0.5, -1.25, -0.01])) == ([5, 9, 2], [-0.5, -1.25, -0.01])
    broken = SimpleNamespace(token_ids=[5, 9], logprobs=[{5: SimpleNamespace(logprob=-0.5)}])
    with pytest.raises(RuntimeError, match="1 log-probs for 2 tokens"):
        vs.completion_fields(broken)
    assert vs.adapter_id("/tmp/a") == vs.adapter_id("/tmp/a") > 0 and vs.adapter_id("/tmp/a") != vs.adapter_id("/tmp/b")


def test_the_files_holding_the_policy_are_tracked(tiny_model_dir, tmp_path):
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    policy = TorchBackend(tiny_model_dir, device="cpu")
    assert policy.weights_on_disk == (tiny_model_dir, None)
    policy.add_lora(LoraSettings())
    assert policy.weights_on_disk is None  # a fresh adapter exists only in memory
    policy.weights_saved_as(tmp_path / "2025-11-04")
    assert policy.weights_on_disk == (tiny_model_dir, tmp_path / "2025-11-04")
    prompt = [{"role": "user", "content": "Oil rises"}]
    sample = policy.sample([prompt], 2, SamplingConfig(max_new_tokens=6), seeds=[0])[0]
    torch.manual_seed(0)
    train_gspo(
        policy,
        [GSPOExample(prompt, s.token_ids, s.logprobs, a) for s, a in zip(sample, (1.0, -1.0))],
        GSPOConfig(temperature=0.8),
    )
    assert policy.weights_on_disk is None  # trained in memory: vLLM cannot serve it, the project's sampler does
