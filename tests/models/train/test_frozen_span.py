"""`frozen_span: ticker`: no part of the GSPO loss trains the call's named symbol (`GSPOExample.name_mask`), in
both frameworks: advantages on the name alone give no gradient, and the name's tokens leave every part's mask
(an advantage on the rest of the note still trains)."""

from __future__ import annotations

import pytest

NOTE = "Trade Recommendation: Buy Meta.\nRationale: The headline matters for Meta because demand is strong."


def _examples(tokenizer, on_name: float, elsewhere: float):
    from outcome_flywheel.daily_rl.reward.credit import call_token_mask
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"]
    name = call_token_mask(tokenizer, ids, NOTE, "ticker")
    assert any(name) and not all(name)
    advantages = [on_name if m else elsewhere for m in name]
    prompt = trading_note_messages("Meta beats estimates", "Revenue rose.")
    return [GSPOExample(prompt, ids, [-1.0] * len(ids), 0.0, advantages, "relevance", name_mask=name)] * 2


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_a_frozen_ticker_takes_no_gradient_and_the_rest_still_trains(tiny_model_dir, framework):
    from transformers import AutoTokenizer

    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    if framework == "mlx":
        pytest.importorskip("mlx.core")
        from outcome_flywheel.models.mlx.backend import MLXBackend

        load = lambda: MLXBackend(tiny_model_dir)  # noqa: E731
    else:
        from outcome_flywheel.models.torch.backend import TorchBackend

        load = lambda: TorchBackend(tiny_model_dir, device="cpu")  # noqa: E731
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    lora = LoraSettings(r=4, alpha=8)

    def trained(frozen, on_name, elsewhere):
        config = GSPOConfig(batch_size=2, epochs=1, learning_rate=1e-3, lora=lora, frozen_span=frozen)
        return train_gspo(load(), _examples(tokenizer, on_name, elsewhere), config)

    assert trained(None, 1.0, 0.0).grad_norms[0] > 0  # the name's advantage trains it
    # frozen: nothing else carries an advantage, and the default KL anchor on the (frozen) names is off: no gradient
    frozen = trained("ticker", 1.0, 0.0)
    assert frozen.grad_norms == [0.0] and "frozen" in frozen.extra["kl_reference"]
    assert trained("ticker", 1.0, 1.0).grad_norms[0] > 0  # the other tokens still train


def test_frozen_span_is_checked():
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    with pytest.raises(ValueError, match="frozen_span must be one of"):
        GSPOConfig(frozen_span="side")
