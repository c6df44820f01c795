"""The static-cache sampler (`models/torch/graph_sampler.py`) against the eager sampler: the same
tokens and pi_old for the same seeds, on every sampling rule, with LoRA, on Llama and Qwen3
blocks; the device-side top-p threshold against the host rule; buckets and cache reuse.

On CPU the static step runs without graphs; on CUDA (when present) the same cases run through
captured graphs. Models are built here (`qwen3_shapes`), so the file needs no conftest fixture.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outcome_flywheel.models.interface import LoraSettings, SamplingConfig
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.provision.qwen3_shapes import build_model, qwen3_tokenizer
from outcome_flywheel.models.sampling import keep_thresholds, logprob_tolerance
from outcome_flywheel.models.torch.fused_decode import device_keep_thresholds
from outcome_flywheel.models.torch.graph_sampler import batch_bucket, length_bucket
from outcome_flywheel.models.torch.static_cache import unsupported_reason
from outcome_flywheel.models.train.gspo import train_gspo
from tests.tolerances import logprob_tolerances, worst_ratio

PROMPTS = [
    trading_note_messages("Chevron beats estimates", "Output hit a record."),
    trading_note_messages("Chip stocks fall on export curbs", ""),
    trading_note_messages("Apple cuts outlook", "Shares slide after hours as iPhone demand cools in China."),
]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
RULES = {
    "top-k+top-p": SamplingConfig(temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=40),
    "full-vocabulary": SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=40),
    "nucleus-only": SamplingConfig(temperature=0.7, top_p=0.5, top_k=0, max_new_tokens=40),
    "greedy": SamplingConfig(temperature=0.0, max_new_tokens=40),
    "no-stop": SamplingConfig(temperature=0.8, max_new_tokens=40, ignore_eos=True),
}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("static") / "qwen3", "qwen3-tiny", seed=3)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A small Llama block (SmolLM2's architecture: no q/k norms, tied embeddings) over the fixture tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("static") / "llama"
    tokenizer = qwen3_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(4)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _backends(model_dir, device, lora: bool = False, **static):
    """The eager sampler and the static one (`static`: its settings, e.g. `fuse_decode`)."""
    from outcome_flywheel.models.torch.backend import TorchBackend

    pair = [
        TorchBackend(model_dir, device=device, dtype="float32", static_decode=flag, **(static if flag else {}))
        for flag in (False, True)
    ]
    if lora:
        for backend in pair:
            torch.manual_seed(
                7
            )  # the same adapter in both: A is drawn at random, B made non-zero (PEFT starts it at zero)
            backend.add_lora(LoraSettings(r=4, alpha=8))
            with torch.no_grad():
                for name, p in backend.model.named_parameters():
                    if "lora_B" in name:
                        p.copy_(torch.randn_like(p) * 0.2)
    return pair


def _assert_same(eager_groups, static_groups, backend, config) -> None:
    """The same tokens, and pi_old per token within the rounding bound of two fp32 computations
    (eager and static decode steps; tests/tolerances.py, at `backend`'s logits; was a flat 1e-4)."""
    for eager, static in zip(eager_groups, static_groups):
        for a, b in zip(eager, static):
            assert a.token_ids == b.token_ids
            assert a.finished == b.finished
    prompts = [PROMPTS[i] for i, group in enumerate(eager_groups) for _ in group]
    ids = [s.token_ids for group in eager_groups for s in group]
    bounds = logprob_tolerances(backend, prompts, ids, temperature=config.temperature or 1.0)
    got = [np.asarray(s.logprobs) for group in static_groups for s in group]
    assert worst_ratio(got, [np.asarray(s.logprobs) for group in eager_groups for s in group], bounds) <= 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule", list(RULES))
def test_static_sampler_writes_the_eager_samplers_tokens_in_fp32(qwen3_dir, device, rule):
    eager, static = _backends(qwen3_dir, device)
    config = RULES[rule]
    _assert_same(
        eager.sample(PROMPTS, 4, config, seeds=[1, 2, 3]),
        static.sample(PROMPTS, 4, config, seeds=[1, 2, 3]),
        eager,
        config,
    )
    assert static.graph_sampler.stats.calls == 1 and eager.graph_sampler is None


@pytest.mark.parametrize("device", DEVICES)
def test_static_sampler_matches_on_llama_blocks_and_under_lora(qwen3_dir, llama_dir, device):
    config = RULES["top-k+top-p"]
    for model_dir, lora in ((llama_dir, False), (qwen3_dir, True)):
        eager, static = _backends(model_dir, device, lora=lora)
        _assert_same(
            eager.sample(PROMPTS, 3, config, seeds=[4, 5, 6]),
            static.sample(PROMPTS, 3, config, seeds=[4, 5, 6]),
            eager,
            config,
        )
        assert static.graph_sampler.stats.calls == 1


@pytest.mark.parametrize("device", DEVICES)
def test_static_sampler_sees_weights_trained_in_place_and_a_new_adapter(qwen3_dir, device):
    """Graphs read parameters where they live: an in-place update shows at once; a new adapter
    (new parameter tensors) rebuilds them."""
    eager, static = _backends(qwen3_dir, device)
    config = RULES["top-k+top-p"]
    static.sample(PROMPTS, 2, config, seeds=[1, 2, 3])
    for backend in (eager, static):
        with torch.no_grad():
            for p in backend.model.parameters():
                p.mul_(1.05)
    _assert_same(
        eager.sample(PROMPTS, 2, config, seeds=[1, 2, 3]),
        static.sample(PROMPTS, 2, config, seeds=[1, 2, 3]),
        eager,
        config,
    )
    eager, static = _backends(qwen3_dir, device, lora=True)  # fresh adapters in both
    _assert_same(
        eager.sample(PROMPTS, 2, config, seeds=[1, 2, 3]),
        static.sample(PROMPTS, 2, config, seeds=[1, 2, 3]),
        eager,
        config,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_static_sampler_pi_old_equals_teacher_forcing_and_never_thinks(qwen3_dir, device):
    """The sampler's pinned behaviour on the static path: pi_old at T is what teacher forcing at T
    gives, and a model that wants to think never writes a think token when thinking is off."""
    _, static = _backends(qwen3_dir, device)
    config = SamplingConfig(temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=48)
    samples = [s for g in static.sample(PROMPTS, 4, config, seeds=[1, 2, 3]) for s in g]
    forced = static.response_logprobs(
        [PROMPTS[i // 4] for i in range(len(samples))], [s.token_ids for s in samples], temperature=0.8
    )
    gaps = [float(np.mean(np.abs(np.asarray(s.logprobs) - f))) for s, f in zip(samples, forced) if len(f)]
    assert max(gaps) <= logprob_tolerance(torch.float32)

    # A model that wants to think: <think> boosted at every position by a hook on the head (the
    # hook runs inside the captured step too; its tensors are made on the device beforehand).
    think = torch.tensor([static.tokenizer.convert_tokens_to_ids("<think>")], device=device)
    boost = torch.tensor([40.0], device=device)
    hook = static._causal_lm().lm_head.register_forward_hook(
        lambda module, inputs, out: out.index_add(-1, think, boost.expand(*out.shape[:-1], 1))
    )
    try:
        allowed = static.sample(
            PROMPTS[:1], 4, SamplingConfig(temperature=0.8, max_new_tokens=40, enable_thinking=True), seeds=[1]
        )[0]
        notes = [
            s
            for g in static.sample(PROMPTS, 2, SamplingConfig(temperature=0.8, max_new_tokens=40), seeds=[1, 2, 3])
            for s in g
        ]
    finally:
        hook.remove()
    assert all(set(s.token_ids) & static.think_ids for s in allowed)  # the control: allowed, it thinks
    assert not any(set(s.token_ids) & static.think_ids for s in notes)
    assert static.graph_sampler.stats.calls == 3


@pytest.mark.parametrize("top_p", [0.0, 0.3, 0.9, 0.95, 1.0])
def test_device_thresholds_equal_the_host_rule_with_ties(top_p):
    rng = np.random.default_rng(0)
    logits = np.round(rng.normal(size=(16, 400)) * 3, 1).astype(np.float32)  # rounded: many ties, as bf16 logits have
    logits[3, :] = 1.0  # a whole row tied
    for k in (1, 5, 50, 400):
        top = torch.topk(torch.from_numpy(logits), k, dim=-1).values
        assert np.array_equal(device_keep_thresholds(top, top_p).numpy(), keep_thresholds(top.numpy(), top_p))


def test_buckets_and_the_cache_is_reused_then_grown(qwen3_dir):
    assert [batch_bucket(r) for r in (1, 2, 3, 5, 16, 17, 33, 240, 256, 257)] == [1, 2, 4, 8, 16, 32, 48, 240, 256, 272]
    assert [length_bucket(n) for n in (1, 128, 129, 717)] == [128, 128, 256, 768]
    _, static = _backends(qwen3_dir, "cpu")
    config = RULES["top-k+top-p"]
    static.sample(PROMPTS, 4, config, seeds=[1, 2, 3])
    static.sample(PROMPTS[:2], 2, config, seeds=[1, 2])
    assert static.graph_sampler.stats.allocations == 1  # a smaller call fits the cache it has
    static.sample(PROMPTS, 8, config, seeds=[1, 2, 3])
    assert static.graph_sampler.stats.allocations == 2 and static.graph_sampler._cache.batch >= 24


def test_models_the_static_step_cannot_run_keep_the_eager_sampler():
    from transformers import GPT2Config, MistralConfig, Qwen3Config

    class Holder(torch.nn.Module):
        def __init__(self, config, norm=None):
            super().__init__()
            self.config, self.norm = config, norm

    assert "not one of" in unsupported_reason(Holder(GPT2Config()))
    assert unsupported_reason(Holder(MistralConfig(sliding_window=64))) == "sliding-window attention"
    assert unsupported_reason(Holder(Qwen3Config())) == ""
    # the step's fused pieces are SiLU's gate and transformers' RMSNorm
    assert "MLP activation 'gelu'" in unsupported_reason(Holder(Qwen3Config(hidden_act="gelu")))
    assert "RMSNorm" in unsupported_reason(Holder(Qwen3Config(), norm=torch.nn.LayerNorm(8)))


def test_training_frees_the_static_cache_and_the_trained_policy_samples_as_the_eager_one(qwen3_dir):
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    eager, static = _backends(qwen3_dir, "cpu")
    config = RULES["top-k+top-p"]
    groups = static.sample(PROMPTS[:2], 4, config, seeds=[1, 2])
    examples = [
        GSPOExample(PROMPTS[i], s.token_ids, s.logprobs, float(k - 1.5))
        for i, g in enumerate(groups)
        for k, s in enumerate(g)
    ]
    for backend in (eager, static):
        torch.manual_seed(11)  # the same LoRA initialisation in both
        train_gspo(
            backend,
            examples,
            GSPOConfig(temperature=0.8, learning_rate=1e-2, batch_size=4, lora=LoraSettings(r=4, alpha=8)),
        )
    assert static._graph_sampler is None  # released for training
    _assert_same(
        eager.sample(PROMPTS, 2, config, seeds=[1, 2, 3]),
        static.sample(PROMPTS, 2, config, seeds=[1, 2, 3]),
        eager,
        config,
    )
    assert static.graph_sampler.stats.calls == 1
