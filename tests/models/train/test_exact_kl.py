"""`kl_estimator: exact` (with `kl_span: ticker`): KL(pi_theta || base) summed over the whole vocabulary at the call's
name positions, in both frameworks. The differentiable `position_kl` gives the evaluation's `token_kl` at the
covered positions; trained on that term alone it pulls the names' distribution back to the base's; with no name
covered it trains nothing; and the settings are checked."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.train.test_frozen_span import NOTE

HEADLINE = "Meta beats estimates"


def _backend(tiny_model_dir, framework: str):
    """tiny-local with a LoRA adapter moved away from the base (its B drawn at random, all of it seeded): a policy
    whose KL to the base is well above zero at every position."""
    from outcome_flywheel.models.interface import LoraSettings

    if framework == "mlx":
        pytest.importorskip("mlx.core")
        import mlx.core as mx

        from outcome_flywheel.models.mlx.backend import MLXBackend

        backend = MLXBackend(tiny_model_dir)
        backend.framework.seed(0)  # the adapter's A
        backend.add_lora(LoraSettings(r=4, alpha=8))
        for _, module in backend.lora_modules():
            module.lora_b = mx.random.normal(module.lora_b.shape) * 0.5
    else:
        import torch

        from outcome_flywheel.models.torch.backend import TorchBackend

        backend = TorchBackend(tiny_model_dir, device="cpu")
        backend.framework.seed(0)  # the adapter's A
        backend.add_lora(LoraSettings(r=4, alpha=8))
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, weight in backend.model.named_parameters():
                if "lora_B" in name:
                    weight.copy_(torch.randn(weight.shape, generator=generator) * 0.5)
    return backend


def _examples(backend, named: bool):
    from transformers import AutoTokenizer

    from outcome_flywheel.daily_rl.reward.credit import call_token_mask
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    tokenizer = AutoTokenizer.from_pretrained(backend.model_path)
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"]
    name = call_token_mask(tokenizer, ids, NOTE, "ticker")
    assert any(name) and not all(name)
    prompt = trading_note_messages(HEADLINE, "Revenue rose.")
    # no advantage anywhere: the KL term is the whole loss
    mask = name if named else [False] * len(ids)
    return [GSPOExample(prompt, ids, [-1.0] * len(ids), 0.0, [0.0] * len(ids), "relevance", name_mask=mask)] * 2


def _name_kl(backend, example) -> np.ndarray:
    """The evaluation's exact KL to the base (no gradient) at the example's name positions."""
    per_token = backend.token_kl([example.prompt], [example.response_ids])[0]
    return per_token[np.array(example.name_mask, dtype=bool)]


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_position_kl_is_the_evaluations_kl_at_the_covered_positions(tiny_model_dir, framework):
    backend = _backend(tiny_model_dir, framework)
    example = _examples(backend, named=True)[0]
    covered = np.array(example.name_mask, dtype=bool)
    kl = backend.framework.to_numpy(
        backend.position_kl([backend.prompt_ids(example.prompt)], [example.response_ids], covered, 1.0)
    )
    expected = _name_kl(backend, example)
    assert kl.shape == (int(covered.sum()),) and (expected > 1e-3).all()  # the moved adapter: a KL to see
    # Both are float32 sums over the vocabulary of p (log p - log q) from the same hidden states; they differ only
    # in how many rows the head's matmul takes at once, a few float32 ulps of each logit, so a relative bound of
    # 1e-4 (~1000 ulps) leaves room for any kernel's reduction order and would catch a wrong position or model.
    np.testing.assert_allclose(kl, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_the_exact_anchor_pulls_the_names_back_to_the_base_and_covers_nothing_else(
    tiny_model_dir, framework, monkeypatch
):
    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig
    from outcome_flywheel.models.train.memory import MEMORY_VARIABLE

    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)  # each step one part
    forwards = []  # the anchor's own forwards (`response_hidden`) during the training

    def trained(named: bool, estimator: str, beta: float = 1.0):
        backend = _backend(tiny_model_dir, framework)
        examples = _examples(backend, named)
        before = _name_kl(backend, _examples(backend, True)[0])
        config = GSPOConfig(
            batch_size=2,
            epochs=8,
            learning_rate=1e-3,
            lora=LoraSettings(r=4, alpha=8),
            kl_beta=beta,
            kl_span="ticker",
            kl_estimator=estimator,
        )
        own_forward = type(backend).response_hidden
        monkeypatch.setattr(
            type(backend), "response_hidden", lambda self, *a: forwards.append(1) or own_forward(self, *a)
        )
        stats = train_gspo(backend, examples, config)
        monkeypatch.setattr(type(backend), "response_hidden", own_forward)
        return before, _name_kl(backend, examples[0] if named else _examples(backend, True)[0]), stats

    before, after, stats = trained(True, "exact")
    assert stats.extra["kl_reference"] == "base (adapter off); on the call's ticker only; exact over the vocabulary"
    assert len(forwards) == stats.steps == 8  # the base's, one a step: the policy's side is the step's own forward
    assert stats.extra["kl"][0] == pytest.approx(float(before.mean()), rel=1e-4)  # the first step's is the start's
    assert after.sum() < 0.5 * before.sum(), (before, after)  # eight steps of the term alone halve it at least
    _, untouched, stats = trained(False, "exact")  # no name covered: no loss, no gradient, the adapter unmoved
    assert stats.grad_norms == [0.0] * stats.steps and stats.extra["kl"] == [0.0] * stats.steps
    np.testing.assert_array_equal(untouched, before)


def test_the_exact_estimator_is_checked():
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    with pytest.raises(ValueError, match="kl_estimator 'exact' takes kl_span 'ticker'.*set kl_estimator 'k3'"):
        GSPOConfig(kl_span="note")
    with pytest.raises(ValueError, match="kl_estimator must be one of k3, exact"):
        GSPOConfig(kl_span="ticker", kl_estimator="k2")


@pytest.mark.parametrize("framework, shared_prefix", [("torch", False), ("torch", True), ("mlx", False)])
def test_the_anchor_on_the_steps_own_forward_is_the_anchor_on_a_forward_of_its_own(
    tiny_model_dir, framework, shared_prefix
):
    """The trainer hands the anchor the hidden states of the step's forward over the whole batch; on a batch of
    an unnamed, shorter note between two named ones under different prompts, the term and its gradient are those
    of a forward of the named notes alone."""
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.batching import EncodedExample
    from outcome_flywheel.models.train.exact_kl import exact_kl_term

    backend = _backend(tiny_model_dir, framework)
    fw = backend.framework
    example = _examples(backend, named=True)[0]
    other = backend.prompt_ids(trading_note_messages("Boeing recalls products", ""))

    def encoded(prompt_ids, ids, name_mask):
        return EncodedExample(prompt_ids, ids, [-1.0] * len(ids), 0.0, name_mask=name_mask)

    ids, name = example.response_ids, example.name_mask
    batch = [
        encoded(backend.prompt_ids(example.prompt), ids, name),
        encoded(other, ids[:5], None),
        encoded(other, ids, name),
    ]

    def term(shared: bool):
        def loss(model, part):
            hidden = None
            if shared:
                prompts, responses = [b.prompt_ids for b in part], [b.response_ids for b in part]
                hidden = backend.batch_logprobs_hidden(prompts, responses, 1.0, shared_prefix=shared_prefix)[2]
            return exact_kl_term(backend, part, 1.0, 1.0, 10.0, policy_hidden=hidden)

        return loss

    own, shared = (float(fw.to_numpy(term(s)(backend.model, batch)[0])) for s in (False, True))
    assert own > 1e-3  # the moved adapter: a term to see
    # The same float32 function of the same weights, the hidden states from batches of other shapes (and, with
    # shared prefixes, a cached prompt): rounding moves it by ulps; a wrong row or position moves it by its size.
    assert shared == pytest.approx(own, rel=1e-4)

    def difference(model, part):
        (a, _), (b, _) = term(True)(model, part), term(False)(model, part)
        return a - b, {}

    # the gradient of the difference against the gradient itself: rounding gives ~1e-5, a wrong path order 1
    assert fw.gradient_norm(backend.model, difference, batch) < 1e-3 * fw.gradient_norm(
        backend.model, term(False), batch
    )
